"""What-if replays: the log's workload under other scheduler settings or concurrencies.

* Open loop (default): each request arrives when its step of the log's replay started
  (whatif_inputs.timed_arrivals), and the run under each setting is timed by the
  step-time model fitted term by term on what the log times (inference/step_model.py).
  As logged, the run is the replay again. The completion order the log shows is NOT
  imposed (it belongs to the logged setting), nor are aborts or the log's end: every
  request runs to completion. Each row is re-run under the runs the log allows (drawn
  models, ensemble members, the arrivals' other end of their steps) for its ranges, and
  says whether to act on it (whatif_ranges.trust). Checked against vLLM's own scheduler
  under the changed setting: tools/oracle/whatif_keys.py, docs/accuracy.md.
* Closed loop (`concurrency`): N clients, each sends the next request of the log as soon
  as its previous one finished, as `vllm bench serve --max-concurrency N` does; the
  engine is driven step by step and the clock advances by the fitted step time.

Settings use vLLM's flag names. One variable at a time (each value against the logged
setting) or a grid (every combination). A setting vLLM itself would refuse (the pool
cannot hold one max_model_len sequence; chunked prefill off with a token budget below
max_model_len) gives a row with the reason instead of numbers. With a lower
max_model_len, requests that no longer fit are rejected as vLLM's frontend rejects them.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import statistics
from dataclasses import dataclass, field
from typing import Any, Sequence

from kvreplay.audit import metrics as M
from kvreplay.audit.whatif_inputs import (  # noqa: F401 (re-exported)
    DRAWS, ENSEMBLE_RUNS, ESTIMATED, Context, ensemble_members, load, timed_arrivals)
from kvreplay.audit.whatif_ranges import sweep_knee, trust  # noqa: F401 (re-exported)
from kvreplay.words import count

# vLLM flag (dest form) -> SchedulerConfig field
KNOBS: dict[str, str] = {
    "max_num_seqs": "max_num_seqs",
    "num_gpu_blocks": "num_gpu_blocks",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "max_model_len": "max_model_len",
    "enable_prefix_caching": "enable_prefix_caching",
    "enable_chunked_prefill": "enable_chunked_prefill",
}


def flag(knob: str, value: Any) -> str:
    name = "--" + knob.replace("_", "-")
    if isinstance(value, bool):
        return name if value else "--no-" + name[2:]
    return f"{name} {value}"


@dataclass(slots=True)
class Setting:
    label: str
    overrides: dict[str, Any] = field(default_factory=dict)


def plan(knobs: dict[str, list[Any]], *, grid: bool = False) -> list[Setting]:
    """The baseline ('as logged') first, then one setting per value (or per combination)."""
    out = [Setting("as logged", {})]
    items = [(k, v) for k, v in knobs.items() if v]
    if grid and len(items) > 1:
        for combo in itertools.product(*[[(k, x) for x in vals] for k, vals in items]):
            out.append(Setting(" ".join(flag(k, x) for k, x in combo), dict(combo)))
    else:
        for k, vals in items:
            for x in vals:
                out.append(Setting(flag(k, x), {k: x}))
    return out


def setting_config(base: Any, setting: Setting) -> Any:
    """The SchedulerConfig under a setting, or raise ValueError with the reason vLLM would
    refuse it."""
    cfg = dataclasses.replace(base, **{KNOBS[k]: v for k, v in setting.overrides.items()})
    need = -(-cfg.max_model_len // cfg.block_size)
    if need > cfg.num_gpu_blocks - 1:
        raise ValueError(f"vLLM would not start: max_model_len {cfg.max_model_len} needs {need} KV "
                         f"blocks, the pool has {cfg.num_gpu_blocks - 1} usable")
    if not cfg.enable_chunked_prefill and cfg.max_num_batched_tokens < cfg.max_model_len:
        raise ValueError(f"vLLM would not start: chunked prefill off needs max_num_batched_tokens "
                         f"({cfg.max_num_batched_tokens}) >= max_model_len ({cfg.max_model_len})")
    return cfg


def configure(ctx: Context, setting: Setting, workload: Any = None):
    """(workload, facts, notes) for a setting, or raise ValueError with vLLM's reason.
    `workload`: another rebuild of the log's requests (an ensemble member's), else the
    replay's."""
    workload = workload if workload is not None else ctx.workload
    cfg = setting_config(workload.config, setting)
    notes: list[str] = []
    specs = workload.requests
    logged = ctx.facts.requests if ctx.facts is not None else []  # (a step trace: none)
    keep: list[int] = []
    new_specs = []
    rejected = clamped = 0
    for i, s in enumerate(specs):
        p = len(s.prompt_token_ids)
        asked = logged[i].max_tokens if i < len(logged) else s.max_tokens
        if p >= cfg.max_model_len or (asked is not None and p + asked > cfg.max_model_len):
            rejected += 1
            continue
        mt = s.max_tokens
        if p + mt > cfg.max_model_len:
            mt = cfg.max_model_len - p
            clamped += 1
        keep.append(i)
        new_specs.append(s if mt == s.max_tokens else dataclasses.replace(s, max_tokens=mt))
    est = ("; an estimate: the log gives no prompt lengths"
           if ctx.fit_source == ESTIMATED else "")
    if rejected:
        notes.append(f"{count(rejected, 'request')} rejected (prompt + max_tokens > "
                     f"max_model_len {cfg.max_model_len}{est})")
    if clamped:
        notes.append(f"the default max_tokens of {count(clamped, 'request')} cut to "
                     f"max_model_len{est}")
    if not new_specs:
        raise ValueError("every request is rejected under this max_model_len")
    wl = dataclasses.replace(workload, config=cfg, requests=new_specs)
    facts = ctx.facts
    if len(keep) != len(specs) and facts is not None:
        facts = dataclasses.replace(facts, requests=[facts.requests[i] for i in keep])
    return wl, facts, notes


def drive(workload, profile, model, *, arrivals: Sequence[float] | None = None,
          clients: int | None = None, max_steps: int | None = None) -> dict[str, Any]:
    """Run the workload through the engine on a simulated clock and measure it.

    Open loop: request i enters at the first step starting at or after `arrivals[i]`.
    Closed loop: `clients` requests in flight; a finished one is replaced by the next
    request of the workload at the next step (vllm bench serve --max-concurrency).
    The preemption figures are the run's own records (kvreplay.replay.records)."""
    from kvreplay.replay.engine import Engine
    from kvreplay.replay.records import EngineInputs, preemption_records, totals

    if (arrivals is None) == (clients is None):
        raise ValueError("give arrivals (open loop) or clients (closed loop)")
    specs = workload.requests
    n = len(specs)
    engine = Engine(workload, profile, inputs=EngineInputs([-1] * n))
    order = sorted(range(n), key=lambda i: (arrivals[i], i)) if arrivals is not None else list(range(n))
    total = sum(len(s.prompt_token_ids) + s.max_tokens for s in specs)
    cap = max_steps or (50 * total + 10_000)
    k = inflight = 0
    clock = float(arrivals[order[0]]) if arrivals is not None and n else 0.0
    t_first = clock
    issued: dict[str, float] = {}
    first_tok: dict[str, float] = {}
    steps = []
    itl: list[float] = []
    out_tokens = done = 0
    kv_area = busy_time = 0.0
    busy_steps = sched_reqs = 0
    while not engine.done and len(steps) < cap:
        if not engine.has_work():
            if k >= n:
                break
            if arrivals is not None:
                clock = max(clock, float(arrivals[order[k]]))
        if arrivals is not None:
            while k < n and arrivals[order[k]] <= clock:
                i = order[k]
                engine.submit(i)
                issued[specs[i].id] = float(arrivals[i])
                k += 1
        else:
            while inflight < clients and k < n:  # type: ignore[operator]
                engine.submit(k)
                issued[specs[k].id] = clock
                k += 1
                inflight += 1
        rec = engine.step()
        steps.append(rec)
        dt = model.dt_record(rec)
        end = clock + dt
        if rec.num_scheduled:
            busy_steps += 1
            sched_reqs += rec.num_scheduled
            busy_time += dt
            kv_area += dt * rec.kv_usage
        for rid in rec.first_tokens:
            first_tok.setdefault(rid, end)
        out_tokens += rec.generated_tokens
        for rid, m in zip(rec.finished, rec.finished_output_tokens):
            if m > 1 and rid in first_tok:
                itl.append((end - first_tok[rid]) / (m - 1))
        done += len(rec.finished)
        inflight -= len(rec.finished)
        clock = end
    t = totals(steps, preemption_records(steps))
    span = max(1e-9, clock - t_first)
    ttft = [first_tok[r] - issued[r] for r in first_tok if r in issued]
    return {
        "preemptions": t.preemptions, "self_preemptions": t.self_preemptions,
        "requests_preempted": t.requests_preempted,
        "recomputed_tokens": t.tokens_recomputed, "processed_tokens": t.processed_tokens,
        "recompute_ratio": M.rnd(t.recompute_ratio, 6) if t.processed_tokens else None,
        "output_tokens": out_tokens, "makespan_s": round(span, 3),
        "output_tput": round(out_tokens / span, 2), "requests_per_s": round(done / span, 4),
        "ttft_p50_s": M.rnd(M.quantile(ttft, 0.5)), "ttft_p95_s": M.rnd(M.quantile(ttft, 0.95)),
        "itl_p50_s": M.rnd(M.quantile(itl, 0.5), 5), "itl_p95_s": M.rnd(M.quantile(itl, 0.95), 5),
        "kv_usage_mean": M.rnd(kv_area / busy_time) if busy_time > 0 else None,
        "completed": done, "requests": n, "steps": len(steps),
        "batch_mean": round(sched_reqs / busy_steps, 2) if busy_steps else None,
    }


def _arrivals_for(ctx: Context, model: Any, wl: Any, facts: Any, early: bool = False,
                  variant: tuple[Any, list[int], list[Any], Any] | None = None) -> list[float]:
    from kvreplay.inference.runs import arrival_times

    if ctx.arrival_steps is None:
        return arrival_times(facts, *ctx.placement)
    if variant is not None:
        full = timed_arrivals(ctx, model, arrival_steps=variant[1], steps=variant[2])
    else:
        full = timed_arrivals(ctx, model, early=early)
    if len(wl.requests) == len(ctx.workload.requests):
        return full
    pos = {s.id: i for i, s in enumerate(ctx.workload.requests)}
    return [full[pos[s.id]] for s in wl.requests]


def run_one(ctx: Context, setting: Setting, clients: int | None) -> dict[str, Any]:
    """One row: the setting replayed open loop (clients None) or closed loop, with the
    fitted step-time model; then with each model the log allows (ctx.members), whose
    spread is the row's interval."""
    row: dict[str, Any] = {"setting": setting.label, "concurrency": clients}
    row.update({k: setting.overrides.get(k) for k in KNOBS})
    try:
        wl, facts, notes = configure(ctx, setting)
    except ValueError as exc:
        row["note"] = str(exc)
        return row

    def go(model: Any, early: bool = False, variant: Any = None) -> dict[str, Any]:
        w, f = wl, facts
        if variant is not None and variant[3] is not None:  # the member's own workload
            w, f, _ = configure(ctx, setting, variant[3])
        if clients is None:
            return drive(w, ctx.profile, model,
                         arrivals=_arrivals_for(ctx, model, w, f, early, variant))
        return drive(w, ctx.profile, model, clients=clients)

    res = go(ctx.model)
    row.update(res)
    if ctx.variants:
        # the interval: the runs the log allows (a step-time model, and on a thin log an
        # ensemble member's arrivals), and (open loop) the arrivals at the other end of
        # their steps
        runs = [res] + [go(v[0], variant=v) for v in ctx.variants]
        if clients is None:
            runs.append(go(ctx.model, early=True))
        pre = [r["preemptions"] for r in runs]
        tput = [r["output_tput"] for r in runs]
        if ctx.thin:
            # The log cannot pin the arrivals, and the count swings with a step's shift of
            # a few of them: the median run of those the log allows is the better answer
            # (on the what-if corpus's stats-line logs 146 of 200 rows right, the
            # replay's own arrivals 133; docs/accuracy.md). The row is that run, whole.
            k = median_run(pre, tput)
            if k:
                row.update(runs[k])
                # as logged, one value: the row's (the replay's own run is the report's)
                notes.append(f"the median of the {len(runs)} runs the log allows" + (
                    "" if not setting.overrides else
                    f"; with the replay's own arrivals: {res['preemptions']} preemptions, "
                    f"{res['output_tput']:,.0f} tok/s"))
        row["preemptions_interval"] = [min(pre), max(pre)]
        t = row["output_tput"]
        e = ctx.form_error * t  # what the model's fit misses, around the row's own run
        row["output_tput_interval"] = [round(min(min(tput), t - e), 2), round(max(max(tput), t + e), 2)]
        row["output_tput_draws"] = tput
        row["preemptions_draws"] = pre
        row["preemptions_range"] = f"{min(pre)}-{max(pre)}"
        row["output_tput_range"] = "{:,.0f}-{:,.0f}".format(*row["output_tput_interval"])
        row["trust"] = trust(ctx, row)
    elif ctx.fit_source == ESTIMATED:
        row["trust"] = ("uncertain: the log has no prompts; their lengths, and so every run "
                        "here, are estimates (no ranges: no ensemble and no drawn models)")
    if res["completed"] < len(wl.requests):
        notes.append(f"only {res['completed']} of {len(wl.requests)} requests finished within the step cap")
    row["note"] = "; ".join(notes) or None
    return row


def median_run(pre: Sequence[int], tput: Sequence[float]) -> int:
    """The run nearest the median preemption count, then the median throughput (then the
    first: the replay's own arrivals come first)."""
    mp, mt = statistics.median(pre), statistics.median(tput)
    return min(range(len(pre)), key=lambda i: (abs(pre[i] - mp), abs(tput[i] - mt), i))


# ---------------------------------------------------------------- sweep
_CTX: Context | None = None


def _task(args: tuple[int, int | None, list[Setting]]) -> dict[str, Any]:
    i, clients, settings = args
    assert _CTX is not None
    return run_one(_CTX, settings[i], clients)


def _init(ctx: Context) -> None:
    global _CTX
    _CTX = ctx


def fan_out(ctx: Any, base: Any, settings: list[Setting], concurrency: Sequence[int] | None,
            jobs: int | None, init: Any, task: Any) -> tuple[list[Setting], list[Any]]:
    """Every setting (x every concurrency) run by `task` after `init(ctx)`, in this process
    or a pool; a setting equal to the logged config is labelled so. Rows in a fixed order
    whatever the jobs."""
    settings = [s if not s.overrides or any(getattr(base, KNOBS[k]) != v for k, v in s.overrides.items())
                else Setting(s.label + " (= logged)", s.overrides) for s in settings]
    conc: list[int | None] = list(concurrency) if concurrency else [None]
    tasks = [(i, c, settings) for i in range(len(settings)) for c in conc]
    jobs = jobs or min(len(tasks), os.cpu_count() or 1)
    if jobs <= 1 or len(tasks) <= 1:
        init(ctx)
        return settings, [task(t) for t in tasks]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context(method),
                             initializer=init, initargs=(ctx,)) as ex:
        return settings, list(ex.map(task, tasks, chunksize=1))


def sweep(ctx: Context, settings: list[Setting], concurrency: Sequence[int] | None = None,
          *, jobs: int | None = None) -> dict[str, Any]:
    """Every setting (x every concurrency); rows in a fixed order whatever the jobs."""
    settings, rows = fan_out(ctx, ctx.workload.config, settings, concurrency, jobs, _init, _task)
    knees = knees_of(rows) if concurrency else []
    if concurrency:
        mode = ("closed loop: N clients, each sending the log's next request as soon as its "
                "previous one finished (vllm bench serve --max-concurrency N); "
                f"{len(ctx.workload.requests)} requests")
    else:
        mode = (f"open loop: the log's {len(ctx.workload.requests)} requests at their "
                "logged arrival times; times simulated with the step-time model")
    out = {"log": ctx.log, "model": ctx.model.describe(), "fit": ctx.fit_text, "mode": mode,
           "notes": ctx.notes, "rows": rows, "knees": knees}
    if not concurrency:
        k = sweep_knee(rows, "max_num_seqs", ctx.workload.config.max_num_seqs, KNOBS)
        if k is not None:
            out["seqs_knee"] = k
    return out


def knees_of(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    settings = list(dict.fromkeys(r["setting"] for r in rows if r.get("concurrency") is not None))
    for s in settings:
        pts = [(r["concurrency"], r.get("output_tput")) for r in rows
               if r["setting"] == s and r.get("output_tput") is not None]
        if not pts:
            out.append({"setting": s, "knee": None, "text": f"{s}: no runs"})
            continue
        k = M.knee(pts)
        top = max(c for c, _ in pts)
        if k["knee"] == top and k["peak"] == top and len(pts) > 1:
            text = (f"{s}: throughput still rises at the largest concurrency tried ({top}: "
                    f"{k['peak_throughput']:,.0f} tok/s): the knee is beyond it")
        else:
            text = (f"{s}: knee at {k['knee']} clients (the lowest reaching 90% of the peak "
                    f"{k['peak_throughput']:,.0f} tok/s, at {k['peak']})")
            if k["falls_after"] is not None:
                text += f"; throughput falls past {k['peak']} (at {k['falls_after']})"
        out.append({"setting": s, **k, "text": text})
    if len(out) > 1 and out[0].get("knee") is not None:
        base = out[0]["knee"]
        moved = [f"{o['setting']} -> {o['knee']}" for o in out[1:] if o.get("knee") not in (None, base)]
        if moved:
            out.append({"setting": None, "knee": None,
                        "text": f"the knee moves from {base} (as logged): " + ", ".join(moved)})
        else:
            out.append({"setting": None, "knee": None,
                        "text": f"the knee stays at {base} under every setting tried"})
    return out
