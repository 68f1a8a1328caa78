"""The faithful model of vLLM's scheduler and KV block manager.

Public API:
- `parse_workload(dict) -> Workload`, `load_workload(path) -> dict`
- `simulate(workload, profile) -> (trace records, RunSummary)`, `Engine` for step control
- `get_profile("0.33" | "0.19.0" | ...) -> SchedulerProfile`
"""

from kvreplay.replay.engine import Engine, RunSummary, simulate
from kvreplay.replay.profile import DEFAULT_PROFILE, PROFILES, SchedulerProfile, get_profile
from kvreplay.replay.scheduler import Scheduler, SchedulerConfig
from kvreplay.replay.workload import Workload, load_workload, parse_workload

__all__ = [
    "DEFAULT_PROFILE",
    "Engine",
    "PROFILES",
    "RunSummary",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerProfile",
    "Workload",
    "get_profile",
    "load_workload",
    "parse_workload",
    "simulate",
]
