"""Prometheus text-format scrapes of vLLM's `/metrics`, several over time.

Input: one file holding several scrapes one after another, or a folder of `.prom` files
(one scrape each, in name order). A scrape's time comes from a marker comment before it,

    # SCRAPE 1778148060          (epoch seconds)   or   # SCRAPE 2026-05-07T10:01:00Z

(which is what this loop writes:
`while sleep 10; do echo "# SCRAPE $(date +%s)"; curl -s localhost:8000/metrics; done >> vllm.prom`),
or from the samples' own timestamps; without either, scrapes are only ordered and the
per-second rates are unknown. Without markers a file is split where a metric family
starts again.

Files may be gzipped (`.gz`). The Prometheus HTTP API's JSON is read too: what
`/api/v1/query_range` (a matrix: each series with its `values`) or `/api/v1/query` (a
vector: one `value` each) returns, one or many files; every (time, series, value) becomes
the sample of a scrape at that time, so a series exported from Prometheus gives the same
record as the scrape text it was scraped from (histograms as `_bucket` series with `le`).
Several servers in one export are told apart by the `instance` label. Grafana's "Download
CSV" of a panel's vLLM series (a time column, a column per series) is read the same way
(audit/grafana_csv.py).

Each scrape is parsed with prometheus_client's `text_string_to_metric_families`. Series are
split by the `engine` label (data-parallel rank, vLLM V1 >= 0.8). Counters are read as
window differences; a counter that goes down was reset (server restart) and the increase
over that window is its new value.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from kvreplay.errors import UserError
from kvreplay.limits import gunzip

_MARK = re.compile(r"^#\s*SCRAPE\b[ :=]*(\S*)", re.IGNORECASE)
_HELP = re.compile(r"^#\s*(?:HELP|TYPE)\s+(\S+)")

GAUGES = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
}
COUNTERS = {
    "preemptions": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
    "prompt_tokens": ("vllm:prompt_tokens_total", "vllm:prompt_tokens"),
    "generation_tokens": ("vllm:generation_tokens_total", "vllm:generation_tokens"),
    "recomputed_tokens": ("vllm:prompt_tokens_recomputed_total", "vllm:prompt_tokens_recomputed"),
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries"),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits"),
    "requests_finished": ("vllm:request_success_total", "vllm:request_success"),
}
HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    # the length histograms (observed at each finish) and the per-step token histogram
    "prompt_len": "vllm:request_prompt_tokens",
    "output_len": "vllm:request_generation_tokens",
    "step_tokens": "vllm:iteration_tokens_total",
    "request_preemptions": "vllm:request_num_preemptions",
}
# vLLM PR #58037 (open): vllm:num_preemptions_by_reason{reason="kv_full"|"priority"|...}
BY_REASON = ("vllm:num_preemptions_by_reason_total", "vllm:num_preemptions_by_reason")


@dataclass(slots=True)
class Scrape:
    time: float | None
    # engine label ("" when absent) -> field -> value
    values: dict[str, dict[str, float]] = field(default_factory=dict)
    # engine -> histogram -> [(le, cumulative count)]
    hist: dict[str, dict[str, list[tuple[float, float]]]] = field(default_factory=dict)
    model: str | None = None
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    instance: str | None = None  # the `instance` label of an HTTP API export


def looks_like_prometheus(path: str) -> bool:
    """A `.prom` file or folder, or a file whose first meaningful line is a Prometheus
    comment / vLLM sample rather than a log line."""
    if os.path.isdir(path):
        names = sorted(os.listdir(path))
        return any(n.endswith((".prom", ".prom.gz")) for n in names) or any(
            n.endswith((".json", ".json.gz", ".csv", ".csv.gz"))
            and looks_like_prometheus(os.path.join(path, n)) for n in names)
    if path.endswith((".prom", ".metrics", ".prom.gz", ".metrics.gz")):
        return True
    try:
        head = _head(path)
    except OSError:
        return False
    if _API.search(head[:2048]):
        return True
    from kvreplay.audit.grafana_csv import looks_like_grafana_csv

    if looks_like_grafana_csv(head):
        return True
    for line in head.splitlines():
        s = line.strip()
        if not s:
            continue
        return bool(_MARK.match(s) or _HELP.match(s) or s.startswith("vllm:"))
    return False


_API = re.compile(r'^\s*\{\s*"status"\s*:\s*"(?:success|error)"|"resultType"\s*:\s*"(?:matrix|vector)"')


def _head(path: str) -> str:
    with open(path, "rb") as f:
        raw = f.read(4096)
    if raw[:2] == b"\x1f\x8b":
        with gzip.open(path, "rb") as g:
            try:
                raw = g.read(4096)
            except (OSError, EOFError, zlib.error):  # a corrupt .gz: not a scrape file
                raw = b""
    return raw.decode("utf-8", "replace")


def _parse_time(text: str) -> float | None:
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UserError(f"scrape marker time {text!r} is neither epoch seconds nor ISO 8601") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def split_scrapes(text: str) -> list[tuple[float | None, str]]:
    """Cut a file into (marker time, scrape text) chunks."""
    chunks: list[tuple[float | None, list[str]]] = []
    seen: set[str] = set()
    for line in text.splitlines():
        m = _MARK.match(line)
        if m:
            chunks.append((_parse_time(m.group(1)), []))
            seen = set()
            continue
        h = _HELP.match(line)
        if h and line.lstrip("# ").startswith("HELP"):
            name = h.group(1)
            if name in seen:  # the same family again: a new scrape without a marker
                chunks.append((None, []))
                seen = set()
            seen.add(name)
        if not chunks:
            chunks.append((None, []))
        chunks[-1][1].append(line)
    return [(t, "\n".join(lines) + "\n") for t, lines in chunks if any(l.strip() for l in lines)]


_SERIES_LABELS = {"engine", "model_name", "instance", "job"}


class _Taker:
    """Puts one (name, labels, value) sample into a Scrape: the one place that says which
    vLLM series become which field, for scrape text and HTTP API JSON alike."""

    def __init__(self) -> None:
        self.gauges = {n: f for f, names in GAUGES.items() for n in names}
        self.counters = {n: f for f, names in COUNTERS.items() for n in names}
        self.hists = {}
        for f, names in HISTOGRAMS.items():
            for n in (names,) if isinstance(names, str) else names:
                self.hists[n + "_bucket"] = f

    def take(self, sc: Scrape, name: str, labels: dict[str, str], value: float) -> None:
        eng = labels.get("engine", "")
        if sc.model is None and labels.get("model_name"):
            sc.model = labels["model_name"]
        vals = sc.values.setdefault(eng, {})
        if name in self.gauges:
            key = self.gauges[name]
            if key not in vals or name == GAUGES[key][0]:
                vals[key] = float(value)
        elif name in self.counters:
            key = self.counters[name]
            if any(k not in _SERIES_LABELS for k in labels):  # e.g. finished_reason: summed
                vals[key] = vals.get(key, 0.0) + float(value)
            elif key not in vals or name == COUNTERS[key][0]:
                vals[key] = float(value)
        elif name == "vllm:num_requests_waiting_by_reason":
            vals[f"waiting_{labels.get('reason', 'other')}"] = float(value)
        elif name in BY_REASON:
            key = f"preemptions_{labels.get('reason', 'other')}"
            vals[key] = vals.get(key, 0.0) + float(value)
        elif name in self.hists:
            le = labels.get("le")
            if le is not None:
                b = sc.hist.setdefault(eng, {}).setdefault(self.hists[name], [])
                b.append((math.inf if le in ("+Inf", "Inf", "inf") else float(le), float(value)))
        elif name.startswith("vllm:cache_config_info"):
            if labels.get("block_size", "").isdigit():
                sc.block_size = int(labels["block_size"])
            if labels.get("num_gpu_blocks", "").isdigit():
                sc.num_gpu_blocks = int(labels["num_gpu_blocks"])


_TAKER = _Taker()


def parse_scrape(text: str, time: float | None, where: str) -> Scrape:
    from prometheus_client.parser import text_string_to_metric_families

    sc = Scrape(time=time)
    stamp: float | None = None
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as exc:  # the parser raises ValueError / various on bad input
        raise UserError(f"{where}: not a Prometheus text-format scrape: {exc}") from None
    for fam in families:
        for s in fam.samples:
            if s.timestamp is not None and stamp is None:
                stamp = float(s.timestamp)
            _TAKER.take(sc, s.name, s.labels, s.value)
    if sc.time is None and stamp is not None:
        sc.time = stamp
    sc.values = {k: v for k, v in sc.values.items() if v}
    return sc


def parse_api_json(text: str, where: str) -> list[Scrape]:
    """A Prometheus HTTP API response (`query_range` matrix or `query` vector) -> one
    Scrape per (instance, time stamp), in time order."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise UserError(f"{where}: not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise UserError(f"{where}: not a Prometheus API response (expected an object)")
    if doc.get("status") == "error":
        raise UserError(f"{where}: Prometheus returned an error: {doc.get('error', '?')}")
    data = doc.get("data", doc)
    result = data.get("result") if isinstance(data, dict) else None
    if not isinstance(result, list):
        raise UserError(f"{where}: not a Prometheus API response (no data.result)")
    by_key: dict[tuple[str, float], Scrape] = {}
    for series in result:
        labels = dict(series.get("metric") or {}) if isinstance(series, dict) else {}
        name = labels.pop("__name__", None)
        if not name:
            continue
        inst = labels.get("instance", "")
        points = series.get("values")
        if points is None and series.get("value") is not None:
            points = [series["value"]]
        for pt in points or ():
            try:
                t, v = float(pt[0]), float(pt[1])
            except (TypeError, ValueError, IndexError):
                raise UserError(f"{where}: bad sample {pt!r} in series {name}") from None
            sc = by_key.get((inst, t))
            if sc is None:
                sc = by_key[(inst, t)] = Scrape(time=t, instance=inst or None)
            _TAKER.take(sc, name, labels, v)
    out = []
    for (_, _), sc in sorted(by_key.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        sc.values = {k: v for k, v in sc.values.items() if v}
        out.append(sc)
    return out


def read_scrapes(path: str | list[str]) -> list[Scrape]:
    """All scrapes of a file, a folder or several files (scrape text, `.gz`, HTTP API JSON),
    in time order (file order when times are unknown)."""
    paths = [path] if isinstance(path, str) else list(path)
    scrapes: list[Scrape] = []
    for p in paths:
        files = ([os.path.join(p, n) for n in sorted(os.listdir(p))
                  if n.endswith((".prom", ".prom.gz", ".json", ".json.gz", ".csv", ".csv.gz"))]
                 if os.path.isdir(p) else [p])
        for f in files:
            text = _read(f)
            if _API.search(text[:2048]):
                scrapes.extend(parse_api_json(text, f))
                continue
            from kvreplay.audit.grafana_csv import looks_like_grafana_csv, parse_grafana_csv

            if looks_like_grafana_csv(text[:4096]):
                scrapes.extend(parse_grafana_csv(text, f))
                continue
            for t, chunk in split_scrapes(text):
                scrapes.append(parse_scrape(chunk, t, f))
    if scrapes and all(s.time is not None for s in scrapes):
        scrapes.sort(key=lambda s: s.time)  # stable: equal times keep file order
        scrapes = _merge_same_time(scrapes)
    scrapes = [s for s in scrapes if s.values or s.hist]
    if not scrapes:
        raise UserError(f"{'+'.join(paths)}: no vLLM metrics found (expected vllm:num_requests_running ...)")
    return scrapes


def _merge_same_time(scrapes: list[Scrape]) -> list[Scrape]:
    """Scrapes of one time and instance (one query per file of the same range) -> one."""
    out: list[Scrape] = []
    for s in scrapes:
        prev = out[-1] if out else None
        if prev is not None and prev.time == s.time and prev.instance == s.instance:
            for eng, vals in s.values.items():
                prev.values.setdefault(eng, {}).update(vals)
            for eng, hs in s.hist.items():
                for k, b in hs.items():
                    prev.hist.setdefault(eng, {}).setdefault(k, []).extend(b)
            prev.model = prev.model or s.model
            prev.block_size = prev.block_size or s.block_size
            prev.num_gpu_blocks = prev.num_gpu_blocks or s.num_gpu_blocks
        else:
            out.append(s)
    return out


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gunzip(raw)  # (bounded: OSError when corrupt, cut or too large)
    except (OSError, EOFError) as exc:
        raise UserError(f"{path}: cannot read: {exc}") from None
    return raw.decode("utf-8", errors="replace")


def engines_of(scrapes: list[Scrape]) -> list[str]:
    out: set[str] = set()
    for s in scrapes:
        out.update(s.values)
        out.update(s.hist)
    return sorted(out, key=lambda e: (len(e), e))


def by_instance(scrapes: list[Scrape]) -> list[tuple[str | None, list[Scrape]]]:
    """Scrapes split by their `instance` label (None: scrape files, which carry none)."""
    groups: dict[str | None, list[Scrape]] = {}
    for s in scrapes:
        groups.setdefault(s.instance, []).append(s)
    return sorted(groups.items(), key=lambda kv: kv[0] or "")
