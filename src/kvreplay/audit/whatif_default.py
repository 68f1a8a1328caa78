"""What-if of a default log (no request lines): each setting under the workloads its stats
lines (and scrapes) allow, every figure and the knee as ranges.

A default log has no workload to re-run; what it has is the ensemble of workloads
consistent with its stats and access lines (inference/default_log.py: arrivals inside
their intervals, lengths drawn to the logged tokens or the scraped histograms, a step time
around the one the busy intervals imply), each weighted by how well it reproduces them.
The what-if re-runs the heaviest of them (those holding WEIGHT_SHARE of the weight, at
most RUNS) open loop at their own arrival times, or closed loop with N clients, under each
setting with each one's own step time, and reports per row the weighted median and the
weighted 5-95% range (uncertainty.interval) of the preemptions and output throughput; the
knee of throughput vs --max-num-seqs or vs concurrency is taken under each workload, and
its range is theirs. No row is trustworthy: every run is a drawn workload.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from kvreplay.audit import metrics as M
from kvreplay.audit.whatif_replays import KNOBS, Setting, drive, fan_out, median_run, setting_config
from kvreplay.audit.whatif_ranges import sweep_knee

RUNS = 8  # workloads re-run per row, at most
WEIGHT_SHARE = 0.9  # ... the heaviest, until they hold this share of the ensemble's weight
TRUST = ("uncertain: a default log (no request lines): every run here is a workload drawn to "
         "its stats lines{s}; the ranges are over {n} of them, weighted")


@dataclasses.dataclass(slots=True)
class DefaultContext:
    log: str
    config: Any  # SchedulerConfig from the startup lines
    profile: Any
    members: list[Any]  # default_log.Member with their drawn workloads, heaviest first
    weights: list[float]  # renormalized over `members`
    answer: Any  # the DefaultAnswer
    how: str | None  # how the scrapes joined


def load(log: Any, paths: Sequence[str], metric_paths: Sequence[str], *, profile: str | None,
         samples: int | None, seed: int = 0) -> DefaultContext:
    """The default log's ensemble (`log`: sources.read_log of `paths`), its members'
    workloads kept. Raises UserError when the log is not a default log or cannot be
    answered."""
    from kvreplay.audit.default_report import answer_for, is_default_log
    from kvreplay.errors import UserError
    from kvreplay.inference.config import engine_config
    from kvreplay.inference.engines import scheduler_profile
    from kvreplay.inference.formats import log_format
    facts = log.facts
    if not is_default_log(facts):
        raise UserError("not a default log (it has request lines or no stats lines)")
    prof_name = None if profile in (None, "auto") else profile
    kept: list[Any] = []
    ans, how = answer_for(facts, list(metric_paths), profile=prof_name, samples=samples,
                          seed=seed, keep=kept)
    fmt = log_format(facts.vllm_version, facts.engine_version, prof_name)
    cfg, _src, _notes = engine_config(facts, fmt)
    prof = scheduler_profile(facts, fmt, prof_name)
    members, weights = heaviest(kept)
    return DefaultContext("+".join(paths), cfg, prof, members, weights, ans, how)


def heaviest(members: Sequence[Any]) -> tuple[list[Any], list[float]]:
    """The heaviest members holding WEIGHT_SHARE of the weight (at most RUNS, at least
    one), heaviest first (ties: drawn first), and their weights renormalized."""
    order = sorted(range(len(members)), key=lambda i: (-members[i].weight, i))
    total = sum(m.weight for m in members) or 1.0
    out, acc = [], 0.0
    for i in order[:RUNS]:
        out.append(members[i])
        acc += members[i].weight / total
        if acc >= WEIGHT_SHARE:
            break
    tot = sum(m.weight for m in out) or 1.0
    return out, [m.weight / tot for m in out]


def member_workload(cfg: Any, m: Any) -> tuple[Any, list[float], int]:
    """(workload, arrival times, requests rejected) of member `m` under config `cfg`: a
    request that no longer fits max_model_len is rejected, as vLLM's frontend does."""
    from kvreplay.inference.default_log import workload_of

    keep = [j for j, p in enumerate(m.prompts) if p < cfg.max_model_len]
    ins = [m.prompts[j] for j in keep]
    outs = [min(m.outputs[j], cfg.max_model_len - m.prompts[j]) for j in keep]
    pref = [tuple(m.prefixes[j]) for j in keep] if getattr(m, "prefixes", None) else None
    return workload_of(cfg, ins, outs, pref), [m.arrivals[j] for j in keep], len(m.prompts) - len(keep)


def run_row(ctx: DefaultContext, setting: Setting, clients: int | None) -> dict[str, Any]:
    """One row: the setting under each kept workload; medians and weighted 5-95% ranges."""
    from kvreplay.inference.clock import StepTimeModel
    from kvreplay.inference.uncertainty import interval

    row: dict[str, Any] = {"setting": setting.label, "concurrency": clients}
    row.update({k: setting.overrides.get(k) for k in KNOBS})
    try:
        cfg = setting_config(ctx.config, setting)
    except ValueError as exc:
        row["note"] = str(exc)
        return row
    runs, rejected = [], 0
    for m in ctx.members:
        wl, arr, rej = member_workload(cfg, m)
        rejected = max(rejected, rej)
        if not wl.requests:
            row["note"] = "every request is rejected under this max_model_len"
            return row
        model = StepTimeModel(overhead_s=m.step_time[0], per_token_s=m.step_time[1], per_request_s=0.0)
        runs.append(drive(wl, ctx.profile, model, arrivals=arr if clients is None else None,
                          clients=clients))
    pre = [r["preemptions"] for r in runs]
    tput = [r["output_tput"] for r in runs]
    k = median_run(pre, tput)
    row.update(runs[k])
    p = interval(pre, ctx.weights)
    t = interval(tput, ctx.weights, digits=2)
    row["preemptions"], row["output_tput"] = p["median"], t["median"]
    row["preemptions_interval"] = [p["low"], p["high"]]
    row["output_tput_interval"] = [t["low"], t["high"]]
    row["preemptions_draws"], row["output_tput_draws"] = pre, tput
    row["preemptions_range"] = f"{p['low']}-{p['high']}"
    row["output_tput_range"] = "{:,.0f}-{:,.0f}".format(t["low"], t["high"])
    row["trust"] = TRUST.format(s=" and scrapes" if ctx.answer.counted is not None else "",
                                n=len(runs))
    notes = [f"the run shown: the workload nearest the median of the {len(runs)}"]
    if rejected:
        notes.append(f"up to {rejected} requests rejected (prompt >= max_model_len "
                     f"{cfg.max_model_len}; drawn lengths)")
    row["note"] = "; ".join(notes)
    return row


_CTX: DefaultContext | None = None


def _init(ctx: DefaultContext) -> None:
    global _CTX
    _CTX = ctx


def _task(args: tuple[int, int | None, list[Setting]]) -> dict[str, Any]:
    i, clients, settings = args
    assert _CTX is not None
    return run_row(_CTX, settings[i], clients)


def sweep(ctx: DefaultContext, settings: list[Setting], concurrency: Sequence[int] | None = None,
          *, jobs: int | None = None) -> dict[str, Any]:
    """Every setting (x every concurrency), as whatif_replays.sweep's result."""
    from kvreplay.inference.uncertainty import interval

    settings, rows = fan_out(ctx, ctx.config, settings, concurrency, jobs, _init, _task)
    a = ctx.answer
    n = len(ctx.members)
    src = "stats lines and scrapes" if a.counted is not None else "stats lines"
    notes = [a.headline,
             f"every row re-runs the {n} heaviest of the {a.samples} workloads its {src} allow "
             f"({sum(ctx.weights):.0%} renormalized; their own arrival times, lengths and step "
             "times); each figure is their weighted median, each range their weighted 5-95%"]
    if ctx.how:
        notes.append(f"scrapes: {ctx.how}")
    knees = []
    if concurrency:
        for s in dict.fromkeys(r["setting"] for r in rows):
            rs = [r for r in rows if r["setting"] == s and r.get("output_tput_draws")]
            if not rs:
                knees.append({"setting": s, "knee": None, "text": f"{s}: no runs"})
                continue
            k = M.knee([(r["concurrency"], r["output_tput"]) for r in rs])
            per = [M.knee([(r["concurrency"], r["output_tput_draws"][j]) for r in rs])["knee"]
                   for j in range(n)]
            iv = interval(per, ctx.weights)
            knees.append({"setting": s, **k, "knee_interval": [iv["low"], iv["high"]],
                          "text": (f"{s}: knee at {k['knee']} clients (the lowest reaching 90% of "
                                   f"the peak of the median throughput), {iv['low']}-{iv['high']} "
                                   f"under the {n} workloads the log allows (weighted 5-95%)")})
        mode = (f"closed loop: N clients, each sending the next request of a workload the log "
                f"allows as soon as its previous one finished; about {a.requests} requests")
    else:
        mode = (f"open loop: the {a.requests} requests of each workload the log allows, at its "
                "drawn arrival times; times simulated with its step time")
    model = (f"per member: {ctx.members[0].step_time[0] * 1e3:.3g} ms a step + "
             f"{ctx.members[0].step_time[1] * 1e6:.3g} us a token (the heaviest), each drawn "
             "around the busy intervals' fit")
    out = {"log": ctx.log, "model": model, "fit": f"the {src} of a default log", "mode": mode,
           "notes": notes, "rows": rows, "knees": knees}
    if not concurrency:
        k = sweep_knee(rows, "max_num_seqs", ctx.config.max_num_seqs, KNOBS)
        if k is not None:
            k["text"] = k["text"].replace("under the step-time models the log allows",
                                          f"(lowest-highest) under the {n} workloads the log allows")
            out["seqs_knee"] = k
    return out
