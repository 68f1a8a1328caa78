"""The one entry point of the inference: what a server left in, one `Replay` out.

    infer(Evidence(log=..., spans=..., kv_events=...)) -> Replay

The front end reads the files (kvreplay.sources: the inference never imports the parsers)
and hands over everything it read; here each kind of evidence is used where it is present,
whatever else is missing:

* a step-trace log (kvreplay's vLLM plugin), with its KV-event records: every step exact
  (step_trace.py); request spans beside it add nothing and are said to be unused;
* request spans with no request lines (or no log): the spans are the workload, with the
  log's startup lines or a given config (span_workload.py);
* a log with request lines: the log replay (driver.replay_log: Iteration lines, stats
  lines, prompts, access lines), with request spans joined to its requests (spans.py) and
  the replay checked against them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kvreplay import events as ev
from kvreplay.errors import UserError
from kvreplay.inference.clock import StepTimeModel
from kvreplay.inference.driver import replay_log
from kvreplay.inference.facts import LogFacts, collect, with_notes
from kvreplay.inference.spans import SpanJoin, check_spans, join_spans
from kvreplay.replay.result import Replay

SPAN_RELEASE = "0.33.0"  # the release whose do_tracing writes the spans kvreplay reads


class Release(Protocol):
    """The release that wrote a log, as the parsers detect it (parsers.version.Dialect)."""

    vllm_version: str | None
    engine_version: str | None


@dataclass(slots=True)
class LogEvidence:
    """Log files read once: their events (merged by time), the release that wrote them
    (`dialect`: the parsers' detection), the merged startup config; `facts` collected on
    first use, and the request spans' join cached once made."""

    paths: list[str]
    events: list[ev.Event]
    dialect: Release
    config: ev.EngineConfig | None
    _facts: LogFacts | None = field(default=None, repr=False)
    span_join: SpanJoin | None = field(default=None, repr=False)  # once joined

    @property
    def facts(self) -> LogFacts:
        """What the log says (facts.LogFacts)."""
        if self._facts is None:
            self._facts = collect(self.events, list(self.paths), config=self.config,
                                  vllm_version=self.dialect.vllm_version,
                                  engine_version=self.dialect.engine_version)
        return self._facts


@dataclass(slots=True)
class SpanEvidence:
    """Request spans read from their files (OTLP/JSON or Jaeger JSON), with the lines that
    could not be read ("file:line: why")."""

    paths: list[str]
    spans: list[ev.RequestSpan]
    problems: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Evidence:
    """Everything one server left that the front end read: its log, request spans, the
    step-trace plugin's KV-event records, and the engine config given for spans alone."""

    log: LogEvidence | None = None
    spans: SpanEvidence | None = None
    kv_events: list[ev.Event] | None = None
    kv_paths: list[str] = field(default_factory=list)
    config: ev.EngineConfig | None = None  # --config: spans replayed without their log
    vllm_version: str | None = None  # --vllm-version: the release, if not detected
    # the same server's Prometheus scrapes on the log's clock (evidence_metrics.CounterPoint)
    counters: list[Any] = field(default_factory=list)


def infer(evidence: Evidence, *, profile: str | None = None,
          step_time: StepTimeModel | None = None,
          samples: int | None = None, seed: int = 0, window: Any = None) -> Replay:
    """The one `Replay` of a server's evidence (module docstring). `profile`: the scheduler
    rules (default: the log's release); `step_time`: a step-time model taken as given;
    `samples`, `seed`: the uncertainty ensemble."""
    log, spans = evidence.log, evidence.spans
    profile = None if profile in (None, "auto") else profile
    if log is None:
        if spans is None:
            raise UserError("nothing to replay: give vLLM log files or request spans")
        return _spans_alone(evidence, profile=profile, step_time=step_time, seed=seed)
    label = f"log {', '.join(Path(p).name for p in log.paths)}"
    from kvreplay.inference.step_trace import has_step_trace, replay_step_trace

    if has_step_trace(log.events):
        rep = replay_step_trace(log.events, profile=profile, kv_events=evidence.kv_events,
                                label=label + " (step trace)")
        rep.paths = list(log.paths)
        if spans is not None:
            rep.notes.append("request spans not used: a step-trace log gives every step "
                             "exactly (" + ", ".join(spans.paths) + ")")
        return rep
    if evidence.kv_paths:
        raise UserError(
            "KV-event files are checked against a log written with kvreplay's step-trace "
            "scheduler (--scheduler-cls kvreplay.vllm_plugin.StepTraceScheduler); this log "
            "has no kvtrace lines")
    if spans is not None and not log.facts.requests:
        # startup lines only: the spans are the workload
        return _spans_alone(evidence, profile=profile, step_time=step_time, seed=seed)
    join = join_spans_once(log, spans) if spans is not None else None
    facts = join.facts if join is not None else log.facts
    rep = replay_log(facts, profile=profile, step_time=step_time, samples=samples,
                     seed=seed, counters=evidence.counters, window=window)
    rep.label = f"{label} (vLLM {rep.info.vllm_version or '?'}, replayed)"
    if join is not None:
        assert spans is not None
        rep.label += f" + {len(spans.paths)} span file(s), {join.joined}/{join.requests} joined"
        _span_checks(rep, join, spans.paths)
    return rep


def join_spans_once(log: LogEvidence, spans: SpanEvidence) -> SpanJoin:
    """The spans joined to the log's requests (spans.join_spans), once per `LogEvidence`."""
    if log.span_join is None:
        log.span_join = join_spans(log.facts, spans.spans, spans.problems)
    return log.span_join


def _span_checks(rep: Replay, join: SpanJoin, span_paths: list[str]) -> None:
    """The spans' summary and what the replay contradicts, in the replay's info and notes."""
    check = check_spans(rep, join)
    rep.info.spans = {**join.summary(), **check,
                      "arrivals": "spans" if rep.facts.span_placement else "seconds"}
    rep.paths = list(rep.paths) + [p for p in span_paths if p not in rep.paths]
    if check.get("first_token_late") or check.get("admitted_early"):
        rep.notes.append(
            f"request spans the replay contradicts: {check['first_token_late']} first "
            f"token(s) later than the span's (e.g. {', '.join(check['first_token_late_ids'][:3]) or '-'}), "
            f"{check['admitted_early']} admission(s) before the span's queue time ended "
            f"(e.g. {', '.join(check['admitted_early_ids'][:3]) or '-'})")


def _spans_alone(evidence: Evidence, *, profile: str | None, step_time: StepTimeModel | None,
                 seed: int) -> Replay:
    """The replay of request spans as the workload (span_workload.py), with the engine
    config given (`Evidence.config`) or of the log's startup lines."""
    from kvreplay.inference.span_workload import facts_from_spans

    spans, log = evidence.spans, evidence.log
    assert spans is not None
    if evidence.config is not None:
        cfg = evidence.config
        version = evidence.vllm_version or cfg.vllm_version
    elif log is not None:
        cfg, version = log.config, evidence.vllm_version or log.dialect.vllm_version
    else:
        cfg, version = None, evidence.vllm_version
    version = version or SPAN_RELEASE
    facts = facts_from_spans(spans.spans, cfg, list(spans.paths), version)
    if log is not None:
        facts = with_notes(facts, f"{', '.join(log.paths)}: no request lines; its startup "
                           "lines give the engine config")
    rep = replay_log(facts, profile=profile, step_time=step_time, samples=0, seed=seed)
    src = f"{len(spans.paths)} span file(s)" + ("" if log is None else
                                                f" + the config of {', '.join(log.paths)}")
    rep.label = f"request spans alone: {src} (vLLM {version} rules, replayed)"
    join = SpanJoin(spans=len(spans.spans), requests=len(facts.requests),
                    joined=len(spans.spans), offset_s=0.0, offset_interval=(0.0, 0.0),
                    unjoined_spans=0, problems=spans.problems,
                    by_request={r.index: r.span for r in facts.requests})
    _span_checks(rep, join, spans.paths)
    return rep
