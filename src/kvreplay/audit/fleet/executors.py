"""Where fleet tasks run: `local` (this machine's processes) or `dask[:ADDRESS]` (a
dask.distributed cluster: a LocalCluster started here, or an existing scheduler).

One small interface, futures in and futures out, so the driver (run.py) is the same for
both: `submit(fn, *args, key=...)`, `as_completed(futures)`, `result(future)`, `cancel`,
`close()`. Dask's own futures and `as_completed` do the scheduling, retries after a lost
worker included (the scheduler re-runs the tasks of a worker that died, up to
`distributed.scheduler.allowed-failures` times, then raises KilledWorker).
"""

from __future__ import annotations

import concurrent.futures as cf
from concurrent.futures.process import BrokenProcessPool
import os
from typing import Any, Callable, Iterable, Iterator

from kvreplay.errors import UserError

FLEET_EXTRA = "pip install 'kvreplay[fleet]'  (or: pip install 'dask[distributed]')"


def parse_spec(spec: str) -> tuple[str, str | None]:
    """'local' | 'dask' | 'dask:tcp://host:8786' -> (kind, address)."""
    kind, _, address = spec.partition(":")
    if kind not in ("local", "dask") or (kind == "local" and address):
        raise UserError(f"--executor {spec!r}: use local, dask, or dask:ADDRESS "
                        "(e.g. dask:tcp://scheduler:8786)")
    return kind, (address or None)


def make_executor(spec: str, workers: int | None = None):
    kind, address = parse_spec(spec)
    if kind == "local":
        return LocalExecutor(workers)
    return DaskExecutor(address, workers)


def _private_cluster(distributed: Any, workers: int | None) -> Any:
    """A LocalCluster no other local user can reach: scheduler and `workers` worker threads in
    this process over `inproc://`, with no HTTP server (Dask starts one per node whatever
    `dashboard_address` says; each is stopped here). Threads share the GIL: for parallel
    local runs `--executor local` uses processes; `dask` here is the same code path as a real
    cluster's."""
    import logging

    n = workers or (os.cpu_count() or 1)
    cluster = distributed.LocalCluster(
        n_workers=n, threads_per_worker=1, processes=False, protocol="inproc://",
        dashboard_address=None, silence_logs=logging.ERROR)
    for node in [cluster.scheduler, *cluster.workers.values()]:
        http = getattr(node, "http_server", None)
        if http is not None:
            http.stop()
    return cluster


def _die_with_parent(parent: int) -> None:
    """Worker start-up: end this worker when the driver process ends, however it ends (a
    SIGKILL included; a stdlib pool's workers otherwise wait on their queue for ever).
    Linux: PR_SET_PDEATHSIG; everywhere: a thread that watches the parent pid."""
    import signal
    import threading
    import time

    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # gone before the line above took effect
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="kvreplay-parent-watch", daemon=True).start()


class _Lazy(cf.Future):
    """A task run in this process when the driver asks for it (jobs=1: no pool)."""

    def __init__(self, fn: Callable, args: tuple) -> None:
        super().__init__()
        self.call = (fn, args)

    def run(self) -> None:
        fn, args = self.call
        try:
            self.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the driver like a pool's
            self.set_exception(exc)
            if isinstance(exc, KeyboardInterrupt):
                raise


class _Task:
    """A local task: its call and its current future (replaced when the pool is rebuilt)."""

    __slots__ = ("call", "future", "generation", "tries")

    def __init__(self, call: tuple, future: cf.Future, generation: int) -> None:
        self.call, self.future, self.generation, self.tries = call, future, generation, 0

    def done(self) -> bool:
        return self.future.done()


class LocalExecutor:
    """Processes of this machine (fork), or this process alone with one worker.

    A worker process that dies (OOM-killed, a segfault) breaks the whole stdlib pool: every
    task not yet finished fails with BrokenProcessPool. The executor then starts a new pool
    and submits those tasks again, up to `tries` times each, as Dask's scheduler does."""

    name = "local"
    lost_errors: tuple[type[BaseException], ...] = (BrokenProcessPool,)
    tries = 3

    def __init__(self, workers: int | None = None) -> None:
        if workers is not None and workers < 1:
            raise UserError("--jobs must be >= 1")
        self.workers = workers or (os.cpu_count() or 1)
        self.pool: cf.ProcessPoolExecutor | None = None
        self.generation = 0  # pools started

    def describe(self) -> str:
        return f"local, {self.workers} process{'es' if self.workers != 1 else ''}"

    def _pool(self) -> cf.ProcessPoolExecutor:
        if self.pool is None:
            import multiprocessing as mp

            ctx = mp.get_context("spawn" if os.name == "nt" else "fork")
            self.pool = cf.ProcessPoolExecutor(max_workers=self.workers, mp_context=ctx,
                                               initializer=_die_with_parent, initargs=(os.getpid(),))
            self.generation += 1
        return self.pool

    def submit(self, fn: Callable, *args: Any, key: str | None = None):
        if self.workers == 1:
            return _Lazy(fn, args)
        pool = self._pool()
        return _Task((fn, args), pool.submit(fn, *args), self.generation)

    def as_completed(self, futures: Iterable[Any]) -> Iterator[Any]:
        futures = list(futures)
        for f in futures:
            if isinstance(f, _Lazy):
                if not f.done():
                    f.run()
                yield f
        live = {t.future: t for t in futures if isinstance(t, _Task)}
        while live:
            for f in cf.as_completed(list(live)):
                t = live.pop(f)
                if isinstance(f.exception(), BrokenProcessPool) and t.tries < self.tries:
                    if t.generation == self.generation:  # this pool broke: a new one
                        self.pool.shutdown(wait=True, cancel_futures=True)  # broken: no worker left
                        self.pool = None
                    fn, args = t.call
                    t.future, t.generation = self._pool().submit(fn, *args), self.generation
                    t.tries += 1
                    live[t.future] = t
                    break  # wait again, on the new futures too
                yield t

    def result(self, future: Any) -> Any:
        if isinstance(future, _Lazy) and not future.done():
            future.run()
        return (future.future if isinstance(future, _Task) else future).result()

    def cancel(self, futures: Iterable[Any]) -> None:
        for f in futures:
            (f.future if isinstance(f, _Task) else f).cancel()

    def close(self, cancel: bool = False) -> None:
        """End the pool. Its threads are always joined: a pool left running when the
        interpreter exits races its exit hook ("Exception ignored ... Bad file descriptor"
        on Python 3.11). `cancel` (an interrupted run): queued tasks are dropped and the
        workers still running one are killed first, so the join does not wait for them."""
        if self.pool is not None:
            if cancel:
                for proc in list((getattr(self.pool, "_processes", None) or {}).values()):
                    proc.kill()
            self.pool.shutdown(wait=True, cancel_futures=cancel)
            self.pool = None


class DaskExecutor:
    """A dask.distributed Client: on the scheduler at `address`, or on a private in-process
    LocalCluster (`_private_cluster`).

    Security: Dask's comms run pickled code, so whoever can reach a scheduler or worker can
    run code in it. The local cluster therefore lives in this process alone: its scheduler
    and workers talk over `inproc://` (no socket at all) and the HTTP servers Dask starts
    regardless of `dashboard_address` are stopped before any task runs. A remote scheduler is
    reached with exactly the security the user's Dask configuration gives
    (`distributed.comm.tls.*`, e.g. DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT; or a
    `tls://` address with those files): kvreplay adds none and removes none."""

    name = "dask"
    connect_timeout = "20s"

    def __init__(self, address: str | None = None, workers: int | None = None, *,
                 client: Any = None) -> None:
        try:
            import distributed
        except ImportError:
            raise UserError("--executor dask needs dask.distributed, which is not installed: "
                            + FLEET_EXTRA) from None
        self._d = distributed
        self.lost_errors = (distributed.KilledWorker,)
        self.cluster = None
        self.owns_client = client is None
        if client is not None:
            self.client = client
        elif address:
            try:
                self.client = distributed.Client(address, timeout=self.connect_timeout)
            except (OSError, TimeoutError) as exc:
                raise UserError(f"--executor dask:{address}: cannot reach the scheduler: {exc}") from None
        else:
            self.cluster = _private_cluster(distributed, workers)
            self.client = distributed.Client(self.cluster)
        self.address = address

    def describe(self) -> str:
        n = len(self.client.scheduler_info().get("workers", {}))
        where = self.address or ("in-process LocalCluster" if self.cluster is not None else "LocalCluster")
        return f"dask {where}, {n} worker{'s' if n != 1 else ''}"

    def submit(self, fn: Callable, *args: Any, key: str | None = None) -> Any:
        return self.client.submit(fn, *args, key=key, pure=False)

    def as_completed(self, futures: Iterable[Any]) -> Iterator[Any]:
        return iter(self._d.as_completed(list(futures)))

    def result(self, future: Any) -> Any:
        out = future.result()
        future.release()  # the cluster may forget it: the driver has the rows
        return out

    def cancel(self, futures: Iterable[Any]) -> None:
        futures = [f for f in futures if not f.done()]
        if futures:
            self.client.cancel(futures)

    def close(self, cancel: bool = False) -> None:
        if self.owns_client:
            self.client.close()
        if self.cluster is not None:
            self.cluster.close()
