"""The workloads a default log's ensemble draws (inference/default_log.py): arrivals inside
their stats interval, prompt and output lengths to what the lines and scrapes say, shared
prompt prefixes for a prefix-caching server, and the requests of one member."""

from __future__ import annotations

import math
import random
from typing import Any, Sequence

from kvreplay.inference import evidence_metrics as EM
from kvreplay.replay.workload import RequestSpec, Workload


def _lengths(n: int, mean: float, rng: random.Random, cap: int, shape: tuple[str, float]) -> list[int]:
    kind, cv = shape
    if kind == "uniform":  # mean +- sqrt(3) cv mean
        half = min(mean - 1, math.sqrt(3.0) * cv * mean)
        xs = [mean + half * (2 * rng.random() - 1) for _ in range(n)]
    else:
        s2 = math.log(1 + cv * cv)
        mu = math.log(max(mean, 1.0)) - s2 / 2
        xs = [rng.lognormvariate(mu, math.sqrt(s2)) for _ in range(n)]
    return [max(1, min(cap, int(round(x)))) for x in xs]


def prompt_groups(ev: EM.MetricsEvidence, m: int) -> list[tuple[int, int, float]]:
    """The stats lines' prompt tokens, each given to the requests that had their first token
    in its interval: (first, end, tokens) over the requests in arrival order. vLLM counts a
    prompt's tokens once, when its first token comes out; by stats line k the first
    A_k - waiting_k arrivals have had theirs (FCFS: in arrival order; a preempted victim
    waiting again is the error), so the interval's tokens are those requests' prompts.
    Intervals whose requests or tokens are none are pooled with the next; the requests no
    line counted (after the last) are one group of no known tokens (-1)."""
    out: list[tuple[int, int, float]] = []
    arrived = done = start = 0
    tokens = 0.0
    for arrivals, waiting, prompt_tokens in zip(*(ev.column(k) for k in ("arrivals", "waiting", "prompt_tokens"))):
        arrived += arrivals
        done = min(max(done, arrived - waiting), arrived, m)
        tokens += prompt_tokens
        if done > start and tokens > 0:
            out.append((start, done, tokens))
            start, tokens = done, 0.0
    if tokens > 0 and out:  # tokens with no request left: the last group's
        a, b, t = out[-1]
        out[-1] = (a, b, t + tokens)
    if start < m:
        out.append((start, m, -1.0))
    return out


def _grouped_lengths(ev: EM.MetricsEvidence, m: int, rng: random.Random, cap: int,
                     shape: tuple[str, float]) -> list[int]:
    """Prompt lengths of `shape` whose sum in each `prompt_groups` group is its tokens (the
    requests after the last line: the mean of the rest)."""
    groups = prompt_groups(ev, m)
    known = [(b - a, t) for a, b, t in groups if t >= 0]
    mean = (sum(t for _, t in known) / max(1, sum(n for n, _ in known))) if known else 1.0
    out: list[int] = []
    for a, b, t in groups:
        xs = _lengths(b - a, max(1.0, mean), rng, cap, shape)
        if t >= 0:
            f = t / max(1, sum(xs))
            xs = [max(1, min(cap, int(round(x * f)))) for x in xs]
        out += xs
    return out


def fit_groups(xs: Sequence[int], groups: Sequence[tuple[int, int, float]],
               rng: random.Random) -> list[int]:
    """Lengths `xs` (a sample of the scraped histogram: the right multiset, in random
    order) put in the order whose sum in each `prompt_groups` group comes nearest its
    tokens: the histogram says which lengths there were, the stats lines which interval's
    requests had them. Local search: swap two requests of different groups when that
    lowers the squared misfit (groups of no known tokens take part freely)."""
    out = list(xs)
    rng.shuffle(out)
    m = len(out)
    gid = [0] * m
    for g, (a, b, _) in enumerate(groups):
        for j in range(a, min(b, m)):
            gid[j] = g
    target = [t for _, _, t in groups]
    have = [0.0] * len(groups)
    for j, x in enumerate(out):
        have[gid[j]] += x

    def cost(g: int, s: float) -> float:
        return 0.0 if target[g] < 0 else (s - target[g]) ** 2

    if m < 2 or sum(1 for t in target if t >= 0) == 0:
        return out
    for _ in range(SWAPS * m):
        i, j = rng.randrange(m), rng.randrange(m)
        gi, gj = gid[i], gid[j]
        if gi == gj or out[i] == out[j]:
            continue
        d = out[j] - out[i]
        before = cost(gi, have[gi]) + cost(gj, have[gj])
        after = cost(gi, have[gi] + d) + cost(gj, have[gj] - d)
        if after < before:
            out[i], out[j] = out[j], out[i]
            have[gi] += d
            have[gj] -= d
    return out


# fit_groups: swaps tried per request
SWAPS = 40


def workload_of(config: Any, ins: Sequence[int], outs: Sequence[int],
                prefixes: Sequence[tuple[int, int]] | None = None) -> Workload:
    """The requests of a member; `prefixes`: each request's (family, length) of a prompt
    prefix it shares with the other requests of its family (`shared_prefixes`)."""
    cap = config.max_model_len
    specs = []
    for j, (p, o) in enumerate(zip(ins, outs)):
        p = max(1, min(p, cap - 1))
        o = max(1, min(o, cap - p))
        fam, n = prefixes[j] if prefixes else (0, 0)
        n = min(n, p)
        toks = [10 + ((29999 - fam) * 7919 + k * 104729) % 30000 for k in range(n)]
        toks += [10 + (j * 7919 + k * 104729) % 30000 for k in range(n, p)]
        specs.append(RequestSpec(f"r{j}", -1, toks, o))
    return Workload("default-log member", "", config, specs, max_steps=10**9)


def shared_prefixes(ins: Sequence[int], share: float, block: int,
                    rng: random.Random) -> list[tuple[int, int]]:
    """Each request's (family, prefix length) so that the prefix cache would hit `share`
    of the prompt tokens first admitted (vllm:prefix_cache_hits / _queries over the
    scrapes): 1-8 families of requests (the number drawn), each sharing a prefix of one
    length L; a request hits the full blocks of min(L, prompt - 1) when an earlier one of
    its family was admitted (vLLM never hits a prompt's last token). L by bisection;
    eviction is left to the replay (the counter's check weighs it)."""
    fams = rng.choice((1, 2, 4, 8))
    fam = [rng.randrange(fams) for _ in ins]
    total = max(1, sum(ins))
    seen: set[int] = set()
    later = []
    for f, p in zip(fam, ins):
        later.append(f in seen)
        seen.add(f)

    def got(length: int) -> float:
        return sum((min(length, p - 1) // block) * block for p, late in zip(ins, later) if late) / total

    lo, hi = 0, max(ins, default=0) // block
    while lo < hi:  # the fewest blocks reaching the share, or the one below if nearer
        mid = (lo + hi) // 2
        if got(mid * block) < share:
            lo = mid + 1
        else:
            hi = mid
    if lo and share - got((lo - 1) * block) < got(lo * block) - share:
        lo -= 1
    return [(f, lo * block) for f in fam]


def _arrivals(ev: EM.MetricsEvidence, rng: random.Random, phase: float,
              spread: float = 1.0) -> list[float]:
    """Each interval's arrivals at random inside it (a line stamped second s was written
    at s + phase); with `spread` < 1 inside a stretch of that share of it, placed at random
    (a burst: the stats lines count arrivals, not how they cluster)."""
    out = []
    for w0, w1, arrivals in zip(*(ev.column(k) for k in ("t0", "t1", "arrivals"))):
        dt = w1 - w0
        t0 = w0 + phase
        if spread < 1.0 and arrivals:
            t0 += (1.0 - spread) * dt * rng.random()
            dt *= spread
        out += [t0 + dt * rng.random() for _ in range(arrivals)]
    if ev.windows and ev.late_arrivals:
        t = ev.column("t1")[-1] + phase
        out += [t + ev.interval_s * rng.random() for _ in range(ev.late_arrivals)]
    return sorted(out)
