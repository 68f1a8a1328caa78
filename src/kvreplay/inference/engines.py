"""The one engine protocol every inference stage drives, V1 and V0 alike.

Consumes: a rebuilt workload (stage 3) and its scheduler profile. Produces: an engine with
the input API of `kvreplay.replay.engine.Engine` (`submit`, `abort`, `stop`, `inputs`,
`has_work`, `finish_imminent`, `step() -> StepRecord`); the V0 engine is wrapped by
`kvreplay.replay.v0.steps.V0Steps` to the same contract. Here the log format picks the
engine, its workload type and its scheduler profile; every other stage drives whichever it
gets through this protocol (only the engine config differs too: config.py).
"""

from __future__ import annotations

from typing import Any, Protocol, TYPE_CHECKING

from kvreplay.errors import ReplayError
from kvreplay.replay.engine import Engine
from kvreplay.replay.profile import SchedulerProfile, get_profile
from kvreplay.replay.records import EngineInputs, StepRecord
from kvreplay.replay.v0.steps import V0_PROFILE, V0ProfileRef, V0Steps, V0Workload
from kvreplay.replay.workload import RequestSpec, Workload

if TYPE_CHECKING:
    from kvreplay.inference.formats import LogFormat
    from kvreplay.inference.facts import LogFacts



# the scheduler rules an engine follows: a V1 release's, or V0 0.6.6.post1's
Profile = SchedulerProfile | V0ProfileRef


class ReplayEngine(Protocol):
    step_index: int
    done: bool

    def submit(self, index: int) -> None: ...
    def abort(self, request_id: str) -> bool: ...
    def stop(self) -> None: ...
    def inputs(self) -> EngineInputs: ...
    def has_work(self) -> bool: ...
    def finish_imminent(self) -> bool: ...
    def step(self) -> StepRecord: ...


def make_workload(fmt: LogFormat, cfg: Any, specs: list[RequestSpec], parent: dict[str, str],
                  description: str) -> Workload | V0Workload:
    if fmt.engine == "V0":
        return V0Workload("log replay", description, cfg, specs, 10**9, parent)
    return Workload(name="log replay", description=description, config=cfg, requests=specs,
                    max_steps=10**9)


def make_engine(workload: Workload | V0Workload, profile: Profile, *,
                inputs: EngineInputs | None = None, record_sampled: bool = False) -> ReplayEngine:
    """An engine for `workload`; with `inputs`, the run they describe, else one whose
    requests enter only when submitted."""
    if isinstance(workload, V0Workload):
        return V0Steps(workload, inputs=inputs, record_sampled=record_sampled)
    if inputs is None:
        inputs = EngineInputs([-1] * len(workload.requests))
    return Engine(workload, profile, inputs=inputs, record_sampled=record_sampled)


V0_PROFILE_NAMES = (None, "auto", "v0", "0.6.6", "0.6.6.post1", V0ProfileRef().name)


def scheduler_profile(facts: LogFacts, fmt: LogFormat, profile: str | None) -> Any:
    """The scheduler rules the engine follows: the profile asked for, else the log's
    release's (V1); V0 has one, 0.6.6.post1's."""
    if fmt.engine == "V1":
        return get_profile(profile or facts.vllm_version)
    if facts.engine_version == "V1":
        raise ReplayError(f"this vLLM {facts.vllm_version} log comes from the V1 engine, which "
                          "has no profile before 0.8.5: pass --profile 0.8.5 to replay it with "
                          "the oldest V1 rules")
    if profile not in V0_PROFILE_NAMES:
        raise ReplayError(f"profile {profile!r} is a V1 release, but this log comes from the V0 "
                          f"engine: the V0 replay follows vLLM {V0_PROFILE} (omit --profile)")
    return V0ProfileRef()


def num_requests(workload: Workload | V0Workload) -> int:
    """Logged requests (a V0 request with n > 1 is n specs)."""
    if isinstance(workload, V0Workload):
        return len({workload.parent.get(s.id, s.id) for s in workload.requests})
    return len(workload.requests)
