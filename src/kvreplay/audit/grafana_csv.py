"""Grafana's "Download CSV" of a panel's series (Inspect > Data), read as scrapes.

What Grafana writes (its data-frame CSV, 7.0+): an optional Excel line `sep=,`; a header
of quoted field names, the time field first and one column per series, named as Grafana
displays a Prometheus series, `vllm:num_preemptions_total{engine="0", model_name="..."}`
(quotes doubled inside the CSV quotes); then one row per time stamp. The delimiter is the
browser locale's list separator (`,` or `;`), rows end in CRLF. The time is epoch
milliseconds, or with "Formatted data" a date in the dashboard's time zone
(`2026-05-07 10:01:00`, read as UTC: the join with a log takes a time zone's whole
quarter hours, audit/join.py), or ISO 8601. Without "Series joined by time" each series
is a frame of its own: a header again before its rows. Grafana before 7.0 wrote
`Series;Time;Value` rows, or `Time;<series>;<series>` columns with ISO times: read too.

A column whose name is not a vLLM series (a legend such as "Preemptions", or a PromQL
expression like `rate(...)`) cannot be told apart from another and is refused with the
way to export it by name. Each (time, instance) becomes one Scrape, through the same
taker as scrape text and query_range JSON (audit/prom.py), so a CSV of the series gives
the same record as the scrapes it was exported from.
"""

from __future__ import annotations

import csv
import io
import re
from datetime import datetime, timezone
from typing import Any

from kvreplay.errors import UserError

_SERIES = re.compile(r'^\s*(?P<name>[A-Za-z_:][\w:]*)?\s*(?:\{(?P<labels>.*)\})?\s*$')
_LABEL = re.compile(r'([A-Za-z_]\w*)\s*=\s*"((?:[^"\\]|\\.)*)"')
_TIME_NAMES = {"time", "timestamp", "date", "time (utc)"}
DELIMITERS = (",", ";", "\t")


def looks_like_grafana_csv(head: str) -> bool:
    """The first line (after `sep=`) is a header with a time column and a vLLM series, or
    Grafana's old `Series;Time;Value`."""
    lines = [x for x in head.splitlines() if x.strip()]
    if lines and lines[0].lower().startswith("sep="):
        lines = lines[1:]
    if not lines:
        return False
    first = lines[0]
    cells = _split(first, _delimiter(first))
    names = [c.strip().lower() for c in cells]
    if names[:3] == ["series", "time", "value"]:
        return True
    return bool(names) and names[0] in _TIME_NAMES and any("vllm:" in c for c in cells[1:])


def _delimiter(header: str) -> str:
    counts = {d: len(_split(header, d)) for d in DELIMITERS}
    return max(DELIMITERS, key=lambda d: (counts[d], -DELIMITERS.index(d)))


def _split(line: str, delim: str) -> list[str]:
    return next(csv.reader([line], delimiter=delim, quotechar='"'), [])


def series_of(name: str) -> tuple[str, dict[str, str]] | None:
    """`vllm:x_total{engine="0", le="+Inf"}` -> ("vllm:x_total", {...}); a Grafana display
    name of `{__name__="vllm:x", ...}` too. None: not a vLLM series name."""
    m = _SERIES.match(name)
    if not m:
        return None
    labels = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in
              _LABEL.findall(m.group("labels") or "")}
    metric = m.group("name") or labels.pop("__name__", None)
    if not metric or not metric.startswith("vllm:"):
        return None
    labels.pop("__name__", None)
    return metric, labels


def parse_time(text: str, where: str) -> float:
    s = text.strip()
    try:
        v = float(s)
    except ValueError:
        pass
    else:
        return v / 1000.0 if v > 1e11 else v  # epoch ms (Grafana's raw time), else seconds
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise UserError(f"{where}: time {text!r} is neither epoch (ms or s) nor a date "
                        "(2026-05-07 10:01:00 or ISO 8601)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)  # Grafana's dashboard zone: read as UTC
    return dt.timestamp()


def parse_value(text: str, where: str) -> float | None:
    """A cell's number; None for an empty cell (no sample then). "Formatted data" may add
    a percent sign (a 0-1 gauge shown as percent): divided back."""
    s = text.strip()
    if s == "" or s.lower() in ("null", "nan", "undefined", "-"):
        return None
    scale = 1.0
    if s.endswith("%"):
        s, scale = s[:-1].strip(), 0.01
    try:
        return float(s) * scale
    except ValueError:
        raise UserError(f"{where}: value {text!r} is not a number (download the CSV with "
                        "'Formatted data' off)") from None


def parse_grafana_csv(text: str, where: str) -> list[Any]:
    """The CSV's samples as Scrapes (audit.prom.Scrape), one per (instance, time), in
    time order."""
    from kvreplay.audit.prom import _TAKER, Scrape

    lines = text.splitlines()
    start = 0
    delim = None
    while start < len(lines) and not lines[start].strip():
        start += 1
    if start < len(lines) and lines[start].lower().startswith("sep="):
        delim = lines[start][4:5] or None
        start += 1
    if start >= len(lines):
        raise UserError(f"{where}: an empty CSV")
    delim = delim or _delimiter(lines[start])
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:])), delimiter=delim, quotechar='"'))
    by_key: dict[tuple[str, float], Any] = {}
    cols: list[tuple[str, dict[str, str]] | None] = []
    legacy = False
    unnamed: list[str] = []
    data_rows = 0

    def put(series: tuple[str, dict[str, str]], t: float, v: float) -> None:
        name, labels = series
        inst = labels.get("instance", "")
        sc = by_key.get((inst, t))
        if sc is None:
            sc = by_key[(inst, t)] = Scrape(time=t, instance=inst or None)
        _TAKER.take(sc, name, labels, v)

    for n, row in enumerate(rows, start + 1):
        if not any(c.strip() for c in row):
            continue
        low = [c.strip().lower() for c in row]
        if low[:3] == ["series", "time", "value"]:
            legacy = True
            continue
        if low and low[0] in _TIME_NAMES:  # a header: of the joined frame, or of each frame
            cols = [series_of(c) for c in row[1:]]
            unnamed += [c for c, s in zip(row[1:], cols) if s is None and c.strip()]
            continue
        at = f"{where}:{n}"
        data_rows += 1
        if legacy:
            if len(row) < 3:
                raise UserError(f"{at}: expected Series;Time;Value, got {len(row)} field(s)")
            s = series_of(row[0])
            v = parse_value(row[2], at)
            if s is None:
                unnamed.append(row[0])
            elif v is not None:
                put(s, parse_time(row[1], at), v)
            continue
        if not cols:
            raise UserError(f"{at}: a row before any header (expected \"Time\" and the series)")
        t = parse_time(row[0], at)
        for s, cell in zip(cols, row[1:]):
            if s is None:
                continue
            v = parse_value(cell, at)
            if v is not None:
                put(s, t, v)
    if not by_key:
        if not data_rows:
            raise UserError(f"{where}: a header and no sample rows")
        if unnamed:
            raise UserError(
                f"{where}: no column names a vLLM series (e.g. {unnamed[0]!r}): in Grafana, "
                "set the query's legend to {{__name__}} with its labels (or leave it empty), "
                "then Inspect > Data > Download CSV")
        raise UserError(f"{where}: no vLLM series in this CSV")
    out = []
    for (_, _), sc in sorted(by_key.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        sc.values = {k: v for k, v in sc.values.items() if v}
        out.append(sc)
    return out
