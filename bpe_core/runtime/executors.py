"""Executors: where the data-parallel phases run -- this machine's threads, or a Dask cluster.

The interface is small on purpose, so another engine (Ray, ...) is one more class and no method
changes:

- ``map_reduce(fn, tasks, combine, shared=())``: ``fn(task, *shared)`` for every task, the results
  combined by ``combine(list_of_results)`` (an associative fold that keeps task order) into one
  result, which the caller receives;
- ``map(fn, tasks, shared=())``: ``fn(task, *shared)`` for every task, the (small) results back in
  task order;
- ``share(obj, recomputable=False)``: ship a large read-only object once (a word table), not once
  per task; pass what it returns in ``shared``. ``recomputable`` (an object of a few MB: a
  tokenizer's tables): a worker lost with it costs a recomputation, never the run.

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
import time
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
#: Seconds a cluster run waits, by default, for a worker when none is connected (at the start, or
#: after losing every worker), and the base of how long it may go without a task finishing
#: (``DaskExecutor.stall_seconds``); ``--cluster-timeout`` / ``cluster_timeout=`` set it.
CLUSTER_TIMEOUT = 30.0
#: The no-progress bound (``DaskExecutor.stall_seconds``): this many timeouts, plus the largest
#: task's bytes at the slowest rate a task is assumed to read its input.
STALL_TIMEOUTS = 4
SLOWEST_BYTES_PER_SECOND = 256 << 10
#: The most seconds a scheduler address may take to answer as a scheduler.
CONNECT_SECONDS = 10.0
#: The most seconds closing the client, or a local cluster, may take.
CLOSE_SECONDS = 10.0
#: A test hook (``tests/runtime/test_cluster_faults.py``): a folder. When it is set where the client
#: runs, each task of ``map`` / ``map_reduce`` (not the combines) first writes ``started-<pid>-...``
#: there, then waits for a file ``go`` in it: a fault can be made at a known phase of a run.
TASK_GATE_ENV = "BPE_CORE_TEST_TASK_GATE"


class Executor:
    """Runs task functions over tasks and combines their results (see the module docstring)."""

    #: True when tasks run in other processes (they are pickled: top-level functions, small tasks).
    remote = False
    n_workers = 1

    def share(self, obj: Any, recomputable: bool = False) -> Any:
        """A handle to ``obj`` for ``shared=``: shipped once to each worker, not once per task.

        ``recomputable``: for an object of a few MB (a tokenizer's tables), kept where a lost worker
        cannot take the only copy (on a cluster: inside a task the scheduler can run again)."""
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

    Every wait has a bound (``timeout`` seconds, :data:`CLUSTER_TIMEOUT` by default): the run stops
    with :class:`errors.ClusterError` when the scheduler is lost, when no worker has been connected
    for ``timeout`` seconds, or when no task has finished for ``timeout`` seconds plus the time the
    largest task takes at :data:`SLOWEST_BYTES_PER_SECOND` (:meth:`stall_seconds`). A Dask error of
    the client's own (a closed connection, a timeout) is a ``ClusterError`` too; a task's error is
    raised as itself.
    """

    remote = True

    def __init__(self, client, cluster=None, own_client: bool = False, timeout: Optional[float] = None):
        self.client = client
        self._cluster = cluster          # a LocalCluster we started (closed with us), else None
        self._own_client = own_client or cluster is not None
        self.timeout = cluster_timeout(timeout)
        self.address = _scheduler_address(client)
        self.n_tasks = 0
        self._no_worker_since: Optional[float] = None
        self._next_check = 0.0
        self._last_progress = time.monotonic()
        self._gate = os.environ.get(TASK_GATE_ENV) or None
        self.warm()

    def warm(self) -> None:
        """Import the package on every worker now, in the background (a fixed cost of ~0.3-0.7 s per
        worker process that the first task would otherwise pay while the client cuts shards)."""
        with contextlib.suppress(Exception):       # an optimisation only: the first task imports anyway
            self.client.run(_warm_worker, wait=False)

    @property
    def n_workers(self) -> int:
        return max(1, self._count_workers() or 0)

    def _count_workers(self) -> Optional[int]:
        """The workers connected to the scheduler now (None when it does not answer in 5 s)."""
        try:           # {worker address: threads}: one small message, in every Dask version
            return len(self.client.sync(self.client.scheduler.ncores, callback_timeout=5))
        except Exception:          # noqa: BLE001 -- the scheduler is gone or does not answer
            return None

    def wait_for_workers(self) -> None:
        """Return once a worker is connected; ``ClusterError`` after ``timeout`` seconds without one."""
        try:
            self.client.wait_for_workers(1, timeout=self.timeout)
        except Exception as exc:   # noqa: BLE001 -- Dask's TimeoutError, or a lost connection
            if self.client.status not in ("running", "newly-created"):
                raise self._lost_scheduler() from None
            raise ClusterError(f"no worker joined the Dask scheduler at {self.address} within "
                               f"{self.timeout:g} s: start workers (dask worker {self.address}), or give "
                               f"them longer with --cluster-timeout ({type(exc).__name__})") from None

    def share(self, obj, recomputable: bool = False):
        """``recomputable``: the object travels inside a task (the scheduler holds its bytes), so
        when the worker holding the only copy is lost -- Dask's active memory manager drops the
        extra copies of a broadcast -- the scheduler computes it again and the run goes on.
        Otherwise it is scattered to every worker (nothing kept on the scheduler: for large
        tables; the local clusters started here keep every copy, their memory manager is off)."""
        import uuid

        with _cluster_calls(self):
            if recomputable:
                return self.client.submit(_value, obj, key=f"shared-{uuid.uuid4().hex}", pure=False)
            return self.client.scatter(obj, broadcast=True, hash=False, timeout=self.timeout)

    def _submit(self, fn, *args, name: str, priority: int = 0, leaf: bool = True):
        self.n_tasks += 1
        import uuid

        if leaf and self._gate:
            fn, args = _gated, (self._gate, fn, *args)
        with _cluster_calls(self):
            return self.client.submit(fn, *args, key=f"{name}-{uuid.uuid4().hex}", priority=priority, pure=False)

    def stall_seconds(self, tasks: Sequence = ()) -> float:
        """How long the run may go without a task finishing while workers are connected:
        :data:`STALL_TIMEOUTS` times ``timeout`` plus the largest task's bytes read at
        :data:`SLOWEST_BYTES_PER_SECOND` (a safety net: a lost scheduler or lost workers are
        caught sooner; this catches workers that are there but do nothing, e.g. paused).

        >>> ex = DaskExecutor.__new__(DaskExecutor)
        >>> ex.timeout = 30.0
        >>> ex.stall_seconds([]), ex.stall_seconds([(0, _Sized(64 << 20))])
        (120.0, 376.0)
        """
        largest = max((_task_bytes(t) for t in tasks), default=0)
        return STALL_TIMEOUTS * self.timeout + largest / SLOWEST_BYTES_PER_SECOND

    def _watch(self, stall: float) -> None:
        """Raise ``ClusterError`` when the cluster cannot finish the work (checked once a second)."""
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + 1.0
        if self.client.status not in ("running", "newly-created"):
            raise self._lost_scheduler()
        n = self._count_workers()
        if not n:                  # none, or the scheduler does not answer: the same clock
            self._no_worker_since = self._no_worker_since or now
            if now - self._no_worker_since > self.timeout:
                if n is None:
                    raise self._lost_scheduler()
                raise self._workers_gone(f" (none for {self.timeout:g} s)")
            return                 # (the stall below is about workers that are there)
        if self._no_worker_since is not None:       # workers again: their tasks start now
            self._no_worker_since, self._last_progress = None, now
        if now - self._last_progress > stall:
            raise ClusterError(f"no task finished for {stall:.0f} s on the Dask cluster at {self.address} "
                               f"({n} worker(s) connected); the run stopped and wrote nothing: check the "
                               f"workers, or give slow tasks longer with --cluster-timeout")

    def _workers_gone(self, how_long: str = "") -> ClusterError:
        return ClusterError(f"every worker of the Dask cluster at {self.address} is gone{how_long}; the run "
                            f"stopped and wrote nothing: start workers (dask worker {self.address}) and run again")

    def _lost_scheduler(self) -> ClusterError:
        return ClusterError(f"lost the Dask scheduler at {self.address}; the run stopped and wrote nothing: "
                            f"check the scheduler and run again")

    def _drain(self, futures: list, tasks: list, on_done, stall: float) -> Iterator:
        """Yield the futures as they finish (raising the first task error), calling ``on_done``;
        ``ClusterError`` when the cluster cannot finish them (``_watch``)."""
        from distributed import as_completed

        by_key = {f.key: t for f, t in zip(futures, tasks)}
        with _cluster_calls(self):
            done = as_completed(futures)
        del futures[:]              # as_completed holds them until they finish; then they may go
        self._last_progress = time.monotonic()
        while True:
            batch = done.next_batch(block=False)
            if not batch:
                if done.is_empty():
                    return
                self._watch(stall)
                with done.thread_condition:
                    done.thread_condition.wait(timeout=0.1)
                continue
            self._last_progress = time.monotonic()
            for fut in batch:
                if fut.status in ("lost", "pending"):   # its result went with a worker after it finished:
                    done.add(fut)                       # the scheduler computes it again; wait for that
                    continue
                if fut.status != "finished":
                    self._raise_for(fut)
                if on_done is not None:
                    on_done(by_key.pop(fut.key))
                yield fut

    def _result(self, fut, stall: float):
        """The result of a future, waited for under the same watch as ``_drain``."""
        for _ in self._drain([fut], [None], None, stall):
            pass
        try:
            with _cluster_calls(self):
                return fut.result(timeout=stall)
        except ClusterError:
            if fut.status in ("error", "cancelled"):
                self._raise_for(fut)
            raise

    def _raise_for(self, fut) -> None:
        """Raise what an unfinished future means: its task's own error, or a ``ClusterError``."""
        if fut.status == "error":
            exc = fut.exception()
            if type(exc).__name__ == "KilledWorker":
                raise ClusterError(f"a task kept losing its worker, Dask gave up: {exc}") from None
            raise exc
        if fut.status == "cancelled":     # the scheduler went, or data the task needed went with its workers
            n = self._count_workers() if self.client.status in ("running", "newly-created") else None
            if n is None:
                raise self._lost_scheduler()
            if n == 0:
                raise self._workers_gone()
            why = getattr(getattr(getattr(fut, "_state", None), "exception", None), "reason", None) or "unknown"
            raise ClusterError(f"a task on the Dask cluster at {self.address} was cancelled (Dask: {why}); the "
                               f"run stopped and wrote nothing: run again")
        raise ClusterError(f"a task on the Dask cluster at {self.address} ended as {fut.status!r}")

    def map_reduce(self, fn, tasks, combine, shared=(), on_done=None):
        tasks = list(tasks)
        if not tasks:
            return combine([])
        stall = self.stall_seconds(tasks)
        name = getattr(fn, "__name__", "task")
        leaves = [self._submit(fn, t, *shared, name=name) for t in tasks]
        level, depth = list(leaves), 0
        while len(level) > 1:
            depth += 1
            level = [self._submit(combine, level[i:i + FANOUT], name=f"combine{depth}", priority=depth, leaf=False)
                     for i in range(0, len(level), FANOUT)]
        root = level[0]
        del level
        try:
            for _ in self._drain(leaves, tasks, on_done, stall):
                pass
            return self._result(root, stall)
        except BaseException:
            self._cancel([root])
            raise

    def map(self, fn, tasks, shared=(), on_done=None):
        tasks = list(tasks)
        stall = self.stall_seconds(tasks)
        name = getattr(fn, "__name__", "task")
        futures = [self._submit(fn, t, *shared, name=name) for t in tasks]
        keys = [f.key for f in futures]
        results: dict = {}
        pending = list(futures)
        try:
            for fut in self._drain(futures, tasks, on_done, stall):
                results[fut.key] = self._result(fut, stall)
            return [results[k] for k in keys]
        except BaseException:
            self._cancel(pending)
            raise

    def _cancel(self, futures: list) -> None:
        """Cancel what is left (best effort, bounded: the scheduler may be gone)."""
        if self.client.status == "running":
            with contextlib.suppress(Exception):
                self.client.sync(self.client._cancel, futures, callback_timeout=5)

    def worker_peaks(self) -> dict:
        """Peak RSS of each worker process so far (``getrusage`` on the worker), by address."""
        try:
            return {addr: int(v) for addr, v in
                    self.client.sync(self.client._run, worker_peak_rss, callback_timeout=10).items()}
        except Exception:          # noqa: BLE001 -- a report figure; a worker may be gone
            return {}

    def describe(self) -> dict:
        info = {"engine": "dask", "scheduler": self.address, "workers": self.n_workers,
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
                lost = self.client.status not in ("running", "newly-created")
                with contextlib.suppress(Exception):     # a lost scheduler: nothing left to tell it
                    self.client.close(timeout=1 if lost else CLOSE_SECONDS)
            if self._cluster is not None:
                cluster, self._cluster = self._cluster, None
                with contextlib.suppress(Exception):
                    cluster.close(timeout=CLOSE_SECONDS)


@contextlib.contextmanager
def _cluster_calls(ex: "DaskExecutor") -> Iterator[None]:
    """Dask's own errors in a client call (a closed connection, a timeout, a cancelled future) as
    one ``ClusterError`` naming the scheduler; ``KeyboardInterrupt`` and other errors pass."""
    import asyncio
    import concurrent.futures

    try:
        yield
    except ClusterError:
        raise
    except (asyncio.CancelledError, concurrent.futures.CancelledError):
        raise ex._lost_scheduler() from None
    except Exception as exc:       # noqa: BLE001 -- only Dask's and the connection's own errors
        if not (isinstance(exc, (OSError, TimeoutError, asyncio.TimeoutError))
                or type(exc).__module__.split(".")[0] in ("distributed", "tornado")):
            raise
        if ex.client.status not in ("running", "newly-created"):
            raise ex._lost_scheduler() from None
        what = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise ClusterError(f"the Dask cluster at {ex.address} failed: {type(exc).__name__}"
                           f"{': ' + what if what else ''}") from None


def _value(obj: Any) -> Any:
    """The task of ``DaskExecutor.share(obj, recomputable=True)``."""
    return obj


def _gated(gate: str, fn: Callable, *args) -> Any:
    """``fn(*args)`` once the file ``go`` exists in ``gate`` (:data:`TASK_GATE_ENV`, tests only);
    it says it started first."""
    import uuid

    with open(os.path.join(gate, f"started-{os.getpid()}-{uuid.uuid4().hex[:8]}"), "w"):
        pass
    while not os.path.exists(os.path.join(gate, "go")):
        time.sleep(0.02)
    return fn(*args)


def _task_bytes(task: Any) -> int:
    """The bytes a task reads, when it says (``n_bytes`` of a shard, or of one inside a tuple)."""
    for t in (task, *(task if isinstance(task, tuple) else ())):
        n = getattr(t, "n_bytes", None)
        if isinstance(n, int):
            return n
    return 0


class _Sized:
    """A task of ``n_bytes`` (doctest helper)."""

    def __init__(self, n_bytes: int):
        self.n_bytes = n_bytes


def _scheduler_address(client) -> str:
    try:
        return str(client.scheduler.address)
    except Exception:              # noqa: BLE001
        return "(unknown address)"


def cluster_timeout(value: Any = None) -> float:
    """Seconds from a ``cluster_timeout`` value: None (:data:`CLUSTER_TIMEOUT`), a number, or Dask's
    form (``"30s"``, ``"2 minutes"``).

    >>> cluster_timeout(), cluster_timeout(5), cluster_timeout("2 minutes")
    (30.0, 5.0, 120.0)
    >>> cluster_timeout(0)
    Traceback (most recent call last):
    ...
    ValueError: cluster_timeout: 0: expected a positive number of seconds
    """
    if value is None:
        return CLUSTER_TIMEOUT
    seconds = value
    if isinstance(value, str):
        try:
            seconds = float(value)
        except ValueError:
            try:
                from dask.utils import parse_timedelta

                seconds = parse_timedelta(value)
            except (ImportError, ValueError, KeyError, TypeError, AttributeError):
                raise ValueError(f"cluster_timeout: {value!r}: expected a number of seconds") from None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0 \
            or seconds == float("inf"):
        raise ValueError(f"cluster_timeout: {value}: expected a positive number of seconds")
    return float(seconds)


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

    # The active memory manager drops all but one copy of a scattered table; with the worker
    # holding it the table is lost (it cannot be computed again) and so is the run.
    settings: dict = {"distributed.scheduler.active-memory-manager.start": False}
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
        if signal.getsignal(sig) != signal.SIG_IGN:    # an ignored one stays ignored (a background job),
            old[sig] = signal.signal(sig, hold)       # and so in the worker processes started meanwhile
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if pending:
            signal.raise_signal(pending[0])


def _check_reachable(address: str, timeout: Optional[float] = None) -> None:
    """Fail within ``timeout`` seconds, in one line, unless a Dask scheduler answers at a ``tcp://``
    address: nothing listening (Dask itself retries until its timeout), something that says nothing
    (Dask would wait for ever), or something whose first bytes are not Dask's framing (an HTTP
    server, garbage: Dask reads them as a frame length and tries to allocate it). A scheduler sends
    its handshake -- a small frame naming its pickle protocol -- as soon as it accepts a connection.
    ``tls://`` is checked for a listener only; other schemes are left to Dask."""
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
    import struct

    timeout = CONNECT_SECONDS if timeout is None else timeout
    deadline = time.monotonic() + timeout
    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
    except socket.gaierror as exc:
        raise ClusterError(f"cannot reach the Dask scheduler at {address}: unknown host {host} "
                           f"({exc.strerror or exc})") from None
    except OSError as exc:
        raise ClusterError(f"cannot reach the Dask scheduler at {address}: {exc.strerror or exc}") from None
    not_dask = (f"{address} is not a Dask scheduler: {{}}; give the scheduler's address "
                f"(tcp://host:8786 by default), not the dashboard's or another service's")
    with sock:
        if scheme == "tls":
            return
        got = b""
        try:
            while len(got) < 8 or len(got) < 8 + min(struct.unpack("<Q", got[:8])[0], 1 << 16):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout
                sock.settimeout(left)
                part = sock.recv(1 << 16)
                if not part:
                    break
                got += part
                if len(got) >= 8 and not 0 < struct.unpack("<Q", got[:8])[0] <= 1 << 16:
                    break                             # no handshake is that long: not Dask's framing
        except socket.timeout:
            if not got:
                raise ClusterError(not_dask.format(f"it accepted the connection but sent nothing in "
                                                   f"{timeout:g} s")) from None
        except OSError as exc:
            raise ClusterError(f"cannot reach the Dask scheduler at {address}: {exc.strerror or exc}") from None
    if not got:
        raise ClusterError(not_dask.format("it closed the connection without a word"))
    if got.startswith(b"HTTP/"):
        raise ClusterError(not_dask.format("it answers HTTP"))
    if len(got) < 8 or not 0 < struct.unpack("<Q", got[:8])[0] <= 1 << 16 or b"pickle-protocol" not in got:
        raise ClusterError(not_dask.format("its reply is not Dask's protocol"))


@contextlib.contextmanager
def _quiet_client_logs() -> Iterator[None]:
    """Dask's loggers in this process at CRITICAL for the block: a lost scheduler or worker is the
    one ``ClusterError`` the caller gets, not also the client's ERROR logs with their tracebacks
    (its reconnection cancelled on close: 47 lines). Levels are restored after a block that ends
    well; after an error they stay (the client's reconnection may still log as it gives up)."""
    import logging

    names = ["distributed"] + [n for n in list(logging.root.manager.loggerDict) if n.startswith("distributed.")]
    saved = {n: logging.getLogger(n).level for n in names}
    for n in names:
        if n == "distributed" or saved[n] != logging.NOTSET:
            logging.getLogger(n).setLevel(logging.CRITICAL)
    yield
    for n, level in saved.items():
        logging.getLogger(n).setLevel(level)


@contextlib.contextmanager
def _sigint_blocked() -> Iterator[None]:
    """SIGINT blocked in this thread for the block: the threads started meanwhile (a local cluster's
    event loop, which starts and restarts the worker processes) and the processes they start keep
    it blocked; the main thread takes a Ctrl-C as before once the block ends (one that came
    meanwhile is delivered then)."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    from multiprocessing import resource_tracker

    # Starting the resource tracker unblocks SIGINT in the thread that starts it; every worker
    # process start checks it is running, so start it now, before blocking.
    resource_tracker.ensure_running()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


#: The module each worker process of a local cluster runs as it starts (SIGINT ignored there).
LOCAL_WORKER_PRELOAD = "bpe_core.runtime.local_worker"


#: What a worker process says when it finds itself started while the calling script was imported.
NO_MAIN_GUARD = ("cluster='local:N' starts worker processes that import the calling script again: "
                 "put the code that runs under `if __name__ == \"__main__\":` (docs/cluster.md)")


def _script_hint() -> str:
    """What a failed local cluster start adds: the ``__main__``-guard hint, unless a command of
    bpe_core (``bpe-core``, ``tools/*.py``) is what runs -- its workers never re-run a user's script.

    >>> import sys, types
    >>> saved = sys.modules.get("bpe_core.cli._start")
    >>> sys.modules["bpe_core.cli._start"] = types.SimpleNamespace(in_command=True)
    >>> _script_hint()
    ''
    >>> sys.modules["bpe_core.cli._start"] = types.SimpleNamespace(in_command=False)
    >>> _script_hint().startswith("; if this is a script: ")
    True
    >>> if saved is None: del sys.modules["bpe_core.cli._start"]
    ... else: sys.modules["bpe_core.cli._start"] = saved
    """
    start = sys.modules.get("bpe_core.cli._start")
    if start is not None and getattr(start, "in_command", False):
        return ""
    return f"; if this is a script: {NO_MAIN_GUARD}"


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
                  timeout: Any = None, **cluster_options) -> Iterator[Executor]:
    """The executor a ``cluster=`` argument names; what this starts is closed on exit.

    ``spec``: None (this machine's threads, ``num_workers`` of them); an :class:`Executor` (used as
    is); a ``distributed.Client`` (used as is, not closed); ``"local"`` / ``"local:N"`` (a
    ``LocalCluster`` of N worker processes, one thread each, on 127.0.0.1); a scheduler address
    (``"tcp://host:8786"``, any ``scheme://``); ``"env"`` or ``""`` (the address in
    ``DASK_SCHEDULER_ADDRESS``). ``announce(line)`` gets the dashboard link once.
    ``timeout``: the cluster's bound in seconds (``cluster_timeout``; :data:`CLUSTER_TIMEOUT` by
    default): how long to wait for a first worker, and the base of every later wait
    (:class:`DaskExecutor`). ``cluster_options`` go to ``LocalCluster`` (tests turn the dashboard off).

    A local cluster's worker processes start with SIGINT blocked, then ignore it
    (:data:`LOCAL_WORKER_PRELOAD`): a Ctrl-C that reaches the whole process group (a terminal's) is
    this process's alone to act on -- it stops the run and closes the cluster -- instead of a
    ``KeyboardInterrupt`` traceback from every worker.

    Raises:
        ValueError: a spec that is none of these. MissingDependency: Dask is not installed.
        ClusterError: the scheduler cannot be reached, is not a Dask scheduler (checked within
        :data:`CONNECT_SECONDS`), or no worker joins it within ``timeout`` seconds.

    >>> with open_executor(None, 2) as ex:
    ...     type(ex).__name__, ex.n_workers
    ('LocalExecutor', 2)
    """
    check_cluster_spec(spec)
    seconds = cluster_timeout(timeout)
    if spec is None:
        yield LocalExecutor(num_workers)
        return
    if isinstance(spec, Executor):
        yield spec
        return
    if not isinstance(spec, str):                       # a distributed.Client
        yield DaskExecutor(spec, timeout=seconds)
        return
    text = spec.strip()
    if text in ("", "env"):
        text = os.environ.get(SCHEDULER_ENV, "")
        if not text:
            raise ValueError(f"cluster: no scheduler address given and {SCHEDULER_ENV} is not set")
    if text == "local" or text.startswith("local:") or "://" in text:
        _distributed()              # imported (its logging set up) before its loggers are quieted
    with _quiet_client_logs():      # Dask's ERROR logs of a lost scheduler or worker: the one line says it
        if text == "local" or text.startswith("local:"):
            import logging

            n = text.partition(":")[2]
            distributed = _distributed()
            _check_not_bootstrapping()
            # CRITICAL: a task's error reaches the client as itself (one line from the tool); the
            # workers' and nannies' ERROR logs of it would add a traceback on stderr.
            options = dict(n_workers=int(n) if n else (os.cpu_count() or 1), threads_per_worker=1, processes=True,
                           host="127.0.0.1", dashboard_address="127.0.0.1:0", silence_logs=logging.CRITICAL,
                           preload=[LOCAL_WORKER_PRELOAD])
            options.update(cluster_options)
            ex = None
            try:
                with deferred_signals():       # a signal held back is raised here, ex then closed below
                    try:
                        with _quiet_workers(), _sigint_blocked():
                            cluster = distributed.LocalCluster(**options)
                    except Exception as exc:   # noqa: BLE001  (Dask raises RuntimeError, AssertionError, ...)
                        raise ClusterError(f"could not start {options['n_workers']} local worker processes "
                                           f"({type(exc).__name__}: {exc}){_script_hint()}") from None
                    try:
                        client = distributed.Client(cluster, timeout=f"{CONNECT_SECONDS:g}s")
                    except BaseException:
                        cluster.close(timeout=CLOSE_SECONDS)
                        raise
                    ex = DaskExecutor(client, cluster, timeout=seconds)
                ex.wait_for_workers()
            except BaseException:
                if ex is not None:
                    ex.close()
                raise
        elif "://" in text:
            distributed = _distributed()
            _check_reachable(text)
            try:
                client = distributed.Client(text, timeout=f"{CONNECT_SECONDS:g}s")
            except Exception as exc:           # noqa: BLE001  (not a Dask scheduler: any error of its reply)
                what = str(exc).splitlines()[0][:200] if str(exc) else ""
                raise ClusterError(f"cannot reach the Dask scheduler at {text}: {type(exc).__name__}"
                                   f"{': ' + what if what else ''} (is it the scheduler's address, not the "
                                   "dashboard's?)") from None
            ex = DaskExecutor(client, own_client=True, timeout=seconds)
            try:
                ex.wait_for_workers()
            except BaseException:
                ex.close()
                raise
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
