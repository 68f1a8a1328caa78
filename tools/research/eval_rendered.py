#!/usr/bin/env python3
"""Score the log replay on workloads rendered as 0.33 logs (dev tool).

    python -m tools.research.eval_rendered STEP_S CASE_DIR...   e.g. 0.008 tests/data/oracle/0.33/*/

Each workload is simulated, rendered as a vLLM 0.33 log (tools/oracle/render_log.py: 1 s stats
lines, prompts logged, a fixed step time), replayed from the log, and the replayed
preemptions are matched against the simulation's (same victim, within +-5 steps).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

from kvreplay.replay import parse_workload, simulate
from kvreplay.inference import replay_facts
from tools.oracle.render_log import render_log
from kvreplay.sources import read_facts
from tools.research.matching import match_preemptions


def main() -> int:
    step_s = float(sys.argv[1])
    tot_true = tot_hit = tot_found = 0
    for d in sys.argv[2:]:
        wl = parse_workload(json.load(open(os.path.join(d, "workload.json"))))
        recs, s = simulate(wl)
        if s.total_preemptions == 0:
            continue
        lines = render_log(wl, recs, step_time_s=step_s, stats_interval_s=1.0)
        with tempfile.TemporaryDirectory() as tmp:
            p = os.path.join(tmp, "server.log")
            with open(p, "w") as f:
                f.write("\n".join(lines) + "\n")
            rep = replay_facts(read_facts([p], year=2026))
        true = [(r["step"], p["req"]) for r in recs for p in r.get("preemptions", ())]
        found = [(p.step, p.victim) for p in rep.preemptions]
        hits = len(match_preemptions(true, found))
        tot_true += len(true)
        tot_hit += hits
        tot_found += len(found)
        print(os.path.basename(d.rstrip("/")), len(true), len(found), hits, rep.info.arrival_pattern)
    print("TOTAL true", tot_true, "found", tot_found, "hit", tot_hit,
          round(tot_hit / max(1, tot_true), 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
