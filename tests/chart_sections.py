"""The run page's chart sections as a browser reads them, for tests that check which chart shows which key."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from typing import Any


class ChartSections(HTMLParser):
    """The page's chart sections and figures as a browser reads them: attributes unescaped, each figure in the
    section that holds it, with its title as shown."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.sections: list[dict[str, Any]] = []
        self.in_title = False
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {name: value or "" for name, value in attrs}
        if tag == "details" and "chart-section" in a.get("class", "").split():
            self.sections.append({"name": a["data-section"], "id": a["data-section-id"], "figures": []})
        elif tag == "figure" and "data-chart" in a:
            figure = {"id": a["id"].removesuffix("-box"), "section": a["data-section"], "title": "",
                      "keys": json.loads(a["data-keys"]), "chart": json.loads(a["data-chart"])}  # fmt: skip
            self.sections[-1]["figures"].append(figure)
        self.in_title = tag == "h4" and bool(self.sections)

    def handle_endtag(self, tag: str) -> None:
        self.in_title = self.in_title and tag != "h4"

    def handle_data(self, data: str) -> None:
        if self.in_title:
            self.sections[-1]["figures"][-1]["title"] += data

    def figures(self) -> list[dict[str, Any]]:
        return [figure for section in self.sections for figure in section["figures"]]
