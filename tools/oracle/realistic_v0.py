"""A realistic V0 workload: Poisson arrivals (one every ~6 steps), prompts of 16-200
tokens, outputs of 50-400, on a pool of 120 blocks that forces recompute preemptions. The
V0 log-replay tests render it at realistic step times (tests/logs/test_replay_v0_logs.py);
tools/research/eval_v0_labels.py scores the confidence labels on its seeds."""

from __future__ import annotations

import random
from typing import Any


def realistic_workload(seed: int = 7, n: int = 90, *,
                       fake_token_mode: str | None = None) -> dict[str, Any]:
    """The workload (conformance format) of `seed`; `fake_token_mode` into its config."""
    rng = random.Random(seed)
    t = 0.0
    reqs = []
    for _ in range(n):
        t += rng.expovariate(1 / 6.0)
        reqs.append({"id": f"cmpl-{rng.getrandbits(64):016x}-0", "arrival_step": int(t),
                     "prompt_token_ids": [rng.randrange(1, 32000) for _ in range(rng.randint(16, 200))],
                     "max_tokens": rng.randint(50, 400)})
    config: dict[str, Any] = {"num_gpu_blocks": 120, "block_size": 16, "max_num_seqs": 32,
                              "max_num_batched_tokens": 2048, "max_model_len": 2048,
                              "max_steps": 100000}
    if fake_token_mode is not None:
        config["fake_token_mode"] = fake_token_mode
    return {"name": f"realistic-{seed}", "engine": "v0", "config": config, "requests": reqs}
