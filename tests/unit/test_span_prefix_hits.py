"""span_prefix.span_hits: a request's prefix-cache hit read from its span's prefill window
(F - S) priced by the step-time model; groups_from_hits: a sharing that gives each request
its hit. The expected hits are written by hand from the durations built here, not taken
from the code under test."""

from __future__ import annotations

from types import SimpleNamespace

from kvreplay.inference.clock import StepTimeModel
from kvreplay.inference.span_clock import SpanMarks
from kvreplay.inference.span_prefix import groups_from_hits, span_hits
from kvreplay.replay.records import Admission, StepRecord

MODEL = StepTimeModel(overhead_s=0.0015, per_token_s=4e-5, per_request_s=5e-5,
                      per_context_token_s=4e-8, token_floor=120)


def _case(real_hit: int, *, co_admitted: bool = False, start_off: float = 0.0,
          extra_s: float = 0.0):
    """Step 0: 10 decodes (context 5,000) and request r0's whole 1,000-token prompt, which
    the run computes entirely (hit 0); the real step computed 1,000 - real_hit of it."""
    adm = [Admission("r0", 0, 1000, False)]
    toks, reqs = 1010, 11
    if co_admitted:
        adm.append(Admission("r1", 0, 200, False))
        toks, reqs = 1210, 12
    rec0 = StepRecord(step=0, num_scheduled=reqs, num_scheduled_tokens=toks,
                      context_tokens=5000, admitted=adm, first_tokens=["r0"])
    rec1 = StepRecord(step=1, num_scheduled=reqs, num_scheduled_tokens=reqs,
                      context_tokens=6000)
    real = MODEL.dt(toks - real_hit, reqs, 5000 + real_hit) + extra_s
    s = 100.0
    marks = SpanMarks(entry=[s, s], scheduled=[s, s], first_token=[s + real, s + real],
                      last_token=[None, None], bounds=[], has_span=[True, True])
    run = SimpleNamespace(steps=[rec0, rec1], clock=[s + start_off, s + real])
    specs = [SimpleNamespace(id="r0", prompt_token_ids=list(range(1000))),
             SimpleNamespace(id="r1", prompt_token_ids=list(range(200)))]
    rebuilt = SimpleNamespace(workload=SimpleNamespace(requests=specs,
                                                       config=SimpleNamespace(block_size=16)))
    return run, rebuilt, marks


def test_hit_read_from_the_prefill_window():
    for real in (0, 16, 320, 864):
        run, rb, marks = _case(real)
        assert span_hits(run, rb, marks, MODEL)[0] == real
    # 976 cached: the real step scheduled 34 tokens, under the 120-token floor, and cost
    # the floor's price whatever its tokens: the window does not say
    assert span_hits(*_case(976)[:3], MODEL)[0] is None
    # r1 was never admitted in this run: nothing said about it
    assert span_hits(*_case(320)[:3], MODEL)[1] is None


def test_no_hit_where_the_window_does_not_say():
    # two first admissions in the step: the gap is their sum
    run, rb, marks = _case(320, co_admitted=True)
    assert span_hits(run, rb, marks, MODEL)[0] is None
    # the run's step does not start at the span's S
    run, rb, marks = _case(320, start_off=0.003)
    assert span_hits(run, rb, marks, MODEL)[0] is None
    # the real prefill took longer than the whole prompt costs (another step): not a hit
    run, rb, marks = _case(0, extra_s=0.02)
    assert span_hits(run, rb, marks, MODEL)[0] is None


def test_groups_from_hits():
    n = 6
    t = [float(i) for i in range(n)]
    marks = SpanMarks(entry=t, scheduled=t, first_token=[x + 0.5 for x in t],
                      last_token=[None] * n, bounds=[], has_span=[True] * n)
    hits = [0, 0, 320, 320, None, 160]
    lengths = [1000, 200, 900, 800, 700, 600]
    group, sizes = groups_from_hits(hits, lengths, marks, 16)
    # request 1 (200 tokens) cannot hold a 320-token prefix: request 0 founded it
    assert group[2] == group[3] == group[0] != 0 and sizes[group[2]] == 320
    # ... but holds the 160-token prefix request 5 finds
    assert group[1] == group[5] not in (0, group[2]) and sizes[group[5]] == 160
    assert group[4] == 0  # an unknown hit shares with none


def test_unread_hits_take_the_latest_read_one_the_prompt_holds():
    from kvreplay.inference.span_prefix import filled

    n = 5
    t = [float(i) for i in range(n)]
    marks = SpanMarks(entry=t, scheduled=t, first_token=t, last_token=[None] * n, bounds=[],
                      has_span=[True] * n)
    lens = [1000, 900, 800, 200, 700]
    base = SimpleNamespace(workload=SimpleNamespace(
        requests=[SimpleNamespace(prompt_token_ids=list(range(k))) for k in lens]))
    # requests 2 and 4 take 320 (the latest read); request 3's 200 tokens cannot hold it
    assert filled([0, 320, None, None, None], base, marks) == [0, 320, 320, 0, 320]
    # ... but hold the earlier 160; a read 0 stays 0, and is not a prefix to take
    assert filled([0, 160, 320, None, 0], base, marks) == [0, 160, 320, 160, 0]
    assert filled([None, 0, 480, None, None],
                  SimpleNamespace(workload=SimpleNamespace(requests=[
                      SimpleNamespace(prompt_token_ids=list(range(k)))
                      for k in (1000, 900, 800, 300, 700)])), marks) == [0, 0, 480, 0, 480]


def test_envelope_model_recovers_the_price_the_guessed_hits_hide():
    """A run that gave every prompt hit 0 when half the real ones hit 320 tokens, and a
    model 20% cheap per token (what a fit over the guessed hits gives): hit_model finds the
    render's model again from the windows that computed their whole prompt and the single
    decode steps, and the hits read with it are the real ones."""
    import random

    from kvreplay.inference.span_prefix import hit_model

    rng = random.Random(5)
    steps, clock, specs, real_hits = [], [], [], []
    sched, first = [], []
    t = 100.0
    for i in range(14):
        n = rng.randrange(500, 1500)
        d = rng.randrange(10, 40)  # decodes running beside it
        ctx = rng.randrange(2000, 30000)
        h = 320 if i % 2 else 0
        rid = f"r{i}"
        pre = StepRecord(step=len(steps), num_scheduled=d + 1, num_scheduled_tokens=n + d,
                         context_tokens=ctx, admitted=[Admission(rid, 0, n, False)],
                         first_tokens=[rid])
        dur = MODEL.dt(n - h + d, d + 1, ctx + h)
        steps.append(pre)
        clock.append(t)
        sched.append(t)
        first.append(t + dur)
        t += dur
        dec = StepRecord(step=len(steps), num_scheduled=d + 1, num_scheduled_tokens=d + 1,
                         context_tokens=ctx + n)
        steps.append(dec)
        clock.append(t)
        t += MODEL.dt(d + 1, d + 1, ctx + n)
        specs.append(SimpleNamespace(id=rid, prompt_token_ids=list(range(n))))
        real_hits.append(h)
    steps.append(StepRecord(step=len(steps)))
    clock.append(t)
    marks = SpanMarks(entry=sched, scheduled=sched, first_token=first,
                      last_token=[None] * len(sched), bounds=sorted(clock), has_span=[True] * len(sched))
    run = SimpleNamespace(steps=steps, clock=clock)
    rebuilt = SimpleNamespace(workload=SimpleNamespace(requests=specs,
                                                       config=SimpleNamespace(block_size=16)))
    wrong = StepTimeModel(0.004, 3.2e-5, 0.0, 8e-8, 32)
    hm = hit_model(run, rebuilt, marks, wrong)
    assert abs(hm.per_token_s - MODEL.per_token_s) < 1e-7
    assert hm.token_floor == MODEL.token_floor
    assert span_hits(run, rebuilt, marks, hm) == real_hits
    # the wrong model reads other hits (the error a cheap token puts in every one)
    assert span_hits(run, rebuilt, marks, wrong) != real_hits
