// The run page's stream of new points, for the charts it has built only: a page of 200 charts follows the few in
// view, and hears of every other key by name (`others`: a key the layout lacks, or news for a chart built later).
// When the set of built charts changes, the stream is opened again from the last point id it got, so nothing is
// sent twice and nothing is skipped: points of a key not yet followed were named in `others`, and the chart that
// was built meanwhile reads them again (`onOthers`).
const REOPEN_AFTER_MS = 500;  // charts are built in bursts as the page scrolls: one reopening per burst

export class PointStream {
  /** `url` is the page's points stream (with its starting `after`); `onMessage({series, others, missed})`. */
  constructor(url, onMessage) {
    this.base = new URL(url, location.href);
    this.after = this.base.searchParams.get("after") || "0";
    this.onMessage = onMessage;
    this.keys = [];
    this.source = null;
    this.timer = null;
    this.ended = false;
  }

  /** Follows these keys from now on (opened again, soon, only if they changed). */
  watch(keys) {
    const sorted = Array.from(new Set(keys)).sort();
    if (this.source && sorted.join("\n") === this.keys.join("\n")) return;
    this.keys = sorted;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.open(), this.source ? REOPEN_AFTER_MS : 0);
  }

  open() {
    if (this.ended) return;
    if (this.source) this.source.close();
    const url = new URL(this.base);
    url.searchParams.set("after", this.after);
    url.searchParams.delete("watch");
    this.keys.forEach((key) => url.searchParams.append("watch", key));
    if (!this.keys.length) url.searchParams.append("watch", "");  // none built yet: every key by name only
    this.source = new EventSource(url);
    this.source.addEventListener("points", (event) => {
      if (event.lastEventId) this.after = event.lastEventId;
      this.onMessage(JSON.parse(event.data));
    });
    this.source.addEventListener("end", () => { this.ended = true; this.source.close(); });
  }
}
