"""Memory of the process tree while it runs: RSS sampling, a budget guard, and phase labels.

- :func:`tree_rss` sums the resident memory of a process and all its descendants;
  :func:`tree_memory` splits it into anonymous memory (``RssAnon`` + ``RssShmem`` of
  ``/proc/<pid>/status``: what a ``--memory-limit`` bounds, and what a memory cgroup cannot take back)
  and file-backed pages (``RssFile``: mapped files, page cache the kernel may drop and read again).
- :class:`MemoryMonitor` samples it on a thread (peak, samples, per-phase peaks) and lets the
  trainer hold back new chunks while the tree is close to the budget (:meth:`MemoryMonitor.wait_below`,
  :meth:`MemoryMonitor.headroom`).
- :func:`numpy_huge_pages` turns numpy's huge-page hint for its large arrays off (or on) for a block;
  :func:`huge_pages_ready` says whether the kernel can give huge pages without compacting memory.
- :func:`phase` marks the start of a phase (``"pretokenize"``, ``"merge loop"``, ...). It appends
  ``"<unix time> <name>"`` to the file named by ``BPE_CORE_PHASE_FILE`` when that is set (so
  ``tools/profile_memory.py`` can shade phases of any process it runs) and tells every running
  monitor in this process.

>>> with MemoryMonitor(interval=0.01) as mon:
...     phase("work")
...     data = bytearray(8 << 20)
>>> mon.peak >= 8 << 20, mon.phase_name
(True, 'work')
"""
from __future__ import annotations

import array
import contextlib
import mmap
import os
import sys
import threading
import time
from typing import Iterator, Optional, Sequence

from .lazy import np  # numpy on first use (a small run never imports it)

from .procmem import pid_exists, tree_pids

#: The environment variable naming the phase file (set by ``tools/profile_memory.py``).
PHASE_FILE_ENV = "BPE_CORE_PHASE_FILE"

_MONITORS: list["MemoryMonitor"] = []
_MONITORS_LOCK = threading.Lock()


# ==== Sampling ==============================================================================


def tree_rss(pid: Optional[int] = None) -> int:
    """Resident bytes of process ``pid`` (default: this one) plus all its descendants.

    Processes that exit while they are being read are skipped; a ``pid`` that no longer exists gives
    0. Shared pages (a forked worker's inherited pages, a file mapped by several workers) count in
    each process, as ``ps`` shows them: the sum is an upper bound on the physical memory used.

    >>> tree_rss() > 0, tree_rss(2**22 + 12345)
    (True, 0)
    """
    pids = tree_pids(pid)
    if pids is not None:                # Linux: /proc, no psutil
        total = 0
        for p in pids:
            st = _status_kib(p)
            if st is not None:
                total += st["RssAnon"] + st["RssShmem"] + st["RssFile"]
        return total
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root]
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return 0
    try:
        procs.extend(_descendants(root))
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):   # exited (ZombieProcess is a NoSuchProcess)
            pass
    return total


def _descendants(root: "psutil.Process") -> list:
    """All descendants of ``root``. On Linux from ``/proc/<pid>/task/<tid>/children`` (a few small
    files: a sampler of a process with no child reads one per thread), else, or when the kernel has
    no such files, ``psutil``'s ``children(recursive=True)``, which reads the parent of every process
    of the machine (milliseconds a sample where hundreds run). On Linux :func:`procmem.tree_pids` is
    asked first; this serves where it answers None."""
    import psutil

    try:
        out, todo, seen = [], [root.pid], {root.pid}
        while todo:
            pid = todo.pop()
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                        kids = f.read().split()
                except FileNotFoundError:
                    if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                        continue                # the thread ended
                    raise                       # no children files in this kernel
                for kid in map(int, kids):
                    if kid not in seen:
                        seen.add(kid)
                        todo.append(kid)
                        try:
                            out.append(psutil.Process(kid))
                        except psutil.NoSuchProcess:
                            pass
        return out
    except FileNotFoundError:
        if not os.path.exists(f"/proc/{root.pid}"):
            raise psutil.NoSuchProcess(root.pid)
    except (PermissionError, ValueError):
        pass
    return root.children(recursive=True)


def _status_kib(pid: int) -> Optional[dict]:
    """``RssAnon``, ``RssFile`` and ``RssShmem`` of ``/proc/<pid>/status`` in bytes (None off Linux or
    when the process is gone)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            text = f.read()
    except OSError:
        return None
    out = {}
    for line in text.split(b"\n"):
        if line.startswith((b"RssAnon:", b"RssFile:", b"RssShmem:")):
            key, _, rest = line.partition(b":")
            out[key.decode()] = int(rest.split()[0]) * 1024
    return out if len(out) == 3 else None


def tree_memory(pid: Optional[int] = None) -> dict:
    """Resident bytes of a process tree, split: ``{"rss", "anon", "file"}``.

    ``anon`` is anonymous memory (heap, numpy arrays, shared anonymous mappings), ``file`` the
    resident pages of mapped files. Off Linux, ``anon`` is the RSS and ``file`` 0.

    >>> m = tree_memory(); m["anon"] > 0 and m["rss"] >= m["anon"]
    True
    """
    pids = tree_pids(pid)
    if pids is not None:                # Linux: /proc, no psutil (which reads every process's stat)
        total = {"rss": 0, "anon": 0, "file": 0}
        for p in pids:
            st = _status_kib(p)
            if st is not None:
                total["anon"] += st["RssAnon"] + st["RssShmem"]
                total["file"] += st["RssFile"]
                total["rss"] += st["RssAnon"] + st["RssShmem"] + st["RssFile"]
        return total
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root]
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return {"rss": 0, "anon": 0, "file": 0}
    try:
        procs.extend(_descendants(root))
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass
    total = {"rss": 0, "anon": 0, "file": 0}
    for proc in procs:
        st = _status_kib(proc.pid)
        if st is not None:
            total["anon"] += st["RssAnon"] + st["RssShmem"]
            total["file"] += st["RssFile"]
            total["rss"] += st["RssAnon"] + st["RssShmem"] + st["RssFile"]
            continue
        try:
            rss = proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        total["rss"] += rss
        total["anon"] += rss
    return total


# ==== Phases ================================================================================


def phase(name: str) -> None:
    """Mark the start of phase ``name`` (it lasts until the next phase starts or the run ends).

    Cheap: one ``O_APPEND`` write of one line when ``BPE_CORE_PHASE_FILE`` is set (atomic across
    processes), with the RSS of this process tree at that moment (so a phase shorter than the
    profiler's sampling interval still has a figure: the RSS where it starts and where it ends),
    and a label on each running :class:`MemoryMonitor`.

    >>> import tempfile, os; p = os.path.join(tempfile.mkdtemp(), "phases")
    >>> os.environ[PHASE_FILE_ENV] = p
    >>> phase("merge loop"); del os.environ[PHASE_FILE_ENV]
    >>> name, rss = open(p).read().split(" ", 1)[1].split("\\t"); name, int(rss) > 0
    ('merge loop', True)
    """
    name = " ".join(str(name).split()) or "?"        # one line, no tabs or newlines
    now = time.time()
    path = os.environ.get(PHASE_FILE_ENV)
    if path:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, f"{now:.6f} {name}\t{tree_rss()}\n".encode("utf-8", "replace"))
            finally:
                os.close(fd)
        except OSError:
            pass                   # labels are a diagnostic; never fail a run over them
    with _MONITORS_LOCK:
        monitors = list(_MONITORS)
    for mon in monitors:
        mon._enter_phase(name, now)


def read_phase_file(path: str, with_rss: bool = False) -> list[tuple]:
    """The ``(unix time, name)`` lines of a phase file, sorted by time (bad lines are skipped);
    ``with_rss``: ``(unix time, name, RSS bytes or None)``.

    >>> import tempfile, os; p = os.path.join(tempfile.mkdtemp(), "phases")
    >>> _ = open(p, "w").write("2.0 merge loop\\t4096\\n1.5 plan\\njunk\\n")
    >>> read_phase_file(p)
    [(1.5, 'plan'), (2.0, 'merge loop')]
    >>> read_phase_file(p, with_rss=True)[1]
    (2.0, 'merge loop', 4096)
    """
    out = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                t, _, name = line.rstrip("\n").partition(" ")
                name, _, rss = name.partition("\t")
                try:
                    mark = (float(t), name or "?")
                except ValueError:
                    continue
                out.append(mark + (int(rss) if rss.isdigit() else None,) if with_rss else mark)
    except FileNotFoundError:
        return []
    out.sort(key=lambda x: x[0])
    return out


# ==== Monitor ===============================================================================


class MemoryMonitor:
    """Samples :func:`tree_rss` of a process tree on a background thread.

    Args:
        pid: the root process (default: this one).
        interval: seconds between samples.
        budget: the memory limit in bytes, for :meth:`headroom` (None: no budget).
        max_samples: when this many samples are kept, every other one is dropped (the peak is
            tracked separately, so it is never lost). Keeps a long run's record small.

    Attributes:
        samples: ``(unix time, rss)`` pairs.
        peak, peak_time: the largest sample and when it was taken.
        phase_name: the current phase (``None`` before the first :func:`phase`).
        phases: ``(unix time, name)`` of every phase started while the monitor ran.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(self, pid: Optional[int] = None, interval: float = 0.1, budget: Optional[int] = None,
                 max_samples: int = 50_000):
        if interval <= 0:
            raise ValueError("interval must be > 0")
        self.pid = os.getpid() if pid is None else pid
        self.interval = float(interval)
        self.budget = budget
        self.max_samples = max(2, int(max_samples))
        self.samples: list[tuple[float, int]] = []
        self.peak = 0
        self.peak_time = 0.0
        self.phase_name: Optional[str] = None
        self.phases: list[tuple[float, str]] = []
        #: CPU seconds of this process (all its threads: ``time.process_time``) spent in each phase
        self.phase_cpu: dict[str, float] = {}
        self._cpu_mark = time.process_time()
        self.phase_peaks: dict[str, int] = {}
        self.peak_anon = 0
        self.peak_file = 0
        self.phase_peaks_anon: dict[str, int] = {}
        self.phase_peaks_file: dict[str, int] = {}
        self.current_anon = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._active = False               # started and not stopped (with or without the thread)

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self, thread: bool = True) -> "MemoryMonitor":
        """Take a first sample and start the sampling thread.

        ``thread=False``: no thread; the samples are this one, the caller's :meth:`sample` calls
        and the last one at :meth:`stop` (phases are still recorded). For a run too short for the
        thread to take more than a sample or two, which costs more to start and join than it
        samples (``encode_corpus`` on a small input)."""
        if self._thread is not None or self._active:
            raise RuntimeError("monitor already started")
        self._stop.clear()
        self.sample()
        self._active = True
        if thread:
            self._thread = threading.Thread(target=self._run, name="bpe_core-memmon", daemon=True)
            self._thread.start()
        with _MONITORS_LOCK:
            _MONITORS.append(self)
        return self

    def stop(self) -> None:
        """Stop sampling (takes a last sample while the tree is still there)."""
        with _MONITORS_LOCK:
            if self in _MONITORS:
                _MONITORS.remove(self)
        if not self._active:
            return
        self._active = False
        if self._thread is not None:
            self._stop.set()
            try:
                self._thread.join()
            except RuntimeError:        # a signal ended start() before the thread ran: it never
                pass                    # will, or sees the stop at once (a daemon either way)
            self._thread = None
        self.sample()

    def __enter__(self) -> "MemoryMonitor":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._active

    # ---- sampling ---------------------------------------------------------------------------

    def sample(self) -> int:
        """Take one sample now and record it; returns the RSS (0: the root process is gone).

        The anonymous and file-backed parts are tracked too (``peak_anon``, ``peak_file``,
        ``current_anon``)."""
        mem = tree_memory(self.pid)
        rss = mem["rss"]
        now = time.time()
        if rss <= 0:
            return 0
        with self._lock:
            self.current_anon = mem["anon"]
            self.peak_anon = max(self.peak_anon, mem["anon"])
            self.peak_file = max(self.peak_file, mem["file"])
            if self.phase_name is not None:
                for peaks, v in ((self.phase_peaks_anon, mem["anon"]), (self.phase_peaks_file, mem["file"])):
                    if v > peaks.get(self.phase_name, 0):
                        peaks[self.phase_name] = v
            self.samples.append((now, rss))
            if len(self.samples) > self.max_samples:
                self.samples = self.samples[::2]
            if rss > self.peak:
                self.peak, self.peak_time = rss, now
            if self.phase_name is not None and rss > self.phase_peaks.get(self.phase_name, 0):
                self.phase_peaks[self.phase_name] = rss
        return rss

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if self.sample() == 0 and not pid_exists(self.pid):
                break

    @property
    def current(self) -> int:
        """The latest sample (0 before any)."""
        with self._lock:
            return self.samples[-1][1] if self.samples else 0

    def _enter_phase(self, name: str, when: float) -> None:
        with self._lock:
            self._charge_cpu()
            self.phase_name = name
            self.phases.append((when, name))

    def _charge_cpu(self) -> None:
        """Add the CPU time since the last mark to the current phase (``"before"`` when none yet)."""
        now = time.process_time()
        key = self.phase_name if self.phase_name is not None else "before"
        self.phase_cpu[key] = self.phase_cpu.get(key, 0.0) + now - self._cpu_mark
        self._cpu_mark = now

    def cpu_by_phase(self) -> dict:
        """CPU seconds of this process (every thread) per phase so far, rounded to ms.

        >>> with MemoryMonitor(interval=0.01) as mon:
        ...     phase("spin"); _ = sum(range(10**5))
        >>> mon.cpu_by_phase()["spin"] >= 0
        True
        """
        with self._lock:
            self._charge_cpu()
            return {k: round(v, 3) for k, v in self.phase_cpu.items()}

    # ---- budget guard -----------------------------------------------------------------------

    def headroom(self) -> int:
        """Budget minus the tree's RSS right now (a fresh sample); negative when over budget.

        Raises:
            ValueError: the monitor has no budget.
        """
        if self.budget is None:
            raise ValueError("headroom() needs a monitor with a budget")
        return int(self.budget) - self.sample()

    def wait_below(self, nbytes: int, timeout: Optional[float] = None) -> bool:
        """Block until the tree's RSS is below ``nbytes``; False if ``timeout`` seconds pass first.

        The trainer calls this before it hands out a chunk:
        ``mon.wait_below(plan.memory_limit - plan.per_worker_bytes, timeout=30)``.

        >>> MemoryMonitor().wait_below(1 << 50, timeout=0)
        True
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.sample() < nbytes:
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            wait = self.interval if deadline is None else min(self.interval, max(0.0, deadline - time.monotonic()))
            time.sleep(wait)

    # ---- results ----------------------------------------------------------------------------

    def summary(self) -> dict:
        """Peak, sample count and per-phase peaks, JSON-ready (for run reports).

        ``budget_exceeded``: the anonymous peak (what a budget bounds, and what a memory cgroup
        cannot take back) was above the budget; ``budget_excess_bytes`` by how much (0 when not).

        >>> sorted(MemoryMonitor().summary())
        ... # doctest: +NORMALIZE_WHITESPACE
        ['budget_bytes', 'budget_exceeded', 'budget_excess_bytes', 'interval', 'n_samples',
         'peak_anon_by_phase', 'peak_anon_bytes', 'peak_by_phase', 'peak_file_by_phase',
         'peak_file_bytes', 'peak_rss_bytes']
        """
        with self._lock:
            excess = max(0, self.peak_anon - int(self.budget)) if self.budget else 0
            return {
                "budget_exceeded": excess > 0,
                "budget_excess_bytes": excess,
                "peak_anon_bytes": self.peak_anon,
                "peak_file_bytes": self.peak_file,
                "peak_anon_by_phase": dict(self.phase_peaks_anon),
                "peak_file_by_phase": dict(self.phase_peaks_file),
                "peak_rss_bytes": self.peak,
                "budget_bytes": self.budget,
                "interval": self.interval,
                "n_samples": len(self.samples),
                "peak_by_phase": dict(self.phase_peaks),
            }


__all__ = ["MemoryMonitor", "PHASE_FILE_ENV", "phase", "read_phase_file", "tree_memory", "tree_rss"]


def _madvise_setter():
    """numpy's switch for its ``madvise(MADV_HUGEPAGE)`` on large arrays (None where it has none)."""
    try:
        from numpy._core import multiarray
    except ImportError:                 # numpy 1.x
        from numpy.core import multiarray
    return getattr(multiarray, "_set_madvise_hugepage", None)


@contextlib.contextmanager
def numpy_huge_pages(enabled: bool) -> Iterator[None]:
    """numpy asks the kernel for huge pages for its arrays of 4 MiB and more (``madvise``) or not,
    inside the block; the previous setting comes back after it. The switch is numpy's, so it holds
    for every thread of the process meanwhile; a no-op where numpy has none.

    Why: with transparent huge pages on ``madvise`` (a common default), every fault of an advised
    array may stall for the kernel to compact memory into a 2 MiB page when no free block is left.
    SuperBPE's stage 2 writes arrays of hundreds of MiB once, in order; on a VM with fragmented memory
    the run's kernel time dropped from ~3.5 s to ~2 s without the hint, while where free 2 MiB blocks
    abound the hint saves faults (stage 2 keeps it then: :func:`huge_pages_ready`). Its hash tables
    ask for huge pages themselves (``_units._table_alloc``), not through this switch.

    >>> import numpy as np
    >>> with numpy_huge_pages(False):
    ...     a = np.zeros(1 << 20)
    >>> a.size
    1048576
    """
    setter = _madvise_setter()
    if setter is None:
        yield
        return
    previous = setter(bool(enabled))
    try:
        yield
    finally:
        setter(previous)


THP_DIR = "/sys/kernel/mm/transparent_hugepage"


def _thp_choice(text: str) -> str:
    """The bracketed word of a THP setting (``"always [madvise] never"`` -> ``"madvise"``)."""
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return ""


def free_block_bytes(buddyinfo: str, order: int, page_size: int = mmap.PAGESIZE) -> int:
    """Bytes of free memory in blocks of ``2**order`` pages or more, from ``/proc/buddyinfo``'s text
    (one line per zone: ``Node 0, zone Normal`` then the number of free blocks of order 0, 1, ...).

    >>> free_block_bytes("Node 0, zone   Normal  5 0 1 3\\n", order=2, page_size=4096)    # 1 block of 4 pages, 3 of 8
    114688
    """
    total = 0
    for line in buddyinfo.splitlines():
        fields = line.split()
        if "zone" not in fields:
            continue
        counts = fields[fields.index("zone") + 2:]
        for k, n in enumerate(counts):
            if k >= order and n.isdigit():
                total += int(n) << k
    return total * page_size


#: where the kernel says from which block order free pages are reported to a hypervisor, and the
#: virtio balloon devices (free page reporting is on when one of them has feature bit 5)
PAGE_REPORTING_ORDER = "/sys/module/page_reporting/parameters/page_reporting_order"
BALLOON_DIR = "/sys/bus/virtio/drivers/virtio_balloon"
VIRTIO_BALLOON_F_REPORTING = 5


def reported_order(order_text: Optional[str], balloon_features: Sequence[str]) -> Optional[int]:
    """The block order from which free memory is given back to the hypervisor (free page
    reporting), from the texts of ``PAGE_REPORTING_ORDER`` and of each balloon device's
    ``features`` (a string of 0/1, bit 0 first); None when nothing is reported.

    A reported block is unmapped on the host side: the first touch of it waits for the host to
    back it again. On this project's VM a fresh 2 MiB page of such a block costs ~2.7 s a GB to
    fault in, 4 KiB pages from the free lists ~0.35 s a GB (fresh 4 KiB pages from reported blocks
    ~2 s a GB).

    >>> reported_order("9\\n", ["01100101" + "0" * 56])
    9
    >>> reported_order("9\\n", ["0110000"]), reported_order(None, ["01100101"])
    (None, None)
    """
    if order_text is None or not order_text.strip().isdigit():
        return None
    on = any(len(f.strip()) > VIRTIO_BALLOON_F_REPORTING and f.strip()[VIRTIO_BALLOON_F_REPORTING] == "1"
             for f in balloon_features)
    return int(order_text.strip()) if on else None


def free_page_reporting() -> Optional[int]:
    """:func:`reported_order` of this machine (None off Linux, or when the files cannot be read)."""
    try:
        with open(PAGE_REPORTING_ORDER) as f:
            order_text = f.read()
    except OSError:
        return None
    features = []
    try:
        for name in sorted(os.listdir(BALLOON_DIR)):
            path = os.path.join(BALLOON_DIR, name, "features")
            if name.startswith("virtio") and os.path.isfile(path):
                with open(path) as f:
                    features.append(f.read())
    except OSError:
        return None
    return reported_order(order_text, features)


def huge_pages_state(enabled: str, defrag: str, buddyinfo: str, huge_page_bytes: int, nbytes: int,
                     page_size: int = mmap.PAGESIZE, reported: Optional[int] = None) -> bool:
    """Whether arrays of ``nbytes`` in all may ask for huge pages without a risk of stalls (the plain
    rule behind :func:`huge_pages_ready`, on the texts of the kernel's files).

    A fault of a region advised ``MADV_HUGEPAGE`` takes a free 2 MiB block when there is one (one
    fault and one clear for 512 pages: on this project's VM 300 MB fill in 0.03 s instead of 0.1-0.13 s
    with 4 KiB pages); when there is none and ``defrag`` is ``always``, ``madvise`` or
    ``defer+madvise``, the fault compacts memory first, which can stall for milliseconds (a run's
    kernel time rose by ~1.5 s on a VM with fragmented memory). So: yes when THP is usable
    (``enabled`` not ``never``) and either such faults never compact (``defrag`` ``defer`` or
    ``never``) or the free blocks of huge-page size or more hold twice ``nbytes``.

    ``reported``: the order from which free blocks are given back to a hypervisor
    (:func:`reported_order`): those blocks do not count, as faulting a huge page in from one costs
    far more than 4 KiB pages do (and where it is the huge-page order or less, no free block counts,
    whatever ``defrag`` says).

    >>> info = "Node 0, zone Normal 0 0 0 0 0 0 0 0 0 10 0\\n"    # ten free 2 MiB blocks
    >>> huge_pages_state("always [madvise] never", "[madvise]", info, 2 << 20, 8 << 20, 4096)
    True
    >>> huge_pages_state("always [madvise] never", "[madvise]", info, 2 << 20, 16 << 20, 4096)
    False
    >>> huge_pages_state("always madvise [never]", "[defer]", info, 2 << 20, 1 << 20, 4096)
    False
    >>> huge_pages_state("[always] madvise never", "always [defer] madvise", "", 2 << 20, 1 << 40, 4096)
    True
    >>> huge_pages_state("always [madvise] never", "[madvise]", info, 2 << 20, 8 << 20, 4096, reported=9)
    False
    """
    if _thp_choice(enabled) not in ("always", "madvise") or huge_page_bytes <= page_size:
        return False
    order = (huge_page_bytes // page_size).bit_length() - 1
    if reported is not None and reported <= order:
        return False
    if _thp_choice(defrag) in ("defer", "never"):
        return True
    free = free_block_bytes(buddyinfo, order, page_size)
    if reported is not None:
        free -= free_block_bytes(buddyinfo, reported, page_size)
    return free >= 2 * max(nbytes, 0)


def huge_pages_ready(nbytes: int) -> bool:
    """Whether ``nbytes`` of fresh arrays can have transparent huge pages now without the kernel
    compacting memory for them or waiting for a hypervisor (:func:`huge_pages_state` on
    ``/sys/kernel/mm/transparent_hugepage``, ``/proc/buddyinfo``, ``/proc/meminfo`` and
    :func:`free_page_reporting`). False off Linux or when a file cannot be read: then
    nothing asks for huge pages and nothing can stall. A snapshot: other processes may take the free
    blocks meanwhile (then faults fall back to compaction or 4 KiB pages; the results never change).

    >>> isinstance(huge_pages_ready(1 << 20), bool)
    True
    """
    try:
        with open(os.path.join(THP_DIR, "enabled")) as f:
            enabled = f.read()
        with open(os.path.join(THP_DIR, "defrag")) as f:
            defrag = f.read()
        with open("/proc/buddyinfo") as f:
            buddyinfo = f.read()
        huge = 0
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("Hugepagesize:"):
                    huge = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return False
    return huge_pages_state(enabled, defrag, buddyinfo, huge, nbytes, reported=free_page_reporting())


#: ``madvise`` advice that faults a range in, writable, in one call (Linux 5.14+; ``EINVAL`` before)
MADV_POPULATE_WRITE = 23
#: below this many bytes an array is left to fault in as it is written
PREFAULT_MIN_BYTES = 4 << 20
_libc_madvise = None


def _madvise():
    """libc's ``madvise`` through ctypes, or False where there is none (not Linux, no libc)."""
    global _libc_madvise
    if _libc_madvise is None:
        _libc_madvise = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes
                import ctypes.util
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
                fn = libc.madvise
                fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                fn.restype = ctypes.c_int
                _libc_madvise = fn
            except (OSError, AttributeError):
                pass
    return _libc_madvise


def prefault(arr: np.ndarray) -> np.ndarray:
    """Fault in the pages of a fresh array that is about to be written whole, in one system call
    (``madvise(MADV_POPULATE_WRITE)``), instead of one fault per 4 KiB page as it is written: on this
    project's 2-core VM a fault costs ~2 us, so a 240 MB array fills in ~0.09 s instead of ~0.17-0.29 s.
    A hint: where the kernel or the platform has no such call, or the array is small, nothing
    happens. Only for arrays every byte of which is written next (it commits the pages now).

    An ``array.array`` (a small run's engine, which never imports numpy) is taken too.

    >>> import numpy as np
    >>> a = prefault(np.empty(1 << 21, dtype=np.uint32)); a[:] = 7; int(a.sum()) == 7 << 21
    True
    """
    if isinstance(arr, array.array):
        address, n_items = arr.buffer_info()
        nbytes = n_items * arr.itemsize
    else:
        if not arr.flags.c_contiguous:
            return arr
        address, nbytes = arr.ctypes.data, arr.nbytes
    if nbytes < PREFAULT_MIN_BYTES:
        return arr
    fn = _madvise()
    if not fn:
        return arr
    page = mmap.PAGESIZE
    start = -(-address // page) * page          # the first whole page
    end = (address + nbytes) // page * page
    if end > start:
        fn(start, end - start, MADV_POPULATE_WRITE)      # EINVAL on old kernels: ignored
    return arr
