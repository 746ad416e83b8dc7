"""uvicorn's access log without the trainers' accepted batches: rank 0 of every run posts one a second and every
other rank one every two, so their lines buried the requests a person made. /metrics counts them instead
(`rankboard_ingest_batches_total`, with RANKBOARD_PROMETHEUS); a batch refused, for any reason, is still logged."""

from __future__ import annotations

import copy
import logging
import re
from typing import Any

from rankboard import wire

INGEST = re.compile(re.escape(wire.INGEST_PATH).replace(re.escape("{run_id}"), r"[^/?]+"))


class QuietIngest(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        """False for the line of an accepted batch; uvicorn's args: client, method, path, HTTP version, status."""
        args = record.args
        if not (isinstance(args, tuple) and len(args) == 5):
            return True
        _client, method, path, _version, status = args
        return not (method == "POST" and isinstance(status, int) and status < 300 and INGEST.fullmatch(str(path)))


def log_config() -> dict[str, Any]:
    """uvicorn's own logging configuration, with QuietIngest on the access log."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["quiet_ingest"] = {"()": QuietIngest}
    config["loggers"]["uvicorn.access"]["filters"] = ["quiet_ingest"]
    return config
