"""The step-trace line format (written by the plugin, read by kvreplay's parser).

Every line is an INFO record of vLLM's logger `vllm.kvreplay.trace`, so it carries vLLM's
usual envelope (`(EngineCore_DP0 pid=N) INFO 05-07 10:00:05 [_scheduler.py:L] `). Messages:

    kvtrace config v=0.33.0 sched=Scheduler blocks=64 bs=16 hbs=16 seqs=16 tokens=2048 len=2048 chunked=1 prefix=0 policy=fcfs lpt=0 isl=1 wm=0.0 async=0 interval=1 spec=0
    kvtrace req 7 at=12 p=200 max=150 prio=0 id=cmpl-ab12-0 bh=3f2a9c1b7e4d5a60,0c1d...
    kvtrace step 12 s=3,5,7:200 new=7:0 free=40 kv=0.3651 q=3/0
    kvtrace step 13 s=3,5 pre=7/5/200 f=2:150 free=52 kv=0.1746 q=2/1

`config`: one per scheduler instance (engine start). `blocks` counts vLLM's null block
(usable = blocks - 1); `tokens` is the per-step token budget; `async=1` means the
AsyncScheduler (batch queue of depth 2).

`req H`: one per arriving request, written in `add_request`. H is a short decimal handle used
in step lines instead of the (long) request id; `at=N` is the step line whose `schedule()`
first sees the request; `p` prompt tokens, `max` max_tokens, `prio` priority, `id` vLLM's
request id, `bh` the prompt's full-block hash chain (last 8 bytes of each hash, hex; only
with prefix caching). No token ids are ever logged.

`step N`: one per engine iteration (one `schedule()` and/or one `update_from_output()`),
N = 0, 1, 2 ... per scheduler instance. Keys, in this order, each optional:

    ab=H:OUT,...     requests aborted before this step's schedule(), with output tokens so far
    s=H,H:n,...      scheduled requests in vLLM's order, `H` = 1 token, `H:n` = n tokens;
                     `s=-` when schedule() ran and scheduled nothing; no `s` when it did not run
    new=H:HIT,...    admitted from WAITING, with prefix-cache hit tokens
    res=H:HIT,...    resumed from PREEMPTED, with prefix-cache hit tokens
    pre=V/T/L,...    preemptions in order: victim, trigger (whose allocation failed; `-` when
                     not from schedule()), computed tokens lost; V == T is a self-preemption
    abm=H:OUT,...    aborted after schedule() and before update_from_output() (vLLM's aborts queue)
    u=M | u=-        update_from_output() applied the batch of step M (absent: this step's own
                     batch, as always in sync mode); `u=-`: no update in this iteration
    f=H:OUT,...      finished in update_from_output(), with their output token counts
    bh=H:X.X,...     block hashes that became full in this update (prefix caching only)
    ev=K             KV-cache event batches vLLM has published so far (with --kv-events-config);
                     the batches with seq < K were published by the end of this step
    free=F           free KV blocks at the end of the iteration (evictable cached ones count)
    kv=U             KV cache usage at the end of the iteration (0..1, 4 decimals)
    q=R/W            running / waiting requests at the end of the iteration
"""

from __future__ import annotations

PREFIX = "kvtrace "
LOGGER_NAME = "vllm.kvreplay.trace"
HASH_BYTES = 8


def short_hash(h) -> str:
    """A vLLM block hash as 16 hex digits: its last 8 bytes, which is exactly the integer
    vLLM's KV-cache events publish (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES, on by default), so
    trace lines and `record-kv-events` files name a block the same way."""
    if isinstance(h, (bytes, bytearray)):
        return h[-HASH_BYTES:].hex()
    if isinstance(h, int):
        return format(h & 0xFFFFFFFFFFFFFFFF, "016x")
    # BlockHashWithGroupId or other wrappers: fall back to the bytes of its repr
    b = getattr(h, "block_hash", None)
    if b is not None:
        return short_hash(b)
    import hashlib

    return hashlib.sha256(repr(h).encode()).hexdigest()[: 2 * HASH_BYTES]
