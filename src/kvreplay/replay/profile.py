"""Version profiles: every behaviour that differs between vLLM V1 releases, in one object.

The scheduler's control flow never asks "which version?"; it reads a field of the profile.
Each field names the row of spec Part C (or Part E) it captures. A profile for a release is
the 0.33 profile with the rows that changed since switched back (Part E shows this is
exact for 0.19.0 and 0.11.0).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from kvreplay.errors import UserError


@dataclass(frozen=True, slots=True)
class SchedulerProfile:
    name: str
    """Short name, e.g. "0.33"."""
    releases: str
    """The releases it stands for, e.g. "0.31.0–0.33.0"."""

    # C1: block 0 is the reserved null block (usable = N - 1). Absent 0.8.0-0.8.2.
    null_block: bool = True
    # C3: long_prefill_token_threshold exists (0.8.3+) ...
    long_prefill_threshold: bool = True
    # ... and is forced off when running + waiting <= 1 (0.31+).
    threshold_lone_request_exempt: bool = True
    # C4: cap on a running request's n: "none" (<=0.8.4), "len" (max_len - computed,
    # 0.8.5-0.9.0), "len-1" (max_len - 1 - computed, 0.9.2-0.23; 0.24+ subtracts the
    # tokens sampled per step, which is 1 for generation: the same number).
    max_model_len_cap: Literal["none", "len", "len-1"] = "len-1"
    # C5: the PRIORITY policy exists (0.9.1/0.9.2+).
    priority_policy: bool = True
    # C6: what happens to a priority victim already scheduled this step:
    #   "none"    0.9.2-0.10.0: stays in the scheduled list with its tokens;
    #   "partial" 0.10.2-0.11: removed from the running list but its tokens stay
    #             scheduled and its budget is not refunded (a vLLM defect, copied);
    #   "full"    0.12+: unscheduled, tokens refunded.
    priority_rollback: Literal["none", "partial", "full"] = "full"
    # C6 index fix: from 0.28 the scan index is decremented whenever the victim sat before
    # it; 0.12-0.27 only when the victim had been scheduled this step; <=0.11 never.
    rollback_index: Literal["never", "if_scheduled", "if_before"] = "if_before"
    # C6-self: a PRIORITY request that preempts itself keeps the running scan going
    # (0.33); before, it ends Phase R.
    priority_self_preempt_continues: bool = True
    # C7: chunked prefill off and a waiting request larger than the budget:
    # "chunk" (<=0.9.0, V1 always chunked), "skip" (0.9.2-0.11), "break" (0.12+).
    unchunked_overflow: Literal["chunk", "skip", "break"] = "break"
    # C8: preempted requests' prefix stats kept apart; num_preemptions counter (0.12+).
    preempted_prefix_stats: bool = True
    # C12: full-sequence admission gate, scheduler_reserve_full_isl (0.19+).
    full_sequence_gate: bool = True
    # C13: V1 watermark (0.24+).
    watermark: bool = True
    # C14: prefix stats recorded once at admission (0.27+), not at every lookup.
    prefix_stats_at_admission: bool = True
    # C15: freed unhashed blocks go to the head of the free queue (0.28+).
    free_unhashed_to_head: bool = True
    # C16: kv_cache_usage denominator is N - 1 (0.10.2+), else N.
    usage_excludes_null_block: bool = True
    # E row 24: requests skipped in one waiting scan are put back reversed (0.11).
    skipped_requeued_reversed: bool = False
    # E row 25: async scheduling skips a running request whose final token is in flight
    # (0.19 and 0.33; 0.11 schedules one more decode token).
    async_skip_final_token: bool = True
    # A9: async output still in flight for a preempted request is "stale": it is delivered
    # but changes no counter, and the request is not resumed before it drains (0.30+).
    async_stale_output: bool = True
    notes: tuple[str, ...] = field(default=())


P_0_33 = SchedulerProfile(name="0.33", releases="0.33.x")

# 0.31-0.32: a PRIORITY request that preempts itself ends Phase R (C6-self, Part E).
P_0_31 = replace(P_0_33, name="0.31", releases="0.31.0–0.32.x", priority_self_preempt_continues=False)
# 0.30: the lone request is not exempt from the threshold (C3).
P_0_30 = replace(P_0_31, name="0.30", releases="0.30.x", threshold_lone_request_exempt=False)
# 0.28-0.29: no stale tracking of a preempted request's in-flight async output (A9: from
# 0.30). NOTE 0.18-0.30 also serve a separate skipped_waiting queue first (C11); with the
# inputs kvreplay models a request is only ever skipped for stale output (0.30+), so that
# queue would only matter in 0.30, where it is not modelled.
P_0_28 = replace(P_0_30, name="0.28", releases="0.28.0–0.29.x", async_stale_output=False)
# 0.24-0.27: append-only free queue (C15); rollback index adjusted only for a victim
# scheduled this step (C6). Prefix stats at admission from 0.27 (C14, counters only).
P_0_24 = replace(
    P_0_28,
    name="0.24",
    releases="0.24.0–0.27.x",
    free_unhashed_to_head=False,
    rollback_index="if_scheduled",
)
# 0.19-0.23: no V1 watermark (C13); prefix stats at every lookup (C14).
P_0_19 = replace(
    P_0_24, name="0.19", releases="0.19.0–0.23.x", watermark=False, prefix_stats_at_admission=False
)
# 0.12-0.18: no full-sequence admission gate (C12).
P_0_12 = replace(P_0_19, name="0.12", releases="0.12.0–0.18.x", full_sequence_gate=False)
# 0.10.2-0.11: partial priority rollback (C6, a vLLM defect copied), skip instead of break
# with chunked prefill off (C7), no split prefix stats (C8), reversed re-queue (E24),
# one extra async decode (E25).
P_0_11 = replace(
    P_0_12,
    name="0.11",
    releases="0.10.2–0.11.x",
    priority_rollback="partial",
    rollback_index="never",
    unchunked_overflow="skip",
    preempted_prefix_stats=False,
    skipped_requeued_reversed=True,
    async_skip_final_token=False,
    notes=(
        "vLLM defect copied: a PRIORITY victim already scheduled this step keeps its "
        "scheduled tokens and budget, so it ends the step with num_computed_tokens > 0.",
    ),
)
# 0.9.2-0.10.1: no rollback at all; kv usage over N (before 0.10.2).
P_0_9 = replace(
    P_0_11,
    name="0.9",
    releases="0.9.2–0.10.1",
    priority_rollback="none",
    usage_excludes_null_block=False,
    skipped_requeued_reversed=False,
    notes=(
        "vLLM defect copied: a PRIORITY victim already scheduled this step stays in the "
        "scheduled list with its tokens.",
    ),
)
# 0.8.5-0.9.0: no PRIORITY policy, V1 always chunks, cap max_len - computed.
P_0_8_5 = replace(
    P_0_9,
    name="0.8.5",
    releases="0.8.5–0.9.0",
    priority_policy=False,
    unchunked_overflow="chunk",
    max_model_len_cap="len",
    notes=(),
)

PROFILES: dict[str, SchedulerProfile] = {
    p.name: p
    for p in (P_0_33, P_0_31, P_0_30, P_0_28, P_0_24, P_0_19, P_0_12, P_0_11, P_0_9, P_0_8_5)
}

# (first release, profile) in ascending order; a release maps to the last entry <= it.
_RANGES: list[tuple[tuple[int, int, int], SchedulerProfile]] = [
    ((0, 8, 5), P_0_8_5),
    ((0, 9, 1), P_0_9),  # PRIORITY arrived in 0.9.1 or 0.9.2 (0.9.1 not read)
    ((0, 10, 2), P_0_11),
    ((0, 12, 0), P_0_12),
    ((0, 19, 0), P_0_19),
    ((0, 24, 0), P_0_24),
    ((0, 28, 0), P_0_28),
    ((0, 30, 0), P_0_30),
    ((0, 31, 0), P_0_31),
    ((0, 33, 0), P_0_33),
]
DEFAULT_PROFILE = P_0_33


def parse_version(text: str) -> tuple[int, int, int] | None:
    core = text.strip().lstrip("vV").split("+")[0].split(".dev")[0]
    parts = core.split(".")
    nums: list[int] = []
    for part in parts[:3]:
        # ASCII digits only (str.isdigit also takes "²", which int() refuses); no release
        # number is 10 digits long, and int() of thousands of digits is refused
        digits = "".join(ch for ch in part if "0" <= ch <= "9")
        if not digits or len(digits) > 9:
            break
        nums.append(int(digits))
    if len(nums) < 2:
        return None
    while len(nums) < 3:
        nums.append(0)
    return nums[0], nums[1], nums[2]


def get_profile(name: str | None) -> SchedulerProfile:
    """The profile for a release ("0.19.0", "0.19", "v0.11.0") or a profile name.

    Releases newer than the newest profile use it; releases older than 0.8.5 have no V1
    profile here (the V0 engine replays them).
    """
    if name is None or name in ("", "auto", "latest"):
        return DEFAULT_PROFILE
    if name in PROFILES:
        return PROFILES[name]
    version = parse_version(name)
    if version is None:
        raise UserError(
            f"unknown profile {name!r}; give a vLLM release such as 0.33.0 or one of "
            + ", ".join(PROFILES)
        )
    if version < _RANGES[0][0]:
        raise UserError(
            f"vLLM {name} predates the V1 profiles (0.8.5+); its logs replay with the V0 engine"
        )
    chosen = _RANGES[0][1]
    for first, profile in _RANGES:
        if version >= first:
            chosen = profile
    return chosen


def check_profile_arg(name: str | None) -> None:
    """A profile the user names (--profile) must be one kvreplay has rules for: a release
    newer than the newest profile's (major.minor) is refused, not replayed by 0.33's rules
    in silence. (Logs of a newer release keep get_profile's newest-profile rule.)"""
    if name is None or name in ("", "auto", "latest") or name in PROFILES:
        return
    if name.startswith("v0-"):
        return  # a V0 profile: the V0 engine checks it
    version = parse_version(name)
    newest = _RANGES[-1][0]
    if version is not None and version[:2] > newest[:2]:
        raise UserError(f"--profile {name}: kvreplay has no rules for vLLM newer than "
                        f"{newest[0]}.{newest[1]}; known: {', '.join(PROFILES)} (or any release "
                        "from 0.8.5 on), V0: the release the log states")
    get_profile(name)


def check_config(profile: SchedulerProfile, config) -> None:
    """Knobs a release did not have are an error, not silently ignored."""
    if config.policy == "priority" and not profile.priority_policy:
        raise UserError(
            f"the PRIORITY policy does not exist in vLLM {profile.releases} (V1 has it from 0.9.2)"
        )
    if config.watermark and not profile.watermark:
        raise UserError(
            f"the V1 watermark does not exist in vLLM {profile.releases} (introduced in 0.24)"
        )
    if config.long_prefill_token_threshold and not profile.long_prefill_threshold:
        raise UserError(
            f"long_prefill_token_threshold does not exist in vLLM {profile.releases}"
        )
