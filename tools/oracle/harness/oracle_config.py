"""The oracle's workload and the vLLM configuration it asks for: the workload file's
config keys and defaults, and the VllmConfig / KVCacheConfig a release's scheduler is built
from, checked against what vLLM's config post-init resolved.

Part of the harness run inside a vLLM venv (oracle_core.py); imports vLLM only inside
build(). Workload format: tests/data/conformance/README.md.
"""
from __future__ import annotations

import json
import os

import msgspec  # a vLLM dependency (requirements files)

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE_MODEL_DIR = os.path.join(HERE, "fake_model")

DEFAULTS = {
    "num_gpu_blocks": 64,
    "block_size": 16,
    "max_num_seqs": 16,
    "max_num_batched_tokens": 2048,
    "max_model_len": None,  # default: 2048 (chunked) / max_num_batched_tokens
    "enable_chunked_prefill": True,
    "enable_prefix_caching": False,
    "policy": "fcfs",
    "long_prefill_token_threshold": 0,
    # vLLM's own defaults for two admission knobs that matter for replay:
    "scheduler_reserve_full_isl": True,
    "watermark": 0.0,
    "max_steps": 5000,
    # Drive vLLM's AsyncScheduler through a 2-deep batch queue, as EngineCore
    # does when async scheduling is on (vLLM's default on GPUs).
    "async_scheduling": False,
    # fake sampled token: "index" -> 1000 + (output index % 30000) (distinct
    # per position, identical across requests); "fixed" -> fixed_token.
    "fake_token_mode": "index",
    "fixed_token": 42,
}


def load_workload(path: str) -> tuple[dict, list[dict]]:
    with open(path) as f:
        wl = json.load(f)
    cfg = dict(DEFAULTS)
    unknown = set(wl.get("config", {})) - set(DEFAULTS)
    if unknown:
        raise SystemExit(f"unknown config keys: {sorted(unknown)}")
    cfg.update(wl.get("config", {}))
    if cfg["max_model_len"] is None:
        cfg["max_model_len"] = (
            2048
            if cfg["enable_chunked_prefill"]
            else min(2048, cfg["max_num_batched_tokens"])
        )
    reqs = wl["requests"]
    ids = [r["id"] for r in reqs]
    if len(set(ids)) != len(ids):
        raise SystemExit("duplicate request ids")
    for r in reqs:
        for k in ("id", "arrival_step", "prompt_token_ids", "max_tokens"):
            if k not in r:
                raise SystemExit(f"request {r.get('id')} lacks {k}")
    return cfg, reqs


class EngineSetup(msgspec.Struct, frozen=True):
    """What the scheduler is built from (vLLM objects) and the resolved settings meta.json
    records."""

    vllm_config: object  # vllm.config.VllmConfig
    kv_cache_config: object  # vllm.v1.kv_cache_interface.KVCacheConfig
    scheduler_block_size: int
    hash_block_size: int
    resolved: dict


def build(rel, cfg: dict) -> EngineSetup:
    """vLLM's configs for the workload, as the engine would hold them; SystemExit if vLLM's
    post-init rewrote a requested setting. `rel`: the release (oracle_releases)."""
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
    )
    import torch

    model_config = ModelConfig(
        model=FAKE_MODEL_DIR,
        tokenizer=FAKE_MODEL_DIR,
        skip_tokenizer_init=True,  # no tokenizer files: token ids only
        dtype="float16",
        seed=42,
        max_model_len=cfg["max_model_len"],
    )
    scheduler_config = SchedulerConfig(
        max_num_seqs=cfg["max_num_seqs"],
        max_num_batched_tokens=cfg["max_num_batched_tokens"],
        max_model_len=cfg["max_model_len"],
        enable_chunked_prefill=cfg["enable_chunked_prefill"],
        long_prefill_token_threshold=cfg["long_prefill_token_threshold"],
        policy=cfg["policy"],
        async_scheduling=cfg["async_scheduling"],
        **rel.scheduler_config_kwargs(cfg),
    )
    cache_config = CacheConfig(
        block_size=cfg["block_size"],
        gpu_memory_utilization=0.9,
        cache_dtype="auto",
        enable_prefix_caching=cfg["enable_prefix_caching"],
    )
    vllm_config = VllmConfig(
        scheduler_config=scheduler_config,
        model_config=model_config,
        cache_config=cache_config,
        **rel.vllm_config_kwargs(),
    )
    # As in vLLM's tests/v1/core/utils.py::create_scheduler: one full-attention
    # KV cache group, num_blocks given directly (no GPU memory profiling).
    kv_cache_config = KVCacheConfig(
        num_blocks=cfg["num_gpu_blocks"],
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(
                    block_size=cfg["block_size"],
                    num_kv_heads=1,
                    head_size=1,
                    dtype=torch.float32,
                ),
            )
        ],
    )
    vllm_config.cache_config.num_gpu_blocks = cfg["num_gpu_blocks"]
    if cfg["async_scheduling"]:
        # vLLM's CpuPlatform.check_and_update_config forces async scheduling
        # off (CPU model runner reasons); the scheduler itself is
        # platform-independent, so turn it back on, as a GPU platform would.
        vllm_config.scheduler_config.async_scheduling = True
    scheduler_block_size, hash_block_size = rel.block_sizes(kv_cache_config, vllm_config)

    # Sanity: vLLM's config post-init must not have rewritten what we asked.
    sc = vllm_config.scheduler_config
    cc = vllm_config.cache_config
    resolved = {
        "num_gpu_blocks": cc.num_gpu_blocks,
        "block_size": cc.block_size,
        "max_num_seqs": sc.max_num_seqs,
        "max_num_batched_tokens": sc.max_num_batched_tokens,
        "max_model_len": vllm_config.model_config.max_model_len,
        "enable_chunked_prefill": sc.enable_chunked_prefill,
        "enable_prefix_caching": bool(cc.enable_prefix_caching),
        "policy": sc.policy,
        "long_prefill_token_threshold": sc.long_prefill_token_threshold,
        **rel.resolved_admission(sc),
    }
    for k, v in resolved.items():
        if cfg[k] != v:
            raise SystemExit(f"vLLM rewrote config {k}: asked {cfg[k]!r}, got {v!r}")
    resolved.update(
        {
            "async_scheduling": sc.async_scheduling,
            # knobs of later releases: None where the release lacks them
            "max_num_scheduled_tokens": getattr(sc, "max_num_scheduled_tokens", None),
            "max_num_active_seqs": getattr(sc, "max_num_active_seqs", None),
            "long_prefill_token_threshold_adaptive": getattr(
                sc, "long_prefill_token_threshold_adaptive", None),
            "prefill_schedule_interval": getattr(sc, "prefill_schedule_interval", None),
            "prefix_caching_hash_algo": cc.prefix_caching_hash_algo,
            "scheduler_block_size": scheduler_block_size,
            "hash_block_size": hash_block_size,
            "use_v2_model_runner": getattr(vllm_config, "use_v2_model_runner", None),
        }
    )
    return EngineSetup(vllm_config, kv_cache_config, scheduler_block_size, hash_block_size,
                       resolved)
