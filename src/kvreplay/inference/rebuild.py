"""Stage 3, workload: the requests the log describes, ready for the engine.

Consumes: `LogFacts`, the `LogFormat`, the engine config (stage 2). Produces: `Rebuilt`:
the workload (V1 `Workload` or `V0Workload`) with every request's prompt (logged token
ids; else tokens of its own of the logged or estimated length, after a prefix every
estimated prompt shares) and output length (exact with ignore_eos + max_tokens or a
logged response, else an upper bound, marked estimated), and which of them are estimates.
Arrival steps are not set here: placing arrivals is stage 5's job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TYPE_CHECKING

from kvreplay.errors import ReplayError
from kvreplay.limits import check as check_limit
from kvreplay.inference.config import engine_config
from kvreplay.inference.engines import make_workload
from kvreplay.inference.facts import LogFacts, LogRequest
from kvreplay.inference.formats import LogFormat, interval_of
from kvreplay.replay.workload import RequestSpec

if TYPE_CHECKING:
    from kvreplay.inference.engines import Profile



@dataclass(slots=True)
class Rebuilt:
    workload: Any  # Workload (V1) | V0Workload
    requests: list[LogRequest]
    prompt_estimated: list[bool]
    output_estimated: list[bool]
    config_sources: dict[str, str]  # knob -> "log" | "default" | "derived"
    notes: list[str] = field(default_factory=list)

    @property
    def prompts_estimated(self) -> bool:
        return any(self.prompt_estimated)


def rebuild_workload(facts: LogFacts, fmt: LogFormat, profile: Profile, *,
                     prompt_lens: list[int] | None = None, shared_prefix: int = 0,
                     out_lens: dict[str, int] | None = None) -> Rebuilt:
    """The workload the log describes. Prompts not in the log get `prompt_lens` (else the
    logged length, else the mean) tokens of their own, after `shared_prefix` tokens every
    estimated prompt shares (prompts.shared_prefix_estimate); requests without ignore_eos
    stop at `out_lens` where given (outputs.estimate_output_lengths)."""
    if not facts.requests:
        raise ReplayError(
            "the log has no request lines, so there is no workload to replay: start vLLM "
            "with --enable-log-requests (and VLLM_REQUEST_BODY_LOG_LEVEL=INFO for prompts)")
    # the watermark knob exists in the releases whose profile has it (A6.4)
    cfg, src, notes = engine_config(facts, fmt, bool(getattr(profile, "watermark", False)))
    specs: list[RequestSpec] = []
    parent: dict[str, str] = {}
    p_est: list[bool] = []
    o_est: list[bool] = []
    mean_len = mean_prompt_len(facts, fmt)
    usable_tokens = (cfg.num_gpu_blocks - 1) * cfg.block_size
    for i, r in enumerate(facts.requests):
        if r.prompt_token_ids and (r.prompt_len is None or r.prompt_len == len(r.prompt_token_ids)):
            prompt = list(r.prompt_token_ids)
            est = False
        else:
            n = prompt_lens[i] if prompt_lens is not None else (r.prompt_len or mean_len)
            # Unknown content: tokens unique to this request, after the shared prefix the
            # log's prefix-cache hit rate implies (none without caching).
            prompt = [2_000_000 + j for j in range(shared_prefix)]
            # NOTE: an estimate is never longer than a prompt vLLM accepts (a damaged log's
            # stats can imply millions of tokens: building them would exhaust memory)
            n = max(1, min(int(n), cfg.max_model_len))
            prompt += [1_000_000 + i * 100_003 + j for j in range(n)]
            est = r.prompt_len is None or prompt_lens is not None
        if fmt.caps_to_limits:
            # vLLM's frontend refuses a prompt that leaves no room for one output token
            prompt = prompt[: cfg.max_model_len - 1]
        max_tokens = r.max_tokens if r.max_tokens is not None else cfg.max_model_len - len(prompt)
        out_est = False
        if r.output_len is not None:
            max_tokens = r.output_len
        elif not r.ignore_eos:
            out_est = True  # max_tokens is an upper bound: EOS may have come earlier
            if out_lens is not None and r.log_id in out_lens:
                max_tokens = min(max_tokens, out_lens[r.log_id])
        if fmt.caps_to_limits:
            max_tokens = max(1, min(max_tokens, cfg.max_model_len - len(prompt) + 1))
            # A request that could never fit the pool would loop forever (vLLM rejects
            # such a max_model_len at startup); clamp and say so.
            if min(len(prompt) + max_tokens, cfg.max_model_len) - 1 > usable_tokens:
                max_tokens = max(1, usable_tokens + 1 - len(prompt))
                out_est = True
        max_tokens = max(1, int(max_tokens))
        n_seq = max(1, int(r.n or 1)) if fmt.split_n else 1
        if n_seq > 1:
            check_limit("n", n_seq, f"request {r.log_id}: SamplingParams n")
        ids = [r.log_id] if n_seq == 1 else [f"{r.log_id}_parallel_sample_{j}" for j in range(n_seq)]
        for gid in ids:
            specs.append(RequestSpec(gid, 0, prompt, max_tokens, int(r.priority or 0)))
            parent[gid] = r.log_id
        p_est.append(est)
        o_est.append(out_est)
    if any(p_est):
        notes.append(f"{sum(p_est)} prompt lengths estimated (mean {mean_len} tokens)")
    if any(o_est):
        how = ("from the Finished request lines" if out_lens and facts.finished else
               "from the logged generation throughput" if out_lens else
               "max_tokens taken as the length")
        notes.append(f"{sum(o_est)} output lengths estimated ({how})")
    fanned = [r for r in facts.requests if r.n > 1]
    if fanned and not fmt.split_n:
        notes.append(
            f"{len(fanned)} of {len(facts.requests)} requests ask for n > 1 samples (the "
            f"first: {fanned[0].log_id}, "
            f"n={fanned[0].n}): vLLM runs each as n sequences sharing the prompt, this replay "
            "runs one, so it underestimates their KV load and preemptions")
    if not fmt.priorities_logged and cfg.policy == "priority":
        notes.append("priority policy: request priorities are not logged by V0 servers; all taken as 0")
    wl = make_workload(fmt, cfg, specs, parent, "rebuilt from " + ", ".join(facts.files))
    return Rebuilt(wl, facts.requests, p_est, o_est, src, notes)


def mean_prompt_len(facts: LogFacts, fmt: LogFormat) -> int:
    """The mean logged prompt length, else the prompt tokens the stats lines count over
    the whole log per request."""
    known = [len(r.prompt_token_ids) if r.prompt_token_ids else r.prompt_len
             for r in facts.requests]
    known = [k for k in known if k]
    if known:
        return max(1, round(sum(known) / len(known)))
    total = sum((s.prompt_throughput or 0.0) * interval_of(facts, fmt) for s in facts.stats)
    if total > 0:
        return max(1, round(total / len(facts.requests)))
    return 512
