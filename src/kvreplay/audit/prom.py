"""Prometheus text-format scrapes of vLLM's `/metrics`, several over time.

Input: one file holding several scrapes one after another, or a folder of `.prom` files
(one scrape each, in name order). A scrape's time comes from a marker comment before it,

    # SCRAPE 1778148060          (epoch seconds)   or   # SCRAPE 2026-05-07T10:01:00Z

(which is what this loop writes:
`while sleep 10; do echo "# SCRAPE $(date +%s)"; curl -s localhost:8000/metrics; done >> vllm.prom`),
or from the samples' own timestamps; without either, scrapes are only ordered and the
per-second rates are unknown. Without markers a file is split where a metric family
starts again.

Each scrape is parsed with prometheus_client's `text_string_to_metric_families`. Series are
split by the `engine` label (data-parallel rank, vLLM V1 >= 0.8). Counters are read as
window differences; a counter that goes down was reset (server restart) and the increase
over that window is its new value.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from kvreplay.errors import UserError

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
}
HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
}


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


def looks_like_prometheus(path: str) -> bool:
    """A `.prom` file or folder, or a file whose first meaningful line is a Prometheus
    comment / vLLM sample rather than a log line."""
    if os.path.isdir(path):
        return any(n.endswith(".prom") for n in os.listdir(path))
    if path.endswith((".prom", ".metrics")):
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(4096).decode("utf-8", "replace")
    except OSError:
        return False
    for line in head.splitlines():
        s = line.strip()
        if not s:
            continue
        return bool(_MARK.match(s) or _HELP.match(s) or s.startswith("vllm:"))
    return False


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


def parse_scrape(text: str, time: float | None, where: str) -> Scrape:
    from prometheus_client.parser import text_string_to_metric_families

    sc = Scrape(time=time)
    wanted_g = {n: f for f, names in GAUGES.items() for n in names}
    wanted_c = {n: f for f, names in COUNTERS.items() for n in names}
    hists = {}
    for f, names in HISTOGRAMS.items():
        for n in (names,) if isinstance(names, str) else names:
            hists[n + "_bucket"] = f
    stamp: float | None = None
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as exc:  # the parser raises ValueError / various on bad input
        raise UserError(f"{where}: not a Prometheus text-format scrape: {exc}") from None
    for fam in families:
        for s in fam.samples:
            name, labels, value = s.name, s.labels, s.value
            eng = labels.get("engine", "")
            if s.timestamp is not None and stamp is None:
                stamp = float(s.timestamp)
            if sc.model is None and labels.get("model_name"):
                sc.model = labels["model_name"]
            vals = sc.values.setdefault(eng, {})
            if name in wanted_g:
                key = wanted_g[name]
                if key not in vals or name == GAUGES[key][0]:
                    vals[key] = float(value)
            elif name in wanted_c:
                key = wanted_c[name]
                if key not in vals or name == COUNTERS[key][0]:
                    vals[key] = float(value)
            elif name == "vllm:num_requests_waiting_by_reason":
                reason = labels.get("reason", "other")
                vals[f"waiting_{reason}"] = float(value)
            elif name in hists:
                le = labels.get("le")
                if le is not None:
                    b = sc.hist.setdefault(eng, {}).setdefault(hists[name], [])
                    b.append((math.inf if le in ("+Inf", "Inf") else float(le), float(value)))
            elif name.startswith("vllm:cache_config_info"):
                if labels.get("block_size", "").isdigit():
                    sc.block_size = int(labels["block_size"])
                if labels.get("num_gpu_blocks", "").isdigit():
                    sc.num_gpu_blocks = int(labels["num_gpu_blocks"])
    if sc.time is None and stamp is not None:
        sc.time = stamp
    sc.values = {k: v for k, v in sc.values.items() if v}
    return sc


def read_scrapes(path: str) -> list[Scrape]:
    """All scrapes of a file or folder, in time order (file order when times are unknown)."""
    parts: list[tuple[float | None, str, str]] = []
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path) if n.endswith(".prom"))
        for n in names:
            p = os.path.join(path, n)
            for t, chunk in split_scrapes(_read(p)):
                parts.append((t, chunk, p))
    else:
        for t, chunk in split_scrapes(_read(path)):
            parts.append((t, chunk, path))
    scrapes = [parse_scrape(chunk, t, where) for t, chunk, where in parts]
    scrapes = [s for s in scrapes if s.values or s.hist]
    if not scrapes:
        raise UserError(f"{path}: no vLLM metrics found (expected vllm:num_requests_running ...)")
    if all(s.time is not None for s in scrapes):
        scrapes.sort(key=lambda s: s.time)  # stable: equal times keep file order
    return scrapes


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc}") from None


def engines_of(scrapes: list[Scrape]) -> list[str]:
    out: set[str] = set()
    for s in scrapes:
        out.update(s.values)
        out.update(s.hist)
    return sorted(out, key=lambda e: (len(e), e))
