"""Hypothesis strategies shared by the property tests."""

from __future__ import annotations

from hypothesis import strategies as st


@st.composite
def workloads(draw) -> dict:
    block_size = draw(st.sampled_from([4, 8, 16]))
    num_blocks = draw(st.integers(min_value=4, max_value=40))
    usable_tokens = (num_blocks - 1) * block_size
    chunked = draw(st.booleans())
    budget = draw(st.sampled_from([8, 16, 32, 64, 128, 512]))
    max_model_len = draw(st.integers(min_value=8, max_value=256))
    if not chunked:
        budget = max(budget, max_model_len)
    cfg = {
        "num_gpu_blocks": num_blocks,
        "block_size": block_size,
        "max_num_seqs": draw(st.integers(min_value=1, max_value=8)),
        "max_num_batched_tokens": budget,
        "max_model_len": max_model_len,
        "enable_chunked_prefill": chunked,
        "enable_prefix_caching": draw(st.booleans()),
        "policy": draw(st.sampled_from(["fcfs", "priority"])),
        "long_prefill_token_threshold": draw(st.sampled_from([0, 0, 4, 16])),
        "scheduler_reserve_full_isl": draw(st.booleans()),
        "watermark": draw(st.sampled_from([0.0, 0.0, 0.05])),
        "async_scheduling": draw(st.booleans()),
        "fake_token_mode": draw(st.sampled_from(["index", "fixed"])),
        "max_steps": 20000,
    }
    prefixes = [list(range(1000 * k, 1000 * k + 64)) for k in range(3)]
    n = draw(st.integers(min_value=1, max_value=10))
    requests = []
    for i in range(n):
        # The whole sequence must fit the pool and max_model_len (else vLLM loops forever).
        limit = min(usable_tokens, max_model_len - 1)
        prompt_len = draw(st.integers(min_value=1, max_value=max(1, min(limit, 96))))
        shared = draw(st.integers(min_value=0, max_value=2))
        cut = draw(st.integers(min_value=0, max_value=prompt_len))
        prompt = prefixes[shared][:cut] + [50000 + i * 997 + j for j in range(prompt_len - cut)]
        prompt = prompt[:prompt_len] or [7]
        max_tokens = draw(st.integers(min_value=1, max_value=max(1, limit + 1 - len(prompt))))
        requests.append({
            "id": f"r{i}",
            "arrival_step": draw(st.integers(min_value=0, max_value=30)),
            "prompt_token_ids": prompt,
            "max_tokens": max_tokens,
            "priority": draw(st.integers(min_value=0, max_value=3)),
        })
    return {"name": "prop", "config": cfg, "requests": requests}


@st.composite
def pool_workloads(draw, *, requests: tuple[int, int] = (2, 14), gap: int = 6,
                   prompt: int = 90, shared: int = 40, max_tokens: int = 60,
                   blocks: tuple[int, int] = (14, 40), seqs: int = 8,
                   budgets: tuple[int, ...] = (64, 128, 256), max_model_len: int = 256,
                   pressure: bool = False) -> dict:
    """Requests arriving a few steps apart on a small pool (block size 8), half of them
    behind one shared prefix when prefix caching is drawn. `pressure`: the full-ISL
    reservation drawn, and a long-prefill threshold half the time (chunked prefills cut
    short again)."""
    import random

    rng = random.Random(draw(st.integers(0, 10**6)))
    caching = draw(st.booleans())
    n = draw(st.integers(*requests))
    prefix = [rng.randrange(10, 500) for _ in range(rng.randrange(0, shared))]
    reqs, step = [], 0
    for i in range(n):
        step += rng.randrange(0, gap)
        tokens = (prefix if caching and rng.random() < 0.5 else []) + [
            rng.randrange(10, 500) for _ in range(rng.randrange(1, prompt))]
        reqs.append({"id": f"q{i}", "arrival_step": step, "prompt_token_ids": tokens,
                     "max_tokens": rng.randrange(1, max_tokens), "priority": rng.randrange(0, 3)})
    cfg = {"num_gpu_blocks": draw(st.integers(*blocks)), "block_size": 8,
           "max_num_seqs": draw(st.integers(1, seqs)),
           "max_num_batched_tokens": draw(st.sampled_from(list(budgets))),
           "max_model_len": max_model_len, "enable_prefix_caching": caching,
           "policy": draw(st.sampled_from(["fcfs", "priority"])),
           "async_scheduling": draw(st.booleans()), "max_steps": 3000}
    if pressure:
        # without the full-ISL reservation a chunked prefill again is often cut short
        cfg["scheduler_reserve_full_isl"] = draw(st.booleans())
        if draw(st.booleans()):
            cfg["long_prefill_token_threshold"] = draw(st.sampled_from([4, 8, 12]))
    return {"name": "prop", "config": cfg, "requests": reqs}
