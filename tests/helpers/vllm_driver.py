"""Driver run INSIDE a vLLM 0.33.0 venv (a script: it imports vLLM only when run as one).

It drives vLLM's real V1 Scheduler / AsyncScheduler on CPU with a fake model, as the oracle
harness (tools/oracle/harness/run_oracle.py) does, with kvreplay's step-trace plugin as the
scheduler class, and writes vLLM's log (vLLM's own logger and formatter) to a file.

    python tests/helpers/vllm_driver.py JOBS.json
        JOBS.json: [{"workload": W, "log": L, "trace": T, "summary": S, "meta": M,
                     "plugin": true, "fault": ["_kvt_state", 5]}, ...]
                     -> one "@@JOB {...}" line per job on stdout ("fault": optional, see
                     _inject_fault)
    python tests/helpers/vllm_driver.py --check-entry-points DIR
        -> "@@EP {...}": what get_scheduler_cls() gives with KVREPLAY_STEP_TRACE=1 and a
           `vllm.general_plugins` entry point (a dist-info written to DIR), and what
           --scheduler-cls resolves to.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
import types

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HARNESS = os.path.join(REPO, "tools", "oracle", "harness", "run_oracle.py")


def install_kvreplay_shim() -> None:
    """Make `kvreplay.vllm_plugin` importable from the source tree without installing
    kvreplay into the vLLM venv (src/kvreplay/vllm_plugin/)."""
    if "kvreplay.vllm_plugin" in sys.modules:
        return
    try:
        import kvreplay.vllm_plugin  # noqa: F401  (installed kvreplay)
        return
    except ImportError:
        pass
    pkg = sys.modules.get("kvreplay")
    if pkg is None:
        pkg = types.ModuleType("kvreplay")
        pkg.__path__ = []  # namespace-like: only the plugin is needed here
        sys.modules["kvreplay"] = pkg
    d = os.path.join(REPO, "src", "kvreplay", "vllm_plugin")
    spec = importlib.util.spec_from_file_location(
        "kvreplay.vllm_plugin", os.path.join(d, "__init__.py"), submodule_search_locations=[d]
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["kvreplay.vllm_plugin"] = mod
    spec.loader.exec_module(mod)
    pkg.vllm_plugin = mod


def _load_harness():
    spec = importlib.util.spec_from_file_location("kvreplay_oracle_harness", HARNESS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_jobs(jobs_path: str) -> None:
    import logging

    install_kvreplay_shim()
    harness = _load_harness()
    import vllm.v1.core.sched.async_scheduler as am
    import vllm.v1.core.sched.scheduler as sm

    from kvreplay.vllm_plugin import StepTraceAsyncScheduler, StepTraceScheduler

    real = (sm.Scheduler, am.AsyncScheduler)
    # vLLM's own logging setup (what `vllm serve` does at start), then a file handler with
    # vLLM's formatter for each job; vLLM's stream handler is kept at WARNING.
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging

    configure_logging(LoggingConfig())
    vlog = logging.getLogger("vllm")
    fmt = vlog.handlers[0].formatter
    for h in vlog.handlers:
        h.setLevel(logging.WARNING)
    vlog.setLevel(logging.INFO)
    with open(jobs_path) as f:
        jobs = json.load(f)
    real_stdout = sys.stdout
    for job in jobs:
        handler = logging.FileHandler(job["log"], mode="w", encoding="utf-8")
        handler.setFormatter(fmt)
        handler.setLevel(logging.INFO)
        vlog.addHandler(handler)
        classes = (StepTraceScheduler, StepTraceAsyncScheduler) if job.get("plugin", True) else real
        unfault = _inject_fault(job.get("fault"))
        classes, publishers = _enable_kv_events(job.get("kv_events"), classes)
        sm.Scheduler, am.AsyncScheduler = classes
        argv = [HARNESS, job["workload"], "-o", job["trace"], "--summary", job["summary"],
                "--meta", job["meta"]]
        status, err = "ok", None
        old_argv, sys.argv = sys.argv, argv
        sys.stdout = sys.stderr
        t0 = time.perf_counter()
        try:
            harness.main()
        except SystemExit as e:
            if e.code not in (0, None):
                status, err = "error", f"exit {e.code}"
        except BaseException as e:  # noqa: BLE001
            import traceback

            status, err = "error", traceback.format_exc()
            del e
        finally:
            sys.stdout = real_stdout
            sys.argv = old_argv
            sm.Scheduler, am.AsyncScheduler = real
            unfault()
            _disable_kv_events(publishers)
            vlog.removeHandler(handler)
            handler.close()
        rec = {"workload": job["workload"], "status": status, "error": err,
               "seconds": round(time.perf_counter() - t0, 3)}
        real_stdout.write("@@JOB " + json.dumps(rec) + "\n")
        real_stdout.flush()


def _inject_fault(fault: list | None):
    """["method", n]: kvreplay's StepTraceMixin.method (or, for "short_hash", the plugin's
    hash helper) raises RuntimeError on its n-th call (counting from 1), as a bug in
    kvreplay's own code would. Returns the function that puts the method back."""
    if not fault:
        return lambda: None
    from kvreplay.vllm_plugin import _scheduler

    name, n = fault
    owner = _scheduler if name == "short_hash" else _scheduler.StepTraceMixin
    orig = owner.__dict__[name]
    calls = [0]

    def faulty(*a, **k):
        calls[0] += 1
        if calls[0] == n:
            raise RuntimeError(f"injected fault in {name} (call {n})")
        return orig(*a, **k)

    setattr(owner, name, faulty)
    return lambda: setattr(owner, name, orig)


def _enable_kv_events(kv: dict | None, classes: tuple) -> tuple[tuple, list]:
    """With {"endpoint", "replay_endpoint"}: the scheduler gets vLLM's KVEventsConfig (ZMQ
    publisher), as `--kv-events-config` gives it. Returns the scheduler classes to use and
    the list that collects the publishers vLLM creates."""
    publishers: list = []
    if not kv:
        return classes, publishers
    import vllm.distributed.kv_events as kve
    from vllm.config.kv_events import KVEventsConfig

    cfg = KVEventsConfig(
        enable_kv_cache_events=True, publisher="zmq", endpoint=kv["endpoint"],
        replay_endpoint=kv.get("replay_endpoint"), topic="",
    )

    def with_events(base):
        class WithKvEvents(base):
            def __init__(self, *a, **k):
                k["vllm_config"].kv_events_config = cfg
                super().__init__(*a, **k)

        WithKvEvents.__name__ = base.__name__
        return WithKvEvents

    real_create = kve.EventPublisherFactory.__dict__["create"]
    bound = kve.EventPublisherFactory.create

    def create(*a, **k):
        pub = bound(*a, **k)
        publishers.append(pub)
        return pub

    kve.EventPublisherFactory.create = create
    publishers.append(("restore", real_create))
    return tuple(with_events(c) for c in classes), publishers


def _disable_kv_events(publishers: list) -> None:
    if not publishers:
        return
    import vllm.distributed.kv_events as kve

    for p in publishers:
        if isinstance(p, tuple):
            setattr(kve.EventPublisherFactory, "create", p[1])
    time.sleep(float(os.environ.get("KVREPLAY_KV_EVENTS_DRAIN_S", "2.0")))  # let the publisher thread send
    for p in publishers:
        if not isinstance(p, tuple):
            p.shutdown()


def check_entry_points(tmpdir: str) -> None:
    """The environment-variable route: a `vllm.general_plugins` entry point (as kvreplay's
    pyproject declares it) loaded by vLLM's own plugin loader."""
    install_kvreplay_shim()
    di = os.path.join(tmpdir, "kvreplay_stub-0.0.dist-info")
    os.makedirs(di, exist_ok=True)
    with open(os.path.join(di, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: kvreplay-stub\nVersion: 0.0\n")
    with open(os.path.join(di, "entry_points.txt"), "w") as f:
        f.write("[vllm.general_plugins]\nkvreplay_step_trace = kvreplay.vllm_plugin:register\n")
    sys.path.insert(0, tmpdir)
    os.environ["KVREPLAY_STEP_TRACE"] = "1"
    from vllm.config.scheduler import SchedulerConfig
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    out = {}
    for name, kw in (("sync", {"async_scheduling": False}), ("async", {"async_scheduling": True})):
        sc = SchedulerConfig.default_factory(**kw)
        out[name] = SchedulerConfig.get_scheduler_cls(sc).__name__
    sc = SchedulerConfig.default_factory(scheduler_cls="kvreplay.vllm_plugin.StepTraceScheduler")
    out["scheduler_cls_path"] = sc.get_scheduler_cls().__name__
    # the command line: `vllm serve MODEL --scheduler-cls kvreplay.vllm_plugin.StepTraceScheduler`
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    fake_model = os.path.join(REPO, "tools", "oracle", "harness", "fake_model")
    args = parser.parse_args(["--model", fake_model, "--scheduler-cls", "kvreplay.vllm_plugin.StepTraceScheduler"])
    out["cli_scheduler_cls"] = EngineArgs.from_cli_args(args).scheduler_cls
    print("@@EP " + json.dumps(out), flush=True)


if __name__ == "__main__":
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable] + sys.argv)
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_LOGGING_COLOR", "0")
    if sys.argv[1] == "--check-entry-points":
        check_entry_points(sys.argv[2])
    else:
        run_jobs(sys.argv[1])
