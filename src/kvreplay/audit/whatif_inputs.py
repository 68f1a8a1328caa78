"""What every what-if run of a log shares: the log's replay, its arrivals, the step-time
model fitted term by term, and the runs the log allows (for the rows' ranges).

`load` opens the replay once (kvreplay.sources.open_replay); audit/whatif_replays.py runs the
settings on it. Each request arrives at the start of its step in the base replay, timed by
the model in use (`timed_arrivals`): as logged, a what-if run is that replay again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence


@dataclass(slots=True)
class Context:
    """What every what-if run shares: the replay's workload, facts and step-time model."""

    log: str
    workload: Any
    facts: Any
    profile: Any
    model: Any
    placement: tuple[float, float]
    fit_text: str
    notes: list[str]
    # the base replay: its arrival step per request and its steps (Replay.inputs, .steps);
    # with them each request arrives at the time its step starts under the model in use
    arrival_steps: list[int] | None = None
    base_steps: list[Any] | None = None
    start: float = 0.0
    members: list[Any] = field(default_factory=list)  # models the log allows (intervals)
    # (model, arrival steps, steps, workload) of each run an interval takes: a model the log
    # allows with the replay's arrivals, or (a thin log) an ensemble member's arrivals with
    # one; workload None: the replay's, else the member's own (prompts it drew)
    variants: list[tuple[Any, list[int], list[Any], Any]] = field(default_factory=list)
    batch_range: tuple[float, float] | None = None  # scheduled requests a step, as fitted
    form_error: float = 0.0  # step_model.FittedModel.form_error: widens throughput intervals
    fit_source: str = "stats lines"
    # the variants are ensemble members: the log does not pin the arrivals to their steps,
    # and a row is the median of its runs (audit/whatif_replays.py run_one), not the replay's run
    thin: bool = False
    # base step -> its wall-clock start, for a step that waited for a request after the
    # engine ran dry (step traces: step_model.restart), whatever the model; the model
    # times the busy stretches
    restarts: dict[int, float] = field(default_factory=dict)


DRAWS = 6  # step-time models drawn for a row's interval (inference/step_model.py)
ESTIMATED = "stats lines (prompts estimated)"
ENSEMBLE_RUNS = 8  # ensemble members re-run under each setting (a log that cannot pin arrivals)


def load(paths: Sequence[str], *, profile: str | None = None, year: int | None = None,
         draws: int = DRAWS, samples: int | None = None, log: Any = None) -> Context:
    """The log's replay (kvreplay.sources.open_replay): its workload, its steps and their
    arrivals, and the step-time model fitted term by term on what the log times
    (inference/step_model.py: iteration lines, else stats lines and request spans; a
    step trace: its lines' seconds, _load_step_trace)."""
    from kvreplay.errors import UserError
    from kvreplay.inference.ensemble import member_workload
    from kvreplay.inference.formats import log_format
    from kvreplay.inference.step_model import fit_step_model
    from kvreplay.sources import open_replay

    rp = open_replay(list(paths), profile=profile, year=year, samples=samples, log=log)
    if rp.kind == "step-trace":
        return _load_step_trace(rp, paths, draws)
    if rp.facts is None or rp.step_time_model is None:
        raise UserError("what-if replays a server log's requests at their logged times: give "
                        "a vLLM log (a workload has no logged times)")
    if rp.engine_name != "V1":
        raise UserError("what-if runs the V1 scheduler; this log comes from the V0 engine")
    ver = rp.verification
    fit_text = f"loss {rp.info.fit_loss or 0.0:.3g}"
    if ver is not None and ver.stats_lines:
        fit_text += f", {ver.agreeing_lines}/{ver.stats_lines} stats lines agree with the replay"
    notes = list(rp.notes[: len(rp.notes) - len(rp.facts.notes)] if rp.facts.notes else rp.notes)
    if rp.info.prompts == "estimated":
        notes.append("prompt lengths are estimated (not in the log): prefix caching cannot be judged")
    fmt = log_format(rp.facts.vllm_version, rp.facts.engine_version, profile)
    fm = fit_step_model(rp.steps, rp.facts, fmt, rp.clock, draws=draws)
    model, members, batch, source = rp.step_time_model, [], None, "the replay's fit"
    form_error = fm.form_error if fm is not None else 0.0
    estimated = rp.info.prompts == "estimated"
    if estimated and fm is not None and fm.source != "iteration lines":
        # the rows' token counts are estimates: the split between the per-token and the
        # per-request terms is not the log's; keep the model the replay fitted with the
        # prompt lengths (measured on p1 without prompts: throughput within 9%, the
        # term-wise fit 15%, docs/accuracy.md); the term-wise fit's models still time the
        # interval's runs: where the two disagree, so does the interval
        fit_text = f"the log replay's stats lines, prompts estimated ({fit_text})"
        batch, source, members, fm = fm.batch_range, ESTIMATED, fm.members, None
    elif fm is None:
        fit_text = f"the log replay's stats lines ({fit_text})"
    else:
        model, members, batch, source = fm.model, fm.members, fm.batch_range, fm.source
        fit_text = (f"{source}: {fm.rows} rows, residual {fm.rms_s * 1e3:.3g} ms a row; "
                    f"replay {fit_text}")
    placement = rp.info.placement
    placement = tuple(placement) if isinstance(placement, (list, tuple)) else (0.0, 0.0)
    start = rp.clock[0] if rp.clock else 0.0
    ctx = Context("+".join(paths), rp.workload, rp.facts, rp.profile, model,
                  placement, fit_text, notes,  # type: ignore[arg-type]
                  arrival_steps=list(rp.inputs.arrival_steps), base_steps=rp.steps,
                  start=start, members=members, batch_range=batch, fit_source=source,
                  form_error=form_error)
    ens = ensemble_members(rp)
    if ens:
        ctx.variants = []
        own: dict[int, Any] = {}  # a member drawn twice rebuilds its workload once
        for j, m in enumerate(ens):
            wl = None
            if m.prompt_lens is not None or m.priorities is not None:
                if id(m) not in own:
                    shared = (m.shared_prefix if m.shared_prefix is not None
                              else rp.uncertainty.shared_prefix)
                    own[id(m)] = member_workload(rp.facts, fmt, rp.profile, m.prompt_lens,
                                                 shared, m.priorities).workload
                wl = own[id(m)]
            arr = list(m.arrival_steps)
            # (estimated prompts too: each member timed by one of the term-wise fit's models.
            # Timed by the replay's model instead, 97 of the corpus's 200 rows were right
            # against 120, although p1 gave 3/5 against 1/5; docs/accuracy.md)
            ctx.variants.append((members[j % len(members)] if members else model, arr,
                                 _steps_of(wl if wl is not None else rp.workload, rp.profile, arr), wl))
        ctx.thin = True
        ctx.notes.append(f"intervals: {len(ens)} members of the uncertainty ensemble (arrival "
                         "steps the stats lines allow" + (", prompt lengths drawn around the "
                         "estimate" if own else "") + "), each with a step-time model the log allows")
    else:
        ctx.variants = [(m, ctx.arrival_steps, rp.steps, None) for m in members]
    return ctx


def _load_step_trace(rp: Any, paths: Sequence[str], draws: int) -> Context:
    """A step-trace log (inference/step_trace.py): the arrival steps are the log's own and
    every step is checked, so the base run is exact; the step-time model is fitted on the
    step lines' seconds (step_model.stamp_rows) and its members give the intervals (no
    ensemble: nothing about the arrivals is left open)."""
    import dataclasses

    from kvreplay.errors import UserError
    from kvreplay.inference.runs import step_limit
    from kvreplay.inference.step_model import STAMPS, fit_step_model, restart

    if rp.engine_name != "V1":
        raise UserError("what-if runs the V1 scheduler; this log comes from the V0 engine")
    if rp.stamps is None:
        raise UserError("the step trace's lines carry no time stamps (vLLM's envelope): "
                        "what-if needs the seconds they were written in")
    fm = fit_step_model(rp.steps, None, None, None, stamps=rp.stamps, draws=draws)
    if fm is None or rp.clock is None:
        raise UserError("the step trace's lines time too few busy seconds to fit a step "
                        "time (what-if needs at least 5)")
    chk = rp.step_check
    checked = f"{chk.steps_checked}/{chk.steps_logged}" if chk is not None else "0/0"
    fit_text = (f"{STAMPS}: {fm.rows} rows, residual {fm.rms_s * 1e3:.3g} ms a row; replay "
                f"exact, {checked} steps checked")
    notes = list(rp.notes)
    div = chk.first_divergence if chk is not None else None
    if div is not None:
        notes.append(f"the replay differs from the log at step {div.step} ({div.field}): "
                     "the base run is the log's only up to there")
    # the rebuilt workload ends where the log ends (max_steps); a what-if runs every
    # request to completion
    wl = dataclasses.replace(rp.workload, max_steps=step_limit(rp.workload))
    ctx = Context("+".join(paths), wl, None, rp.profile, fm.model, (0.0, 0.0),
                  fit_text, notes, arrival_steps=list(rp.inputs.arrival_steps),
                  base_steps=rp.steps, start=rp.clock[0], members=fm.members,
                  batch_range=fm.batch_range, fit_source=STAMPS, form_error=fm.form_error)
    ctx.variants = [(m, ctx.arrival_steps, rp.steps, None) for m in fm.members]
    ctx.restarts = {k: rp.clock[k] for k in range(1, len(rp.steps)) if restart(rp.steps, k)}
    return ctx


def ensemble_members(rp: Any, k: int = ENSEMBLE_RUNS) -> list[Any]:
    """k members of the replay's uncertainty ensemble (inference/ensemble.py), drawn by
    their weights (systematic resampling, deterministic); [] without an ensemble."""
    u = rp.uncertainty
    ms = [m for m in (u.members if u is not None else []) if m.arrival_steps is not None]
    total = sum(m.weight for m in ms)
    if not ms or total <= 0:
        return []
    out, acc, j = [], 0.0, 0
    for m in ms:
        acc += m.weight / total
        while j < k and (j + 0.5) / k <= acc:
            out.append(m)
            j += 1
    return out


def _steps_of(workload: Any, profile: Any, arrival_steps: list[int]) -> list[Any]:
    """The steps of a workload with these arrival steps (to time the arrivals)."""
    from kvreplay.inference.runs import step_limit
    from kvreplay.replay.engine import Engine
    from kvreplay.replay.records import EngineInputs

    eng = Engine(workload, profile, inputs=EngineInputs(list(arrival_steps)))
    cap = step_limit(workload)
    steps = []
    while not eng.done and len(steps) < cap:
        steps.append(eng.step())
    return steps


def timed_arrivals(ctx: Context, model: Any, *, early: bool = False,
                   arrival_steps: list[int] | None = None, steps: list[Any] | None = None) -> list[float]:
    """Request i's arrival: the start of its step in the base replay with the steps timed
    by `model`, less a little (0.5 ms, or a quarter of the step before): under the logged
    setting the run is the base replay again; under another, each request comes at the
    same time and the engine takes it at its first step starting after. The log pins an
    arrival only to the step before it (it came while that step ran): `early` puts each
    at that step's start instead, the other end of what the log allows."""
    arrival_steps = arrival_steps if arrival_steps is not None else ctx.arrival_steps
    steps = steps if steps is not None else ctx.base_steps
    assert arrival_steps is not None and steps is not None
    restarts = ctx.restarts if steps is ctx.base_steps else {}
    cum = [ctx.start]
    for k, rec in enumerate(steps):
        cum[k] = max(cum[k], restarts.get(k, cum[k]))
        cum.append(cum[-1] + model.dt_record(rec))
    out = []
    for a in arrival_steps:
        a = min(max(a, 0), len(cum) - 1)
        before = cum[a] - cum[a - 1] if a > 0 else (cum[1] - cum[0] if len(cum) > 1 else 0.0)
        if early and a > 0 and a not in restarts:  # (a restart: its request woke the engine)
            out.append(cum[a - 1] + min(5e-4, before / 4))
        else:
            out.append(cum[a] - min(5e-4, before / 4))
    return out
