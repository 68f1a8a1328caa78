"""vLLM version / dialect detection: stated in startup lines, else from `[file.py:N]`
fingerprints (vllm-log-formats.md section 9). Overridable with `--vllm-version`."""

from __future__ import annotations

from typing import Iterable

import msgspec

from kvreplay import events as ev

# printed source of a stats / preemption line -> release family (spec section 9)
FINGERPRINTS: dict[str, str] = {
    "metrics.py:161": "0.3.1", "metrics.py:213": "0.3.3", "metrics.py:218": "0.4.0", "metrics.py:229": "0.4.1",
    "metrics.py:334": "0.4.2", "metrics.py:341": "0.5.0", "metrics.py:396": "0.5.3", "metrics.py:406": "0.5.4",
    "metrics.py:351": "0.5.5-0.6.1", "metrics.py:345": "0.6.3", "metrics.py:349": "0.6.3", "metrics.py:449": "0.6.4",
    "metrics.py:467": "0.6.5", "metrics.py:453": "0.7.0", "metrics.py:455": "0.7.2", "metrics.py:481": "0.8.0",
    "metrics.py:488": "0.8.3", "metrics.py:489": "0.8.4", "metrics.py:486": "0.8.5", "metrics.py:417": "0.9.1",
    "metrics.py:386": "0.10.0", "metrics.py:398": "0.10.2",
    "loggers.py:34": "0.7.0", "loggers.py:69": "0.7.1", "loggers.py:72": "0.7.2", "loggers.py:78": "0.7.3",
    "loggers.py:80": "0.8.0", "loggers.py:87": "0.8.3", "loggers.py:111": "0.8.5", "loggers.py:116": "0.9.0",
    "loggers.py:118": "0.9.1", "loggers.py:122": "0.10.0", "loggers.py:123": "0.10.1", "loggers.py:127": "0.11.0",
    "loggers.py:137": "0.9.1", "loggers.py:236": "0.11.1", "loggers.py:248": "0.13.0", "loggers.py:257": "0.14.0",
    "loggers.py:259": "0.16.0", "loggers.py:271": "0.20.0", "loggers.py:273": "0.24.0", "loggers.py:310": "0.26.0",
    "loggers.py:315": "0.30.0", "loggers.py:320": "0.31.0", "loggers.py:335": "0.32.0",
    "scheduler.py:1077": "0.4.3", "scheduler.py:1089": "0.5.0", "scheduler.py:1125": "0.5.3", "scheduler.py:1099": "0.5.4",
    "scheduler.py:1242": "0.5.5", "scheduler.py:1355": "0.6.0", "scheduler.py:1362": "0.6.1", "scheduler.py:1439": "0.6.2",
    "scheduler.py:1484": "0.6.3", "scheduler.py:1483": "0.6.3", "scheduler.py:1481": "0.6.4", "scheduler.py:1555": "0.6.5",
    "scheduler.py:1558": "0.7.0", "scheduler.py:1560": "0.7.2", "scheduler.py:1754": "0.7.3", "scheduler.py:1769": "0.8.0",
    "scheduler.py:1768": "0.8.5", "scheduler.py:1800": "0.9.0", "scheduler.py:1801": "0.9.1", "scheduler.py:1834": "0.9.2",
    "scheduler.py:1822": "0.10.0", "scheduler.py:1775": "0.10.1",
    "request_logger.py:63": "0.23.0", "request_logger.py:65": "0.31.0", "request_logger.py:66": "0.33.0",
    "async_llm.py:587": "0.33.0", "async_llm.py:561": "0.33.0", "async_llm.py:578": "0.32.0", "async_llm.py:552": "0.32.0",
}
_FINGERPRINT_KINDS = (ev.Stats, ev.Preemption, ev.RequestReceived, ev.RequestAdded)


class Dialect(msgspec.Struct, omit_defaults=True):
    vllm_version: str | None = None
    how: str = "unknown"  # "given" | "stated" | "fingerprint <file.py:N>" | "unknown"
    engine_version: str | None = None  # "V0" | "V1"


def _vkey(v: str) -> tuple[int, ...]:
    out = []
    for p in v.split(".")[:3]:
        digits = "".join(ch for ch in p if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def engine_for(version: str | None) -> str | None:
    if not version:
        return None
    return "V1" if _vkey(version) >= (0, 8, 0) else "V0"


class Detector:
    """Feed events one at a time (streaming); `result()` gives the dialect."""

    def __init__(self, given: str | None = None) -> None:
        self.given = given
        self.stated: str | None = None
        self.engine: str | None = None
        self.fingerprint: tuple[str, str] | None = None
        self.v0_stats = False

    def feed(self, e: ev.Event) -> None:
        if isinstance(e, ev.EngineConfig):
            if e.vllm_version and self.stated is None:
                self.stated = e.vllm_version
            if e.engine_version and self.engine is None:
                self.engine = e.engine_version
        elif self.fingerprint is None and isinstance(e, _FINGERPRINT_KINDS) and e.source:
            base = e.source.rsplit("/", 1)[-1]
            v = FINGERPRINTS.get(base)
            if v is not None:
                self.fingerprint = (v, base)
        if isinstance(e, (ev.Stats)) and e.era == "v0":
            self.v0_stats = True

    def result(self) -> Dialect:
        if self.given:
            return Dialect(self.given, "given", self.engine or engine_for(self.given))
        if self.stated:
            return Dialect(self.stated.lstrip("v"), "stated", self.engine or engine_for(self.stated.lstrip("v")))
        if self.fingerprint:
            v, src = self.fingerprint
            eng = "V0" if self.v0_stats else (self.engine or engine_for(v))
            return Dialect(v, f"fingerprint {src}", eng)
        return Dialect(None, "unknown", self.engine or ("V0" if self.v0_stats else None))


def detect(events: Iterable[ev.Event], given: str | None = None) -> Dialect:
    d = Detector(given)
    for e in events:
        d.feed(e)
    return d.result()
