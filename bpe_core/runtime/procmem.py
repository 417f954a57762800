"""Memory figures of this machine and of a process tree, read from ``/proc`` on Linux (a few small
reads: no ``psutil`` import, no scan of every process on the machine), from ``psutil`` elsewhere.

- :func:`self_rss`: this process's resident bytes (``psutil.Process().memory_info().rss``);
- :func:`ram_total`, :func:`ram_available`: ``psutil.virtual_memory().total`` / ``.available``
  (``MemTotal`` / ``MemAvailable`` of ``/proc/meminfo``);
- :func:`tree_pids`: a process and its descendants (the ``children`` files of its threads; psutil
  scans every process of the machine for the same answer);
- :func:`pid_exists`.

>>> self_rss() > 0, ram_available() <= ram_total(), tree_pids()[0] == os.getpid()
(True, True, True)
"""
from __future__ import annotations

import os
from typing import Optional

__all__ = ["pid_exists", "ram_available", "ram_total", "self_rss", "tree_pids"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _children_files() -> bool:
    """Whether this kernel lists a task's children (``CONFIG_PROC_CHILDREN``)."""
    return os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


_LINUX_TREE = _children_files()


def self_rss() -> int:
    """Resident bytes of this process."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        import psutil

        return psutil.Process().memory_info().rss


def _meminfo(key: bytes) -> Optional[int]:
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return None


def ram_total() -> int:
    """The machine's RAM in bytes."""
    value = _meminfo(b"MemTotal:")
    if value is None:
        import psutil

        value = psutil.virtual_memory().total
    return int(value)


def ram_available() -> int:
    """The RAM available now (what the kernel can give without swapping), in bytes."""
    value = _meminfo(b"MemAvailable:")
    if value is None:           # not Linux, or a kernel before 3.14: psutil estimates it
        import psutil

        value = psutil.virtual_memory().available
    return int(value)


def tree_pids(pid: Optional[int] = None) -> Optional[list[int]]:
    """``pid`` (default: this process) and its descendants, ``pid`` first; ``[]`` when ``pid`` does not
    exist; None where ``/proc`` does not list children (then ask ``psutil``). A process that exits
    while it is read is left out."""
    root = os.getpid() if pid is None else pid
    if not _LINUX_TREE:
        return None
    if not isinstance(root, int) or root <= 0 or not os.path.isdir(f"/proc/{root}/task"):
        return []
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:                 # exited
            continue
        out.append(p)
        for tid in tids:
            try:
                with open(f"/proc/{p}/task/{tid}/children", "rb") as f:
                    todo.extend(int(c) for c in f.read().split())
            except (OSError, ValueError):      # the thread ended
                continue
    return out


def pid_exists(pid: int) -> bool:
    if os.path.isdir("/proc/self"):
        return os.path.exists(f"/proc/{pid}")
    import psutil

    return psutil.pid_exists(pid)
