"""What a what-if row's ranges say: whether to act on it, and the knee of a sweep.

Read by audit/whatif_replays.py on the rows it made (`run_one`: the central run and the runs the
log allows, `output_tput_draws`); nothing here runs the engine.
"""

from __future__ import annotations

from typing import Any, Iterable

from kvreplay.audit import metrics as M
from kvreplay.audit.whatif_inputs import ESTIMATED


def trust(ctx: Any, row: dict[str, Any]) -> str:
    """Whether to act on a row: its batches against those the model was fitted on, how far
    the models the log allows disagree in throughput, and whether the runs the log allows
    agree on the preemption count: their whole range within max(3, 10%) (the answer keys'
    tolerance). A range twice that wide (the central run within the tolerance of either end)
    was called trustworthy before: 31 of those 37 rows were right on the what-if corpus's
    stats-line logs; with the range inside one tolerance, 20 of 20 (docs/accuracy.md)."""
    lo, hi = row["output_tput_interval"]
    width = (hi - lo) / max(1e-9, row["output_tput"])
    b = row.get("batch_mean")
    inside = ctx.batch_range is None or b is None or (
        0.8 * ctx.batch_range[0] <= b <= 1.2 * ctx.batch_range[1])
    where = "" if ctx.batch_range is None or b is None else (
        f"mean batch {b:.0f} requests a step, the log timed {ctx.batch_range[0]:.0f}-"
        f"{ctx.batch_range[1]:.0f}")
    c = row["preemptions"]
    p_lo, p_hi = row["preemptions_interval"]
    pinned = p_hi - p_lo <= max(3.0, 0.1 * c)  # every run within one tolerance of every other
    estimated = ctx.fit_source == ESTIMATED
    if inside and width <= 0.1 and pinned and not estimated:
        agree = (f"the runs the log allows agree within {100 * width:.0f}% in throughput and "
                 f"{p_lo}-{p_hi} preemptions")
        if where:
            return f"trustworthy: {where}; {agree}"
        return (f"trustworthy as far as the log tells: {agree}; the batch size is not checked "
                "(the log times too few stretches to compare it with)")
    why = []
    if estimated:
        why.append("the log has no prompts: their lengths, and so every run here, are "
                   "estimates (the ranges draw them around the estimate)")
    if not inside:
        why.append(f"{where}: the step time is extrapolated")
    if width > 0.1:
        why.append(f"the models the {ctx.fit_source} allow differ by {100 * width:.0f}% in throughput")
    if not pinned:
        why.append(f"the runs the log allows give {p_lo}-{p_hi} preemptions (where each request "
                   "arrived is not pinned to the step)")
    return "uncertain: " + "; ".join(why)


def sweep_knee(rows: list[dict[str, Any]], knob: str, logged: Any,
               knobs: Iterable[str]) -> dict[str, Any] | None:
    """The knee of output throughput vs a swept setting (open loop; metrics.knee: the lowest
    value reaching 90% of the peak), with the as-logged row at the logged value; its
    interval: the knee under each run the log allows (run_one's draws). `knobs`: every
    setting a row may change (whatif.KNOBS); a row changing only `knob` is a point."""
    pts: dict[Any, dict[str, Any]] = {}
    for r in rows:
        ov = {k for k in knobs if r.get(k) is not None}
        if r.get("output_tput") is None or r.get("concurrency") is not None:
            continue
        if ov == {knob}:
            pts[r[knob]] = r
        elif not ov:
            pts.setdefault(logged, r)
    if len(pts) < 3:
        return None
    xs = sorted(pts)
    k = M.knee([(x, pts[x]["output_tput"]) for x in xs])
    out = {"knob": knob, "knee": k["knee"], "peak": k["peak"],
           "points": [[x, pts[x]["output_tput"]] for x in xs]}
    draws = [pts[x].get("output_tput_draws") for x in xs]
    if all(draws) and len({len(d) for d in draws}) == 1:  # type: ignore[arg-type]
        ks = [M.knee([(x, d[j]) for x, d in zip(xs, draws)])["knee"]  # type: ignore[index]
              for j in range(len(draws[0]))]  # type: ignore[arg-type]
        out["knee_interval"] = [min(ks), max(ks)]
    lo_hi = out.get("knee_interval")
    out["text"] = (f"knee of throughput vs --{knob.replace('_', '-')}: {k['knee']} (the lowest "
                   f"value reaching 90% of the peak {k['peak_throughput']:,.0f} tok/s, at {k['peak']})"
                   + (f"; {lo_hi[0]}-{lo_hi[1]} under the step-time models the log allows" if lo_hi else ""))
    return out
