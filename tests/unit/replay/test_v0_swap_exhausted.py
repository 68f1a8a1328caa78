"""The V0 engine stops where vLLM 0.6.6.post1 stops when the CPU swap space runs out.

vLLM 0.6.6.post1, vllm/core/scheduler.py: `_preempt` increments `num_cumulative_preemption`
(and logs the every-50th warning) before `_preempt_by_swap` -> `_swap_out`, which raises
`RuntimeError("Aborted due to the lack of CPU swap space. Please increase the swap space to
avoid this error.")` when `block_manager.can_swap_out(seq_group)` is False; nothing catches it
in `schedule()`, so the engine stops in that step (spec B, F.3). `can_swap_out` is
`_can_swap(seq_group, Device.CPU, RUNNING) == OK`: blocks touched = the append of the unseen
tokens (`1 + ceil((unseen - (bs - full_slots % bs)) / bs)`) + the full blocks; NEVER when the
CPU has fewer blocks in total, OK when free - touched >= 0 (no watermark on the CPU).

The workload below, derived by hand from that source (block size 4, 6 GPU blocks, 2 CPU
blocks, watermark int(0.01 * 6) = 0, three 6-token prompts = 2 blocks each, swap forced):

step 0  all three prefilled (2 blocks each): GPU free 0.
step 1  r0 (7 tokens, 6 slots) needs 1 block > 0 free: the last running, r2, is swapped out:
        touched 1 (its token into the half-full block) + 1 full = 2 <= 2 CPU free. GPU 2, CPU 0;
        r0, r1 decode into their half-full blocks.
step 2  no preemption, so `_schedule_swapped`: r2 in (touched 2, GPU free 2 - 2 >= 0); all
        three decode; GPU 0, CPU 2.
step 3  r0 (9 tokens, 8 slots: both blocks full) needs 1 block: r2 is swapped out again
        (touched 1 + 1 full = 2 <= 2). r0 and r1 take a new block each: GPU 0, CPU 0.
step 4  r0 needs a block: the victim is r1 (10 tokens, 9 slots): touched 1 + 2 full = 3 >
        2 CPU blocks in total -> not OK -> RuntimeError; the third preemption (counter 3).
"""

from __future__ import annotations

import json
import subprocess
import sys

from tools.oracle.render_v0_log import render_v0_log
from kvreplay.replay.result import replay_workload
from kvreplay.replay.v0 import run_workload, summarize
from kvreplay.replay.v0.v0_scheduler import SWAP_SPACE_MESSAGE

WORKLOAD = {
    "name": "swap_exhausted_by_hand", "engine": "v0",
    "config": {"num_gpu_blocks": 6, "num_cpu_blocks": 2, "block_size": 4, "max_num_seqs": 8,
               "max_num_batched_tokens": 64, "max_model_len": 64, "preemption_mode": "swap"},
    "requests": [{"id": f"r{i}", "arrival_step": 0, "prompt_token_ids": [100 + 10 * i + j for j in range(6)],
                  "max_tokens": 20} for i in range(3)],
}
MESSAGE = "Aborted due to the lack of CPU swap space. Please increase the swap space to avoid this error."


def test_message_is_vllms():
    assert SWAP_SPACE_MESSAGE == MESSAGE


def test_trace_stops_at_the_failed_swap_out():
    tr = run_workload(WORKLOAD, check_invariants=True)
    got = [(r["step"], r.get("scheduled"), r.get("preempted"), r.get("swapped_in"), r.get("free_gpu_blocks"), r.get("free_cpu_blocks"))
           for r in tr[:4]]
    assert got == [
        (0, [["r0", 6], ["r1", 6], ["r2", 6]], [], [], 0, 2),
        (1, [["r0", 1], ["r1", 1]], ["r2"], [], 2, 0),
        (2, [["r0", 1], ["r1", 1], ["r2", 1]], [], ["r2"], 0, 2),
        (3, [["r0", 1], ["r1", 1]], ["r2"], [], 0, 0),
    ]
    last = tr[-1]
    assert len(tr) == 5 and last["step"] == 4  # nothing after the error
    assert last["terminal_error"] == {"type": "RuntimeError", "message": MESSAGE, "victim": "r1"}
    assert last["preempted"] == ["r1"] and last["num_cumulative_preemption"] == 3
    (p,) = last["preemptions"]  # the preemption record of that step carries the error
    assert (p["req"], p["trigger"], p["mode"], p["error"], p["cumulative_before"], p["cumulative_after"]) == (
        "r1", "r0", "swap", MESSAGE, 2, 3)
    assert "free_gpu_after" not in p  # the swap-out never happened
    s = summarize(tr, WORKLOAD)
    assert (s["completed"], s["terminal_error"]["victim"], s["swap_outs"], s["swap_ins"]) == (False, "r1", 3, 1)


def test_replay_and_simulate_end_with_the_terminal_event(tmp_path):
    rep = replay_workload(WORKLOAD)
    assert rep.terminal is not None and rep.terminal.step == 4 and rep.num_steps == 5
    assert rep.summary()["terminal_error"]["message"] == MESSAGE
    assert [(p.step, p.victim, p.mode, p.error) for p in rep.preemptions][-1] == (4, "r1", "swap", MESSAGE)
    path = tmp_path / "w.json"
    path.write_text(json.dumps(WORKLOAD))
    r = subprocess.run([sys.executable, "-m", "kvreplay.cli", "simulate", str(path), "--format", "report"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr  # vLLM's run is over, as the oracle harness counts it
    assert "not every request finished" not in r.stderr
    assert f"vLLM stops at step 4: RuntimeError: {MESSAGE} (swap-out of r1)" in r.stderr
    assert f"vLLM stops at step 4: RuntimeError: {MESSAGE}" in r.stdout


def test_log_replay_says_the_server_would_have_failed(tmp_path):
    """The oracle case that ends on the swap-space error (tests/data/v0_oracle), rendered as
    its 0.6.6 server log (1 s steps) and replayed: the replay ends in the failing step."""
    from pathlib import Path

    from kvreplay.sources import open_replay

    w = json.loads((Path(__file__).parents[2] / "data" / "v0_oracle" / "v0h_swap_too_little_cpu" / "workload.json").read_text())
    tr = run_workload(w)
    log = tmp_path / "server.log"
    log.write_text("\n".join(render_v0_log(w, tr, step_time_s=1.0)) + "\n")
    assert MESSAGE in log.read_text()
    rep = open_replay([str(log)], year=2025)
    assert rep.terminal is not None and rep.terminal.terminal_error["victim"] == "s4"
    note = next(n for n in rep.notes if n.startswith("the server would have failed"))
    assert f"at step {rep.terminal.step} (" in note and f"at the swap-out of s4: RuntimeError: {MESSAGE}" in note
