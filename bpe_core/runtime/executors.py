"""Executors: where the data-parallel phases run -- this machine's threads, or a Dask cluster.

The interface is small on purpose, so another engine (Ray, ...) is one more class and no method
changes:

- ``map_reduce(fn, tasks, combine, shared=())``: ``fn(task, *shared)`` for every task, the results
  combined by ``combine(list_of_results)`` (an associative fold that keeps task order) into one
  result, which the caller receives;
- ``map(fn, tasks, shared=())``: ``fn(task, *shared)`` for every task, the (small) results back in
  task order;
- ``share(obj)``: ship a large read-only object once (a word table), not once per task; pass what it
  returns in ``shared``.

``fn`` and ``combine`` must be top-level functions of the package (a cluster pickles them by
reference); tasks are small descriptions (``corpus.shards.Shard``: an input, a byte range, a stamp).
Each call may pass ``on_done(task)``, called on the client as tasks finish (progress bars).

- :class:`LocalExecutor`: threads of this process (``workers.run_ordered``), results folded as they
  arrive, ``FANOUT`` of one level into one of the next (each result is copied O(log n) times).
- :class:`DaskExecutor`: tasks on a ``dask.distributed`` cluster; results are combined in a tree
  *on the workers* (``FANOUT`` per combine task, combines ahead of new leaves), and only the root
  crosses to the client. A task lost with its worker is recomputed by Dask (its lineage is the
  task description), so the result does not change.

:func:`open_executor` turns what a user passes (``"local:4"``, ``"tcp://host:8786"``, a
``distributed.Client``, an executor) into an executor, and closes what it started.

>>> with LocalExecutor(2) as ex:
...     ex.map_reduce(_square, [1, 2, 3], _total)
14
"""
from __future__ import annotations

import contextlib
import os
import resource
import signal
import sys
import threading
from typing import Any, Callable, Iterator, Optional, Sequence

from ..errors import ClusterError, MissingDependency
from .workers import run_ordered

__all__ = ["DaskExecutor", "Executor", "FANOUT", "LocalExecutor", "check_cluster_spec", "open_executor",
           "worker_peak_rss"]

#: Results combined per combine step (the fan-in of the reduction tree).
FANOUT = 4
#: The optional dependencies a cluster run needs (the ``cluster`` extra).
CLUSTER_EXTRA = "pip install \"dask[distributed]\" fsspec  (bpe_core's cluster extra)"
#: The environment variable naming a running scheduler (Dask's own name for it).
SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"


class Executor:
    """Runs task functions over tasks and combines their results (see the module docstring)."""

    #: True when tasks run in other processes (they are pickled: top-level functions, small tasks).
    remote = False
    n_workers = 1

    def share(self, obj: Any) -> Any:
        """A handle to ``obj`` for ``shared=``: shipped once to each worker, not once per task."""
        return obj

    def map_reduce(self, fn: Callable, tasks: Sequence, combine: Callable[[list], Any], shared: Sequence = (),
                   on_done: Optional[Callable[[Any], None]] = None) -> Any:
        raise NotImplementedError

    def map(self, fn: Callable, tasks: Sequence, shared: Sequence = (),
            on_done: Optional[Callable[[Any], None]] = None) -> list:
        raise NotImplementedError

    def describe(self) -> dict:
        """What the run report says about where the work ran."""
        return {"engine": "threads", "workers": self.n_workers}

    def close(self) -> None:
        pass

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LocalExecutor(Executor):
    """Threads of this process (``workers.run_ordered``): the kernels release the GIL.

    >>> LocalExecutor(1).map(_square, [3, 4])
    [9, 16]
    """

    def __init__(self, num_workers: int = 1):
        self.n_workers = max(1, int(num_workers))

    def map_reduce(self, fn, tasks, combine, shared=(), on_done=None):
        tasks = list(tasks)
        levels: list[tuple[int, Any]] = []        # (level, result), levels non-increasing: in task order

        def absorb(pair) -> None:
            task, result = pair
            levels.append((0, result))
            while len(levels) >= FANOUT and all(lv == levels[-1][0] for lv, _ in levels[-FANOUT:]):
                lv = levels[-1][0]
                group = [r for _, r in levels[-FANOUT:]]
                del levels[-FANOUT:]
                levels.append((lv + 1, combine(group)))
            if on_done is not None:
                on_done(task)

        run_ordered(lambda t: (t, fn(t, *shared)), tasks, min(self.n_workers, max(1, len(tasks))), absorb)
        if len(levels) == 1:
            return levels[0][1]
        return combine([r for _, r in levels])

    def map(self, fn, tasks, shared=(), on_done=None):
        out: list = []

        def keep(pair) -> None:
            out.append(pair[1])
            if on_done is not None:
                on_done(pair[0])

        tasks = list(tasks)
        run_ordered(lambda t: (t, fn(t, *shared)), tasks, min(self.n_workers, max(1, len(tasks))), keep)
        return out


class DaskExecutor(Executor):
    """Tasks on a ``dask.distributed`` cluster, through a ``Client``.

    Results are combined in a tree on the workers: ``FANOUT`` consecutive results per combine
    task, in task order, combines given a higher priority than leaves so partial results are folded
    as soon as they exist rather than piling up in worker memory. Only the root result crosses to
    the client. Worker loss: Dask recomputes what was lost from the task descriptions (up to
    ``distributed.scheduler.allowed-failures`` times per task, then :class:`errors.ClusterError`).
    """

    remote = True

    def __init__(self, client, cluster=None, own_client: bool = False):
        self.client = client
        self._cluster = cluster          # a LocalCluster we started (closed with us), else None
        self._own_client = own_client or cluster is not None
        self.n_tasks = 0
        self.warm()

    def warm(self) -> None:
        """Import the package on every worker now, in the background (a fixed cost of ~0.3-0.7 s per
        worker process that the first task would otherwise pay while the client cuts shards)."""
        with contextlib.suppress(Exception):       # an optimisation only: the first task imports anyway
            self.client.run(_warm_worker, wait=False)

    @property
    def n_workers(self) -> int:
        return max(1, len(self.client.scheduler_info(n_workers=-1).get("workers", {})))

    def share(self, obj):
        return self.client.scatter(obj, broadcast=True, hash=False)

    def _submit(self, fn, *args, name: str, priority: int = 0):
        self.n_tasks += 1
        import uuid

        return self.client.submit(fn, *args, key=f"{name}-{uuid.uuid4().hex}", priority=priority, pure=False)

    def _drain(self, futures: list, tasks: list, on_done) -> Iterator:
        """Yield the futures as they finish (raising the first task error), calling ``on_done``."""
        from distributed import as_completed

        by_key = {f.key: t for f, t in zip(futures, tasks)}
        done = as_completed(futures)
        del futures[:]              # as_completed holds them until they finish; then they may go
        for fut in done:
            if fut.status == "error":
                _reraise(fut)
            if on_done is not None:
                on_done(by_key.pop(fut.key))
            yield fut

    def map_reduce(self, fn, tasks, combine, shared=(), on_done=None):
        tasks = list(tasks)
        if not tasks:
            return combine([])
        name = getattr(fn, "__name__", "task")
        leaves = [self._submit(fn, t, *shared, name=name) for t in tasks]
        level, depth = list(leaves), 0
        while len(level) > 1:
            depth += 1
            level = [self._submit(combine, level[i:i + FANOUT], name=f"combine{depth}", priority=depth)
                     for i in range(0, len(level), FANOUT)]
        root = level[0]
        del level
        try:
            for _ in self._drain(leaves, tasks, on_done):
                pass
            return _result(root)
        except BaseException:
            self.client.cancel([root])
            raise

    def map(self, fn, tasks, shared=(), on_done=None):
        tasks = list(tasks)
        name = getattr(fn, "__name__", "task")
        futures = [self._submit(fn, t, *shared, name=name) for t in tasks]
        keys = [f.key for f in futures]
        results: dict = {}
        pending = list(futures)
        try:
            for fut in self._drain(futures, tasks, on_done):
                results[fut.key] = _result(fut)
            return [results[k] for k in keys]
        except BaseException:
            self.client.cancel(pending)
            raise

    def worker_peaks(self) -> dict:
        """Peak RSS of each worker process so far (``getrusage`` on the worker), by address."""
        try:
            return {addr: int(v) for addr, v in self.client.run(worker_peak_rss).items()}
        except Exception:          # noqa: BLE001 -- a report figure; a worker may be gone
            return {}

    def describe(self) -> dict:
        info = {"engine": "dask", "scheduler": self.client.scheduler.address, "workers": self.n_workers,
                "tasks": self.n_tasks}
        link = _dashboard_link(self.client)
        if link:
            info["dashboard"] = link
        peaks = self.worker_peaks()
        if peaks:
            info["worker_peak_rss_bytes"] = peaks
        return info

    def close(self) -> None:
        with deferred_signals():        # a close cut short leaves Dask's atexit hook ~10 s of waiting
            if self._own_client:
                self._own_client = False
                self.client.close()
            if self._cluster is not None:
                self._cluster.close()
                self._cluster = None


def _result(fut):
    try:
        return fut.result()
    except Exception as exc:
        if type(exc).__name__ == "KilledWorker":
            raise ClusterError(f"a task kept losing its worker, Dask gave up: {exc}") from None
        raise


def _reraise(fut) -> None:
    _result(fut)


def _dashboard_link(client) -> Optional[str]:
    try:
        return client.dashboard_link if client.scheduler_info().get("services", {}).get("dashboard") else None
    except Exception:              # noqa: BLE001
        return None


async def _warm_worker() -> None:
    """Run on each worker by ``DaskExecutor.warm``: import the package (its kernels, numpy). A
    coroutine, as ``Client.run(wait=False)`` requires; the import holds the worker's event loop
    for its fraction of a second, as the first task's unpickling would."""
    import importlib

    importlib.import_module(__name__.split(".")[0])


def worker_cpu_seconds() -> float:
    """User + system CPU seconds of this process so far (``benchmarks/bench_cluster.py`` runs it on
    each worker before and after a phase)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def worker_peak_rss() -> int:
    """Peak resident bytes of this process (run on each worker by ``DaskExecutor.worker_peaks``)."""
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def check_cluster_spec(spec: Any) -> Any:
    """Check the form of a ``cluster=`` value without connecting; returns it.

    >>> check_cluster_spec("local:2"), check_cluster_spec(None)
    ('local:2', None)
    >>> check_cluster_spec("local:x")
    Traceback (most recent call last):
    ...
    ValueError: cluster: 'local:x': expected local:N with N >= 1 worker processes
    """
    if spec is None or isinstance(spec, Executor) or (hasattr(spec, "submit") and hasattr(spec, "scheduler")):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"cluster: expected local:N, a scheduler address or a distributed.Client, got {spec!r}")
    text = spec.strip()
    if text == "local" or text.startswith("local:"):
        n = text.partition(":")[2]
        if n and (not n.isdigit() or int(n) < 1):
            raise ValueError(f"cluster: {spec!r}: expected local:N with N >= 1 worker processes")
    elif text not in ("", "env") and "://" not in text:
        raise ValueError(f"cluster: {spec!r}: expected local:N, a scheduler address such as "
                         f"tcp://host:8786, or env ({SCHEDULER_ENV})")
    return spec


#: Dask's statistical profiler samples each worker's stack every 10 ms: CPU the workers spend
#: besides the tasks. Off on the LocalClusters started here unless this variable sets it.
PROFILE_ENV = "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED"
#: Dask's nanny starts workers with ``MALLOC_TRIM_THRESHOLD_=65536``: freed table memory goes back to
#: the OS at once and the next table faults it in again (3x the page faults of the single-node
#: process, ~12% of a worker's CPU while counting; docs/cluster.md). The LocalClusters started here
#: keep glibc's default, as this process has, unless the variable is set in the environment.
TRIM_ENV = "MALLOC_TRIM_THRESHOLD_"


def _quiet_workers():
    """A config context for starting a ``LocalCluster`` (its nannies copy the config they see)."""
    import dask

    settings: dict = {}
    if os.environ.get(PROFILE_ENV) is None:
        settings["distributed.worker.profile.enabled"] = False
    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {})
    if TRIM_ENV in environ and os.environ.get(TRIM_ENV) is None:
        del environ[TRIM_ENV]
        settings["distributed.nanny.pre-spawn-environ"] = environ
    return dask.config.set(settings)


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back while a local cluster starts or closes; deliver them after.

    A ``LocalCluster`` interrupted half-way through starting or closing is finished by Dask's
    ``atexit`` hook instead, which waits out its timeouts (~10 s) and prints tracebacks. Both steps
    take a fraction of a second, so a signal is raised again right after (the process's own
    handler: ``KeyboardInterrupt``, ``workers.Terminated``, or the default action); a second
    signal meanwhile is raised at once. Outside the main thread this does nothing.

    >>> with deferred_signals():
    ...     pass
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    old = {}

    def hold(signum, frame):
        if pending:                               # asked twice: stop waiting
            signal.signal(signum, old[signum])
            signal.raise_signal(signum)
        pending.append(signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        old[sig] = signal.signal(sig, hold)
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if pending:
            signal.raise_signal(pending[0])


#: How long a scheduler address may take to answer (``distributed.Client(timeout=...)``).
CONNECT_TIMEOUT = "10s"


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail at once, in one line, when nothing listens at a ``tcp://``/``tls://`` address (Dask
    itself retries until its timeout). Other schemes are left to Dask."""
    scheme, _, rest = address.partition("://")
    if scheme not in ("tcp", "tls"):
        return
    rest = rest.rstrip("/")
    host, _, port = rest.rpartition(":")
    if not port.isdigit() or host.count(":") and not host.startswith("["):
        host, port = rest, "8786"                 # Dask's default scheduler port
    if not host:
        raise ValueError(f"cluster: {address!r}: expected {scheme}://host:port")
    import socket

    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except socket.gaierror as exc:
        raise ClusterError(f"cannot reach the Dask scheduler at {address}: unknown host {host} "
                           f"({exc.strerror or exc})") from None
    except OSError as exc:
        raise ClusterError(f"cannot reach the Dask scheduler at {address}: {exc.strerror or exc}") from None


#: What a worker process says when it finds itself started while the calling script was imported.
NO_MAIN_GUARD = ("cluster='local:N' starts worker processes that import the calling script again: "
                 "put the code that runs under `if __name__ == \"__main__\":` (docs/cluster.md)")


def _check_not_bootstrapping() -> None:
    """In a worker process that is still importing the calling script (no ``__main__`` guard),
    stop it with one line rather than start a cluster of its own (which fails with pages of
    tracebacks from every process)."""
    import multiprocessing

    if getattr(multiprocessing.process.current_process(), "_inheriting", False):
        raise SystemExit(f"bpe_core: error: {NO_MAIN_GUARD}")


def _distributed():
    try:
        import distributed
    except ImportError:
        raise MissingDependency(f"running on a cluster needs Dask: {CLUSTER_EXTRA}") from None
    return distributed


@contextlib.contextmanager
def open_executor(spec: Any = None, num_workers: int = 1, announce: Optional[Callable[[str], None]] = None,
                  **cluster_options) -> Iterator[Executor]:
    """The executor a ``cluster=`` argument names; what this starts is closed on exit.

    ``spec``: None (this machine's threads, ``num_workers`` of them); an :class:`Executor` (used as
    is); a ``distributed.Client`` (used as is, not closed); ``"local"`` / ``"local:N"`` (a
    ``LocalCluster`` of N worker processes, one thread each, on 127.0.0.1); a scheduler address
    (``"tcp://host:8786"``, any ``scheme://``); ``"env"`` or ``""`` (the address in
    ``DASK_SCHEDULER_ADDRESS``). ``announce(line)`` gets the dashboard link once.
    ``cluster_options`` go to ``LocalCluster`` (tests turn the dashboard off).

    Raises:
        ValueError: a spec that is none of these. MissingDependency: Dask is not installed.
        ClusterError: the scheduler cannot be reached.

    >>> with open_executor(None, 2) as ex:
    ...     type(ex).__name__, ex.n_workers
    ('LocalExecutor', 2)
    """
    check_cluster_spec(spec)
    if spec is None:
        yield LocalExecutor(num_workers)
        return
    if isinstance(spec, Executor):
        yield spec
        return
    if not isinstance(spec, str):                       # a distributed.Client
        yield DaskExecutor(spec)
        return
    text = spec.strip()
    if text in ("", "env"):
        text = os.environ.get(SCHEDULER_ENV, "")
        if not text:
            raise ValueError(f"cluster: no scheduler address given and {SCHEDULER_ENV} is not set")
    if text == "local" or text.startswith("local:"):
        import logging

        n = text.partition(":")[2]
        distributed = _distributed()
        _check_not_bootstrapping()
        # CRITICAL: a task's error reaches the client as itself (one line from the tool); the
        # workers' and nannies' ERROR logs of it would add a traceback on stderr.
        options = dict(n_workers=int(n) if n else (os.cpu_count() or 1), threads_per_worker=1, processes=True,
                       host="127.0.0.1", dashboard_address="127.0.0.1:0", silence_logs=logging.CRITICAL)
        options.update(cluster_options)
        ex = None
        try:
            with deferred_signals():       # a signal held back is raised here, ex then closed below
                try:
                    with _quiet_workers():
                        cluster = distributed.LocalCluster(**options)
                except Exception as exc:   # noqa: BLE001  (Dask raises RuntimeError, AssertionError, ...)
                    raise ClusterError(f"could not start {options['n_workers']} local worker processes "
                                       f"({type(exc).__name__}: {exc}); if this is a script: "
                                       f"{NO_MAIN_GUARD}") from None
                try:
                    client = distributed.Client(cluster)
                except BaseException:
                    cluster.close()
                    raise
                ex = DaskExecutor(client, cluster)
        except BaseException:
            if ex is not None:
                ex.close()
            raise
    elif "://" in text:
        distributed = _distributed()
        _check_reachable(text)
        try:
            client = distributed.Client(text, timeout=cluster_options.get("timeout", CONNECT_TIMEOUT))
        except Exception as exc:           # noqa: BLE001  (not a Dask scheduler: any error of its reply)
            raise ClusterError(f"cannot reach the Dask scheduler at {text}: {type(exc).__name__}: {exc} "
                               "(is it the scheduler's address, not the dashboard's?)") from None
        ex = DaskExecutor(client, own_client=True)
    else:
        raise ValueError(f"cluster: {text!r}: expected a scheduler address such as tcp://host:8786")
    try:
        link = _dashboard_link(ex.client)
        if announce is not None and link:
            announce(f"dask dashboard: {link}")
        yield ex
    finally:
        ex.close()


# Doctest helpers (top-level so a cluster could pickle them too).
def _square(x: int) -> int:
    return x * x


def _total(values: list) -> int:
    return sum(values)
