"""Spec A12 worked examples 1-3 and the A11.3 stale-hash edge case, with block IDs and
free-queue order derived by hand from the spec's tables (spec steps are 1-based; engine
steps here are 0-based, so spec step k is engine step k-1)."""

from __future__ import annotations

from typing import Any

from kvreplay.replay import Engine, get_profile, parse_workload
from kvreplay.replay.request import RequestStatus
from kvreplay.replay.trace import conformance_record


def _workload(config: dict[str, Any], requests: list[dict[str, Any]]) -> dict[str, Any]:
    base = {"max_model_len": 256, "max_num_seqs": 16, "enable_chunked_prefill": True,
            "scheduler_reserve_full_isl": True, "watermark": 0.0, "block_size": 4}
    base.update(config)
    return {"name": "spec", "config": base, "requests": requests}


def _req(rid: str, n_prompt: int, max_tokens: int, *, step: int = 0, priority: int = 0,
         first_token: int = 0) -> dict[str, Any]:
    return {"id": rid, "arrival_step": step, "max_tokens": max_tokens, "priority": priority,
            "prompt_token_ids": list(range(first_token, first_token + n_prompt))}


class Stepper:
    """Run an Engine one iteration at a time and look inside."""

    def __init__(self, workload: dict[str, Any], profile: str = "0.33") -> None:
        self.engine = Engine(parse_workload(workload), get_profile(profile), check_invariants=True)
        self._it = self.engine.run()
        self.rec: dict[str, Any] = {}

    def step(self) -> dict[str, Any]:
        self.rec = conformance_record(self.engine, next(self._it))
        return self.rec

    @property
    def sched(self):
        return self.engine.scheduler

    def table(self, rid: str) -> list[int]:
        return [b.block_id for b in self.sched.kv_cache_manager.req_to_blocks.get(rid, [])]

    def free_queue(self) -> list[int]:
        return self.sched.pool.free_block_queue.block_ids()

    def req(self, rid: str):
        return self.sched.requests[rid]


def test_example_1_fcfs_decode_time_preemption_caching_off() -> None:
    s = Stepper(_workload({"num_gpu_blocks": 5, "max_num_batched_tokens": 64,
                           "enable_prefix_caching": False},
                          [_req("A", 6, 6), _req("B", 6, 6, first_token=100)]))
    r = s.step()  # spec step 1: A -> [1,2], B -> [3,4]
    assert r["scheduled"] == [["A", 6], ["B", 6]]
    assert s.table("A") == [1, 2] and s.table("B") == [3, 4] and s.free_queue() == []
    s.step()
    s.step()  # spec steps 2-3: decodes, no new blocks
    r = s.step()  # spec step 4: A needs a 3rd block; victim running[-1] = B
    assert r["preempted"] == ["B"]
    p = r["preemptions"][0]
    assert (p["trigger"], p["self_preempt"], p["victim_rule"]) == ("A", False, "fcfs: running[-1]")
    assert s.table("A") == [1, 2, 4] and s.free_queue() == [3]  # B freed [4,3] to the head
    assert s.req("B").status == RequestStatus.PREEMPTED
    assert s.req("B").num_computed_tokens == 0 and s.req("B").num_preemptions == 1
    assert s.req("B").num_tokens == 9  # outputs kept
    assert r["running"] == ["A"] and r["waiting"] == ["B"]  # stats: running=1, waiting=1
    assert r["new"] == [] and r["resumed"] == []  # no admission in a preempting step
    r = s.step()  # spec step 5: B needs cdiv(9,4)=3 > 1 free
    assert r["scheduled"] == [["A", 1]]
    assert r["admission_blocked"]["req"] == "B" and r["admission_blocked"]["blocks_needed"] == 3
    r = s.step()  # spec step 6: A finishes; [4,2,1] go to the head
    assert r["finished"] == ["A"] and s.free_queue() == [4, 2, 1, 3]
    r = s.step()  # spec step 7: B resumed with n=9 (6 prompt + 3 generated recomputed)
    assert r["resumed"] == ["B"] and r["scheduled"] == [["B", 9]]
    assert s.table("B") == [4, 2, 1] and s.free_queue() == [3]
    s.step()
    r = s.step()  # spec steps 8-9: B finishes at output 6
    assert r["finished"] == ["B"] and s.free_queue() == [1, 2, 4, 3]


def test_example_1_before_0_28_uses_the_append_only_free_queue() -> None:
    s = Stepper(_workload({"num_gpu_blocks": 5, "max_num_batched_tokens": 64},
                          [_req("A", 6, 6), _req("B", 6, 6, first_token=100)]), profile="0.19")
    for _ in range(6):
        s.step()
    assert s.free_queue() == [3, 4, 2, 1]  # after A finishes (spec: "up to 0.27")
    s.step()
    assert s.table("B") == [3, 4, 2]


def test_example_2_self_preemption_and_resume_with_prefix_hit() -> None:
    s = Stepper(_workload({"num_gpu_blocks": 6, "max_num_batched_tokens": 64,
                           "enable_prefix_caching": True},
                          [_req("A", 8, 3), _req("B", 8, 3, first_token=100)]))
    s.step()  # spec step 1
    assert s.table("A") == [1, 2] and s.table("B") == [3, 4] and s.free_queue() == [5]
    stats = s.sched.prefix_stats
    assert (stats.requests, stats.queries, stats.hits) == (2, 16, 0)
    r = s.step()  # spec step 2: A takes 5; B needs a 3rd block and is the last: self-preempt
    assert s.table("A") == [1, 2, 5]
    assert r["preempted"] == ["B"] and r["preemptions"][0]["self_preempt"] is True
    assert s.free_queue() == [4, 3]  # hashed blocks go to the tail, reverse order
    r = s.step()  # spec step 3: A finishes; B hits 8 but the gate needs 1 + 2 > 2
    assert r["finished"] == ["A"]
    assert r["admission_blocked"]["reason"] == "full-sequence gate"
    assert s.free_queue() == [5, 4, 3, 2, 1]  # 5 (partial, unhashed) to the head
    assert (stats.preempted_requests, stats.requests) == (0, 2)  # failed lookup not counted
    r = s.step()  # spec step 4: B resumed: touch 3,4 + one new block 5; n = 1
    assert r["resumed"] == ["B"] and r["scheduled"] == [["B", 1]]
    assert r["prefix_hit_tokens"] == {"B": 8}
    assert s.table("B") == [3, 4, 5] and s.free_queue() == [2, 1]
    assert (stats.preempted_requests, stats.preempted_queries, stats.preempted_hits) == (1, 9, 8)
    r = s.step()  # spec step 5
    assert r["finished"] == ["B"] and s.free_queue() == [5, 2, 1, 4, 3]


def test_example_3_priority_rollback_and_resume_from_cached_chunks() -> None:
    s = Stepper(_workload({"num_gpu_blocks": 6, "max_num_batched_tokens": 8, "max_num_seqs": 4,
                           "long_prefill_token_threshold": 4, "enable_prefix_caching": True,
                           "policy": "priority"},
                          [_req("L", 16, 2, priority=1),
                           _req("H", 4, 3, step=1, priority=0, first_token=100)]))
    r = s.step()  # spec step 1: L alone, threshold off (0.31+): chunk 8
    assert r["scheduled"] == [["L", 8]] and s.table("L") == [1, 2]
    r = s.step()  # spec step 2: two requests: T = 4
    assert r["scheduled"] == [["L", 4], ["H", 4]]
    assert s.table("L") == [1, 2, 3] and s.table("H") == [4] and s.free_queue() == [5]
    r = s.step()  # spec step 3: H needs a block; victim L (already scheduled) rolled back
    assert r["preempted"] == ["L"]
    p = r["preemptions"][0]
    assert p["trigger"] == "H" and p["was_scheduled_this_step"] and p["rolled_back_tokens"] == 4
    assert r["scheduled"] == [["H", 1]]
    assert s.table("H") == [4, 5] and s.free_queue() == [3, 2, 1]
    assert s.req("L").num_computed_tokens == 0 and s.req("L").num_preemptions == 1
    r = s.step()  # spec step 4: H finishes; L hits 12 but needs 1 + 3 > 3
    assert r["finished"] == ["H"] and r["admission_blocked"]["req"] == "L"
    assert s.free_queue() == [5, 3, 2, 1, 4]
    r = s.step()  # spec step 5: L resumes from its last surviving cached block: 12 of 16
    assert r["resumed"] == ["L"] and r["scheduled"] == [["L", 4]]
    assert r["prefix_hit_tokens"] == {"L": 12}
    assert s.table("L") == [1, 2, 3, 5] and s.free_queue() == [4]
    stats = s.sched.prefix_stats
    assert (stats.preempted_requests, stats.preempted_queries, stats.preempted_hits) == (1, 16, 12)
    r = s.step()  # spec step 6
    assert r["finished"] == ["L"] and s.free_queue() == [4, 5, 3, 2, 1]


def test_a11_3_stale_hash_after_priority_rollback() -> None:
    """A vLLM defect copied on purpose: a rolled-back victim's new blocks keep the hashes
    registered at allocation, so its readmission 'hits' KV that was never computed."""
    s = Stepper(_workload({"num_gpu_blocks": 9, "max_num_batched_tokens": 12,
                           "long_prefill_token_threshold": 8, "enable_prefix_caching": True,
                           "policy": "priority"},
                          [_req("L", 28, 2, priority=1),
                           _req("H", 4, 3, step=1, priority=0, first_token=100)]))
    s.step()  # L alone: threshold off, chunk 12 -> [1,2,3]
    assert s.table("L") == [1, 2, 3]
    s.step()  # L chunk 8 -> [4,5]; H -> [6]
    assert s.table("L") == [1, 2, 3, 4, 5] and s.table("H") == [6]
    r = s.step()  # L's chunk grabs 7 and 8, then H needs a block: L rolled back
    assert r["preempted"] == ["L"] and s.table("H") == [6, 8]
    block7 = s.sched.pool.blocks[7]
    assert block7.block_hash == s.req("L").block_hashes[5]  # L's 6th block, never computed
    hits, n_hit = s.sched.kv_cache_manager.get_computed_blocks(s.req("L"))
    assert n_hit == 24 and [b.block_id for b in hits] == [1, 2, 3, 4, 5, 7]
    r = s.step()  # H finishes; L blocked by the gate (1 + 6 evictable > 6 free)
    assert r["finished"] == ["H"] and r["admission_blocked"]["req"] == "L"
    r = s.step()  # L resumed: the stale block counts as a hit
    assert r["resumed"] == ["L"] and r["prefix_hit_tokens"] == {"L": 24}
    assert r["scheduled"] == [["L", 4]]
