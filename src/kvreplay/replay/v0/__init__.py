"""V0 engine replay (vLLM 0.6 / 0.7 `vllm/core/`): spec Part B with the corrections of Part F.

Public API:
    run_workload(workload: dict) -> list[dict]   # trace records, oracle field names
    summarize(trace, workload=None) -> dict       # summary.json fields
    trace_text(trace) -> str                      # compact JSON lines (byte-identical to the oracle)
"""
from .v0_engine import V0Engine, parse_workload, run_workload, summarize, trace_text
from .v0_scheduler import V0_PROFILES, V0Profile

__all__ = ["run_workload", "V0Engine", "summarize", "trace_text", "parse_workload", "V0Profile", "V0_PROFILES"]
