"""`kvreplay watch --metrics URL`: vLLM's own `/metrics` read beside the log, so the
preemptions the server counted are shown next to the ones the log's lines named.

vLLM counts a preemption in `vllm:num_preemptions_total` (per engine; summed here); the
log names them only as its lines decide them (Iteration lines: about a step later; stats
lines: per interval). The feed scrapes the endpoint every `every` seconds in a thread of
its own (a slow or dead endpoint never holds up the log), and each scrape after the first
gives one `CounterRow` when the counter or the log's count moved since the last row (and
always at the end): the counter's increase since the last scrape and since the watch
began, and the counter's value beside the preemptions the log's rows name in the same
server run (a log followed from its startup banner counts from the same start as the
counter). Times are this host's clock; the counts are compared as totals, so no clock
offset between the log and this host matters.

A counter that goes down was reset (the server restarted): the increase over that
window is its new value, as audit/prom.py reads counters.
"""

from __future__ import annotations

import queue
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable

import msgspec

from kvreplay.errors import UserError

EVERY_S = 15.0  # vLLM's Grafana dashboards and production stacks scrape every 15 s
TIMEOUT_S = 5.0
MAX_BYTES = 32 << 20  # a /metrics page is tens of KB; more is not a vLLM endpoint


class CounterRow(msgspec.Struct, kw_only=True):
    """One scrape's preemption counter against the log's rows (a `watch` row)."""

    event: str = "counter"
    time: float  # this host's clock at the scrape (epoch seconds)
    window_s: float  # since the previous scrape
    preemptions: int  # the counter's increase over the window (engines summed)
    total: int  # its increase since the watch began
    counter: int  # its value: preemptions since the server started
    named: int  # preemptions the log's rows name in this server run (given minus withdrawn)
    running: int | None = None  # vllm:num_requests_running at the scrape
    waiting: int | None = None
    kv_usage: float | None = None  # vllm:kv_cache_usage_perc, 0-1
    reset: bool = False  # the counter went down over the window: the server restarted
    confidence: str = "exact"  # vLLM's own count


class MetricsNotice(msgspec.Struct, kw_only=True):
    """The endpoint could not be read (said once until it can again), or is read again."""

    event: str = "metrics"
    text: str


def metrics_url(spec: str) -> str:
    """`8000`, `:8000`, `host:8000`, or an http(s) URL; the path defaults to /metrics."""
    s = spec.strip()
    if s.isdigit():
        s = f"127.0.0.1:{s}"
    elif s.startswith(":") and s[1:].isdigit():
        s = "127.0.0.1" + s
    if "://" not in s:
        s = "http://" + s
    u = urllib.parse.urlsplit(s)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise UserError(f"--metrics {spec!r}: give the server's /metrics as PORT, HOST:PORT "
                        "or an http(s) URL")
    try:
        u.port
    except ValueError:
        raise UserError(f"--metrics {spec!r}: not a port number") from None
    return urllib.parse.urlunsplit((u.scheme, u.netloc, u.path or "/metrics", u.query, ""))


def _fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:  # noqa: S310 (http(s) only)
        body = resp.read(MAX_BYTES + 1)
    if len(body) > MAX_BYTES:
        raise ValueError(f"more than {MAX_BYTES >> 20} MiB")
    return body.decode("utf-8", "replace")


class MetricsFeed:
    """Scrapes `url` every `every` s in a daemon thread; `take(named)` returns the rows of
    the scrapes done since the last call. `fetch` and `now` are for tests."""

    def __init__(self, url: str, every: float = EVERY_S, *,
                 fetch: Callable[[str], str] = _fetch,
                 now: Callable[[], float] = time.time) -> None:
        self.url, self.every, self._fetch, self._now = url, every, fetch, now
        self._q: queue.Queue[tuple[float, object]] = queue.Queue()
        self._stop = threading.Event()
        self._last: tuple[float, float] | None = None  # (time, counter) of the last scrape
        self._total = 0.0
        self._failing: str | None = None
        self._shown: tuple[int, int] | None = None  # (counter, named) of the last row given
        self._thread = threading.Thread(target=self._loop, name="kvreplay-metrics", daemon=True)

    def start(self) -> "MetricsFeed":
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.scrape_now()
            self._stop.wait(self.every)

    def scrape_now(self) -> None:
        """One scrape, its page (or why it could not be read) queued for `take`; also called
        in the caller's thread for the last one at the end of a watch."""
        t = self._now()
        try:
            self._q.put((t, self._fetch(self.url)))
        except (OSError, ValueError, urllib.error.URLError) as exc:
            self._q.put((t, exc))

    def take(self, named: int, final: bool = False) -> list[CounterRow | MetricsNotice]:
        """Rows of the scrapes since the last call: a counter row only when the counter or
        `named` moved since the last one given, or when `final`."""
        rows: list[CounterRow | MetricsNotice] = []
        while True:
            try:
                t, got = self._q.get_nowait()
            except queue.Empty:
                break
            rows.extend(self._row(t, got, named))
        out: list[CounterRow | MetricsNotice] = []
        last_counter = max((i for i, r in enumerate(rows) if isinstance(r, CounterRow)), default=-1)
        for i, r in enumerate(rows):
            if isinstance(r, CounterRow):
                key = (r.counter, r.named)
                if key == self._shown and not r.reset and not (final and i == last_counter):
                    continue
                self._shown = key
            out.append(r)
        return out

    def _row(self, t: float, got: object, named: int) -> list[CounterRow | MetricsNotice]:
        from kvreplay.audit.metrics import counter_deltas
        from kvreplay.audit.prom import parse_scrape

        if isinstance(got, BaseException):
            why = str(getattr(got, "reason", None) or got) or type(got).__name__
            if self._failing == why:
                return []
            self._failing = why
            return [MetricsNotice(text=f"{self.url}: cannot read ({why}); trying again every "
                                       f"{self.every:g} s")]
        try:
            sc = parse_scrape(str(got), t, self.url)
        except UserError as exc:
            return self._row(t, ValueError(str(exc).split(": ", 1)[-1][:120]), named)
        counts = [v["preemptions"] for v in sc.values.values() if "preemptions" in v]
        if not counts:
            return self._row(t, ValueError("no vllm:num_preemptions_total: not a vLLM "
                                           "/metrics page"), named)
        out: list[CounterRow | MetricsNotice] = []
        if self._failing is not None:
            self._failing = None
            out.append(MetricsNotice(text=f"{self.url}: read again"))
        value = sum(counts)
        gauge = lambda k: sum(v[k] for v in sc.values.values() if k in v)  # noqa: E731
        has = lambda k: any(k in v for v in sc.values.values())  # noqa: E731
        if self._last is None:
            self._last = (t, value)
            return out
        t0, v0 = self._last
        reset = value < v0
        (inc,) = counter_deltas([v0, value])
        self._total += inc
        self._last = (t, value)
        kv = [v["kv_usage"] for v in sc.values.values() if "kv_usage" in v]
        out.append(CounterRow(
            time=t, window_s=round(t - t0, 3), preemptions=int(round(inc)),
            total=int(round(self._total)), counter=int(round(value)), named=named,
            running=int(gauge("running")) if has("running") else None,
            waiting=int(gauge("waiting")) if has("waiting") else None,
            kv_usage=round(max(kv), 4) if kv else None, reset=reset))
        return out


def counter_text(r: CounterRow) -> str:
    """A counter row as one line of `watch`'s table."""
    clock = time.strftime("%H:%M:%S", time.localtime(r.time))
    gauges = []
    if r.running is not None:
        gauges.append(f"running {r.running}")
    if r.waiting is not None:
        gauges.append(f"waiting {r.waiting}")
    if r.kv_usage is not None:
        gauges.append(f"KV {100 * r.kv_usage:.1f}%")
    reset = " (counter reset: the server restarted)" if r.reset else ""
    return (f"  counter {clock}  vllm:num_preemptions_total +{r.preemptions} in "
            f"{r.window_s:g} s{reset}: {r.counter} since the server started, the log's rows "
            f"name {r.named}" + (f"  [{', '.join(gauges)}]" if gauges else ""))
