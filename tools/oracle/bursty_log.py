"""A rendered vLLM 0.33 log with Iteration lines and prompts, in bursts with the engine idle
between them (the quiet points where `kvreplay watch` restarts its window).

    python -m tools.oracle.bursty_log BURSTS OUT.log

Each burst: 8 requests within 5 steps, prompts 100-399 tokens, 60-159 output tokens, on a
64-block pool (preemptions in every burst); bursts 400 steps apart. The scheduler model
runs it (kvreplay.replay.simulate) and tools.oracle.render_log writes the log.
"""
from __future__ import annotations

import random
import sys


def render_bursty(bursts: int, seed: int = 1) -> list[str]:
    from kvreplay.replay import parse_workload, simulate
    from tools.oracle.render_log import render_log

    rng = random.Random(seed)
    reqs = []
    for b in range(bursts):
        for i in range(8):
            reqs.append({"id": f"cmpl-burst-{b}-{i}-0", "arrival_step": b * 400 + rng.randrange(5),
                         "prompt_token_ids": [rng.randrange(10, 30000)
                                              for _ in range(rng.randrange(100, 400))],
                         "max_tokens": rng.randrange(60, 160)})
    reqs.sort(key=lambda r: r["arrival_step"])
    wl = parse_workload({"name": "bursty", "config": {
        "num_gpu_blocks": 64, "block_size": 16, "max_num_seqs": 16, "max_num_batched_tokens": 2048,
        "max_model_len": 1008, "enable_prefix_caching": False, "max_steps": 10**7},
        "requests": reqs})
    records, _ = simulate(wl)
    return render_log(wl, records, step_time_s=0.012, stats_interval_s=1.0,
                      iteration_lines=True, with_prompts=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(args[1], "w") as f:
        f.write("\n".join(render_bursty(int(args[0]))) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
