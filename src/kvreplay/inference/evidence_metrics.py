"""Evidence from the counters a server keeps: the periodic stats lines of a default log
(no request lines), the access lines, and the Prometheus scrapes of `/metrics`.

One module of the evidence protocol (one per kind of evidence), in three parts:
- what it says about the run: `arrivals` (requests per stats interval: the change of
  running + waiting plus the access lines in between), `lengths` (the length histograms
  when scraped, else the token totals), `step_time` (a first step-time model from the
  tokens per interval), `counted` (the preemption counter's increase over the log, exact
  when scrapes bound every busy second), `cache_share` (the prefix cache's hits over its
  queries, first admissions only);
- how a run produces it (`render`: the counters at given times from a run's per-step
  records, with the semantics of vLLM's PrometheusStatLogger: a step's counts are visible
  once its output is processed, at the step's end; gauges are the last finished step's
  scheduler stats; request histograms are observed at each finish);
- how a run is checked against it (`check`: per stats line and per scrape, replayed
  against logged; `loss`, the weight a run gets in an ensemble).

Scrapes come in as `CounterPoint`s on the log's clock (the front end reads the files).
"""

from __future__ import annotations

import bisect
import math
from array import array
from typing import Any, Iterator, Sequence

import msgspec

from kvreplay.inference.columns import Table
from kvreplay.replay.records import StepRecord


class CounterPoint(msgspec.Struct, frozen=True):
    """One scrape: cumulative counters and gauges at time `t` (the log's clock)."""

    t: float
    preemptions: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    finished: float | None = None
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None  # fraction
    # cumulative histogram buckets: (le, count), observed at each finish
    prompt_len: tuple[tuple[float, float], ...] = ()
    output_len: tuple[tuple[float, float], ...] = ()
    # vllm:prefix_cache_queries / _hits (tokens): counted once per request, at its first
    # admission (0.27+: record_prefix_cache_stats; a readmitted victim goes to the
    # preempted_* fields, not these; spec A10)
    cache_queries: float | None = None
    cache_hits: float | None = None


class StatsWindow(msgspec.Struct, frozen=True):
    """One stats line: the interval (t0, t1] it covers and what it printed."""

    t0: float
    t1: float
    prompt_tokens: float
    gen_tokens: float
    running: int
    waiting: int
    kv_usage: float  # fraction
    finishes: int  # access lines written in the interval
    arrivals: int  # requests that must have arrived in it (see `arrivals`)


class MetricsEvidence(msgspec.Struct):
    # one per stats line: a columns.Table (from_stats: ~60 bytes a line, not an object of
    # ~200); read a field of all of them with `column`
    windows: Sequence[StatsWindow]
    scrapes: list[CounterPoint]
    interval_s: float
    late_finishes: int  # access lines after the last stats line
    late_arrivals: int  # requests that arrived after the last stats line
    # the preemption counter's increase over the scrapes bounding the log, and whether they
    # bound every busy second (then it is the log's count, exactly)
    counted: int | None = None
    counted_exact: bool = False
    counted_until: float | None = None  # the last scrape's time (after it: not counted)

    def column(self, name: str) -> Sequence[Any]:
        """One field of every window, in order (a Table's column: no window is made)."""
        w = self.windows
        return w.column(name) if isinstance(w, Table) else [getattr(x, name) for x in w]

    @property
    def requests(self) -> int:
        return sum(self.column("arrivals")) + self.late_arrivals

    def lengths(self) -> tuple[list[tuple[float, float]] | None, list[tuple[float, float]] | None]:
        """The prompt and output length histograms (bucket increases over the scrapes), or None."""
        return _hist_increase(self.scrapes, "prompt_len"), _hist_increase(self.scrapes, "output_len")

    def cache_share(self) -> float | None:
        """The prefix cache's hit share of the prompt tokens first admitted over the scrapes
        (hits / queries increase), or None: not scraped, or nothing queried (prefix
        caching off, or no admission between the scrapes)."""
        q = _increase(self.scrapes, "cache_queries")
        h = _increase(self.scrapes, "cache_hits")
        if q is None or h is None or q <= 0:
            return None
        return max(0.0, min(1.0, h / q))

    def totals(self) -> tuple[float, float]:
        """Prompt and generation tokens the engine counted over the log (stats lines)."""
        return (sum(self.column("prompt_tokens")), sum(self.column("gen_tokens")))


def from_stats(stats: Sequence[Any], completions_before: Sequence[int], total_completions: int,
               interval_s: float, scrapes: Sequence[CounterPoint] = ()) -> MetricsEvidence:
    """The evidence of a log's stats lines (`StatsPoint`s with their access-line counts) and
    of scrapes already on the log's clock."""
    windows: Table[StatsWindow] = Table(StatsWindow)
    prev_in, prev_done, prev_t = 0, 0, None
    for s, done in zip(stats, completions_before):
        t1 = float(s.time)
        t0 = prev_t if prev_t is not None else t1 - interval_s
        running, waiting = int(s.running or 0), int(s.waiting or 0)
        fin = done - prev_done
        # every request that arrived is running, waiting, or has finished (an access line)
        arr = max(0, running + waiting - prev_in + fin)
        windows.append(StatsWindow(t0, t1, (s.prompt_throughput or 0.0) * (t1 - t0),
                                   (s.generation_throughput or 0.0) * (t1 - t0), running, waiting,
                                   (s.kv_usage or 0.0), fin, arr))
        prev_in, prev_done, prev_t = running + waiting, done, t1
    late_fin = total_completions - prev_done
    ev = MetricsEvidence(windows, list(scrapes), interval_s, late_fin, max(0, late_fin - prev_in))
    _count(ev)
    return ev


def _count(ev: MetricsEvidence) -> None:
    """The preemption counter over the log: from the last scrape before its first busy
    second to the first after its last; exact when both exist. A scrape whose counters are
    all still zero comes before any work; one that shows an idle engine (nothing running or
    waiting) after the last line that showed load comes after all of it (a victim waits
    until it is counted)."""
    pts = [p for p in ev.scrapes if p.preemptions is not None]
    if len(pts) < 2:
        return
    run, wait, gen, pro, t1s = (ev.column(k) for k in ("running", "waiting", "gen_tokens",
                                                         "prompt_tokens", "t1"))
    n = len(t1s)
    first = next((k for k in range(n) if run[k] or wait[k] or gen[k] or pro[k]), None)
    if first is None:
        return
    last = next(k for k in range(n - 1, -1, -1) if run[k] or wait[k] or gen[k] or pro[k])
    first_busy = ev.column("t0")[first]
    first_busy_t1 = t1s[first]
    last_busy = t1s[last]
    if run[last] or wait[last]:  # still busy at its line: until the next one
        last_busy = next((t for t in t1s if t > last_busy), math.inf)
    loaded = next((k for k in range(n - 1, -1, -1) if run[k] or wait[k]), None)
    last_load = t1s[loaded] if loaded is not None else first_busy

    def fresh(p: CounterPoint) -> bool:
        return not p.preemptions and not p.prompt_tokens and not p.generation_tokens

    def idle(p: CounterPoint) -> bool:
        return p.running == 0 and p.waiting == 0

    before = [p for p in pts if p.t <= first_busy or (fresh(p) and p.t <= first_busy_t1)]
    after = [p for p in pts if p.t >= last_busy or (idle(p) and p.t >= last_load)]
    lo = before[-1] if before else pts[0]
    hi = after[0] if after else pts[-1]
    inc = 0.0
    seq = [p for p in pts if lo.t <= p.t <= hi.t]
    for a, b in zip(seq, seq[1:]):
        inc += (b.preemptions - a.preemptions) if b.preemptions >= a.preemptions else b.preemptions
    ev.counted = int(round(inc))
    ev.counted_exact = bool(before) and bool(after)
    ev.counted_until = None if after else hi.t


def _increase(scrapes: Sequence[CounterPoint], key: str) -> float | None:
    """A counter's increase over the scrapes (a counter that went down was reset: its new
    value is that window's increase), or None when fewer than two scrapes have it."""
    vs = [getattr(p, key) for p in scrapes if getattr(p, key) is not None]
    if len(vs) < 2:
        return None
    return sum(_window_increase(a, b) for a, b in zip(vs, vs[1:]))


def _window_increase(a: float, b: float) -> float:
    return b - a if b >= a else b


def _hist_increase(scrapes: Sequence[CounterPoint], key: str) -> list[tuple[float, float]] | None:
    hs = [dict(getattr(p, key)) for p in scrapes if getattr(p, key)]
    if not hs:
        return None
    last, first = hs[-1], (hs[0] if len(hs) > 1 else {})
    if first and any(last.get(le, 0.0) < c for le, c in first.items()):
        first = {}  # a reset: the last scrape's own counts
    out = sorted((le, last[le] - first.get(le, 0.0)) for le in last)
    return out if out and out[-1][1] > 0 else None


def draw_from_hist(buckets: Sequence[tuple[float, float]], n: int, rng: Any, cap: int) -> list[int]:
    """n lengths from a cumulative histogram: a bucket by its count, uniform inside it (the
    last, open bucket: up to twice its lower bound, at most `cap`)."""
    edges = [(0.0, 0.0)] + list(buckets)
    cells = []
    for (lo, c0), (hi, c1) in zip(edges, edges[1:]):
        if c1 > c0:
            top = min(cap, 2 * lo if math.isinf(hi) else hi)
            cells.append((max(1.0, lo + (1 if lo else 0)), max(1.0, top), c1 - c0))
    total = sum(c for _, _, c in cells)
    if total <= 0:
        return []
    cum, acc = [], 0.0
    for _, _, c in cells:
        acc += c
        cum.append(acc)
    out = []
    for _ in range(n):
        k = min(len(cells) - 1, bisect.bisect_left(cum, rng.random() * total))
        lo, hi, _ = cells[k]
        out.append(int(round(lo + (hi - lo) * rng.random())) if hi > lo else int(lo))
    return out


def _busy_rows(ev: MetricsEvidence) -> tuple[array, array]:
    """Per interval busy throughout (requests running at both its lines, tokens generated):
    (steps per second, tokens per second), steps = generated / mean running; as two
    columns (a long busy log has one row a line)."""
    xs, ys = array("d"), array("d")
    prev_run = 0
    for running, t0, t1, gen, prompt in zip(*(ev.column(k) for k in ("running", "t0", "t1", "gen_tokens",
                                                                      "prompt_tokens"))):
        run = (prev_run + running) / 2.0
        dt = t1 - t0
        if prev_run > 0 and running > 0 and gen > 0 and dt > 0:
            xs.append(gen / run / dt)
            ys.append((prompt + gen) / dt)
        prev_run = running
    return xs, ys


def busy_intervals(ev: MetricsEvidence) -> int:
    """How many stats intervals were busy throughout (what `step_time` fits)."""
    return len(_busy_rows(ev)[0])


def step_time(ev: MetricsEvidence) -> tuple[float, float]:
    """(seconds per step, seconds per token) that fill each fully busy interval: one step
    decodes about `running` requests, so steps = generated / running, and
    interval = steps * a + tokens * b (least squares, both >= 0)."""
    xs, ys = _busy_rows(ev)
    if not xs:
        return 0.02, 0.0
    best = None
    for use_a, use_b in ((1, 1), (1, 0), (0, 1)):
        saa = sum(x * x for x in xs) if use_a else 0.0
        sbb = sum(y * y for y in ys) if use_b else 0.0
        sab = sum(x * y for x, y in zip(xs, ys)) if use_a and use_b else 0.0
        sa = sum(xs) if use_a else 0.0
        sb = sum(ys) if use_b else 0.0
        det = saa * sbb - sab * sab
        if use_a and use_b:
            if abs(det) < 1e-18:
                continue
            a, b = (sa * sbb - sb * sab) / det, (sb * saa - sa * sab) / det
        elif use_a:
            a, b = sa / saa, 0.0
        else:
            a, b = 0.0, sb / sbb
        if a < 0 or b < 0:
            continue
        err = sum((1.0 - a * x - b * y) ** 2 for x, y in zip(xs, ys))
        if best is None or err < best[0]:
            best = (err, a, b)
    if best is None:
        return 0.02, 0.0
    return best[1], best[2]


# ------------------------------------------------------------------ a run -> the evidence
def counted_preemptions(steps: Sequence[StepRecord], budget: int) -> list[int]:
    """Per step, what vllm:num_preemptions_total adds at its end (V1): the frontend counts
    a preemption when the victim's next output arrives, the step that finishes its
    recompute after readmission (one chunk of `budget` tokens a step); a victim never
    readmitted is never counted."""
    from kvreplay.replay.records import preemption_records

    out = [0] * len(steps)
    for p in preemption_records(steps):
        if p.readmission_step is None:
            continue
        need = p.tokens_recomputed if p.tokens_recomputed is not None else p.num_tokens
        k = p.readmission_step + max(0, math.ceil(max(1, need) / max(1, budget)) - 1)
        if k < len(out):
            out[k] += 1
    return out


def render(steps: Sequence[StepRecord], step_end: Sequence[float], times: Sequence[float],
           prompt_lens: dict[str, int] | None = None, budget: int = 8192,
           counted: Sequence[int] | None = None) -> list[CounterPoint]:
    """The counters a scrape at each of `times` would read from a run (PrometheusStatLogger:
    counters add each step's counts when its output is processed, at the step's end; the
    gauges are the last processed step's; request_prompt_tokens / request_generation_tokens
    are observed at each finish; `prompt_lens` gives the prompt lengths by request id;
    `budget`: max_num_batched_tokens; `counted`: `counted_preemptions`, if already made)."""
    if counted is None:
        counted = counted_preemptions(steps, budget)
    return list(_points(steps, step_end, times, prompt_lens, counted, True))


def _points(steps: Sequence[StepRecord], step_end: Sequence[float], times: Sequence[float],
            prompt_lens: dict[str, int] | None, counted: Sequence[int],
            hist: bool) -> Iterator[CounterPoint]:
    """`render`, one point at a time; without the length histograms unless `hist` (a check
    of stats lines needs only the counters and gauges: nothing per line is kept)."""
    pre = pt = gt = fin = cq = ch = 0.0
    k = 0
    last: StepRecord | None = None
    plen: dict[int, float] = {}
    olen: dict[int, float] = {}
    for t in times:
        while k < len(steps) and step_end[k] <= t:
            r = steps[k]
            pre += counted[k]
            pt += r.stats_prompt_tokens
            gt += r.generated_tokens
            fin += len(r.finished)
            for a in r.admitted:  # a first admission's query and hit (not a victim's again)
                if not a.resumed:
                    cq += a.num_tokens
                    ch += a.prefix_hit
            if hist:
                for rid, n in zip(r.finished, r.finished_output_tokens):
                    _observe(olen, n)
                    if prompt_lens is not None and rid in prompt_lens:
                        _observe(plen, prompt_lens[rid])
            last = r
            k += 1
        yield CounterPoint(
            t, pre, pt, gt, fin,
            float(last.num_running) if last else 0.0, float(last.num_waiting) if last else 0.0,
            last.kv_usage if last else 0.0,
            tuple(_cumulative(plen)) if hist and prompt_lens is not None else (),
            tuple(_cumulative(olen)) if hist else (), cq, ch)


# vLLM's request-length buckets (build_1_2_5_buckets up to max_model_len): 1, 2, 5, 10, ...
def length_buckets(max_len: int) -> list[float]:
    out, m = [], 1
    while True:
        for d in (1, 2, 5):
            if d * m > max_len:
                return out + [math.inf]
            out.append(float(d * m))
        m *= 10


_BUCKETS = length_buckets(10**7)


def _observe(h: dict[int, float], v: float) -> None:
    i = bisect.bisect_left(_BUCKETS, v)
    h[i] = h.get(i, 0.0) + 1.0


def _cumulative(h: dict[int, float]) -> list[tuple[float, float]]:
    out, acc = [], 0.0
    top = max(h, default=-1)
    for i in range(top + 1):
        acc += h.get(i, 0.0)
        out.append((_BUCKETS[i], acc))
    out.append((math.inf, acc))
    return out


class Check(msgspec.Struct):
    """A run against the evidence: per stats line and per scrape window, replayed vs logged."""

    lines: list[dict[str, float]]
    scrapes: list[dict[str, float]]
    loss: float  # sum of squared, scaled differences (the ensemble's weight: exp(-loss / 2))


def check(steps: Sequence[StepRecord], step_end: Sequence[float], ev: MetricsEvidence,
          phase: float = 0.5, counted: Sequence[int] | None = None, budget: int = 8192,
          detail: bool = True) -> Check:
    """Each stats line's running/waiting/KV and tokens, each scrape window's counter
    increases, replayed against logged. Scales: a request for counts, 2 KV points, 5% of a
    window's tokens (at least a block), and Poisson noise for the preemption counter.
    `phase`: when within its printed second each stats line was written. Without `detail`
    only the loss (`lines` and `scrapes` empty): memory stays flat in the number of lines."""
    t1s = ev.column("t1")
    times = (t + phase for t in t1s)  # (read once, as they go by)
    if counted is None:
        counted = counted_preemptions(steps, budget)
    pts = _points(steps, step_end, times, None, counted, False)
    lines: list[dict[str, float]] = []
    loss = 0.0
    prev = CounterPoint(t1s[0] + phase - ev.interval_s if t1s else 0.0, 0.0, 0.0, 0.0, 0.0)
    cols = (ev.column(k) for k in ("t1", "running", "waiting", "kv_usage", "prompt_tokens", "gen_tokens"))
    for (t1, running, waiting, kv, prompt, gen), p in zip(zip(*cols), pts):
        d_run, d_wait, d_kv = p.running - running, p.waiting - waiting, (p.kv_usage or 0.0) - kv
        d_prompt = (p.prompt_tokens - prev.prompt_tokens) - prompt
        d_gen = (p.generation_tokens - prev.generation_tokens) - gen
        if detail:
            lines.append({"t": t1, "running": d_run, "waiting": d_wait, "kv": d_kv, "prompt": d_prompt,
                          "gen": d_gen})
        loss += (d_run / 2.0) ** 2 + (d_wait / 3.0) ** 2 + (d_kv / 0.03) ** 2
        loss += (d_prompt / max(0.1 * prompt, 400.0)) ** 2
        loss += (d_gen / max(0.1 * gen, 100.0)) ** 2
        prev = p
    rows = scrape_windows(steps, step_end, ev.scrapes, counted)
    loss += counter_loss(rows)
    return Check(lines, rows if detail else [], loss)


def scrape_windows(steps: Sequence[StepRecord], step_end: Sequence[float],
                   scrapes: Sequence[CounterPoint], counted: Sequence[int]) -> list[dict[str, float]]:
    """Each window between two scrapes (with the preemption counter): the counter's increase
    logged and replayed (a counter that went down was reset: its new value is the
    increase), and the prompt / generation token counters' where scraped."""
    sp = [p for p in scrapes if p.preemptions is not None]
    if len(sp) < 2:
        return []
    got = list(_points(steps, step_end, [p.t for p in sp], None, counted, False))
    rows = []
    for (a, b), (ra, rb) in zip(zip(sp, sp[1:]), zip(got, got[1:])):
        logged = b.preemptions - a.preemptions if b.preemptions >= a.preemptions else b.preemptions
        d = {"t0": a.t, "t1": b.t, "preemptions_logged": logged,
             "preemptions_replayed": rb.preemptions - ra.preemptions}
        if a.prompt_tokens is not None and b.prompt_tokens is not None:
            d["prompt_logged"] = (b.prompt_tokens - a.prompt_tokens if b.prompt_tokens >= a.prompt_tokens
                                  else b.prompt_tokens)
            d["prompt_replayed"] = rb.prompt_tokens - ra.prompt_tokens
        if a.generation_tokens is not None and b.generation_tokens is not None:
            d["gen_logged"] = (b.generation_tokens - a.generation_tokens
                               if b.generation_tokens >= a.generation_tokens else b.generation_tokens)
            d["gen_replayed"] = rb.generation_tokens - ra.generation_tokens
        if a.cache_queries is not None and b.cache_queries is not None and b.cache_queries > a.cache_queries:
            # the prefix cache's counters where they say something: tokens queried in the window
            d["cache_queries_logged"] = _window_increase(a.cache_queries, b.cache_queries)
            d["cache_queries_replayed"] = rb.cache_queries - ra.cache_queries
            if a.cache_hits is not None and b.cache_hits is not None:
                d["cache_hits_logged"] = _window_increase(a.cache_hits, b.cache_hits)
                d["cache_hits_replayed"] = rb.cache_hits - ra.cache_hits
        rows.append(d)
    return rows


def counter_loss(rows: Sequence[dict[str, float]]) -> float:
    """The preemption counter's disagreement with a run over its scrape windows
    (`scrape_windows`): sum of (replayed - logged)^2 / (1 + logged), Poisson noise on a
    count; a run's weight from it is exp(-loss / 2)."""
    return sum((r["preemptions_replayed"] - r["preemptions_logged"]) ** 2 / (1.0 + r["preemptions_logged"])
               for r in rows) + cache_loss(rows)


def cache_loss(rows: Sequence[dict[str, float]]) -> float:
    """The prefix cache's hit counter against a run, per scrape window where it counted
    queries (`scrape_windows`): squared difference at the scale of the stats lines' token
    counts (10% of the window's hits, at least a few blocks' worth: 400 tokens). Zero
    without prefix-cache counters (prefix caching off, or not scraped)."""
    return sum(((r["cache_hits_replayed"] - r["cache_hits_logged"]) / max(0.1 * r["cache_hits_logged"], 400.0)) ** 2
               for r in rows if "cache_hits_logged" in r)
