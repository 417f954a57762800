"""The memory limit of the container the process runs in: the memory cgroup (v1 or v2).

Docker, Kubernetes, Slurm and systemd run jobs in memory cgroups; a process that outgrows the limit
is killed by the kernel (exit 137, nothing on stderr), however much RAM the machine has. The default
budget (``budget.default_budget``) therefore takes the smaller of the RAM and the cgroup's room.

:func:`parse_cgroup_memory` is a pure function over the texts of ``/proc/self/cgroup`` and
``/proc/self/mountinfo`` and a reader for the cgroup's files, so tests give it fake files;
:func:`cgroup_memory` reads the real ones.

- cgroup v1: the ``memory`` controller's line of ``/proc/self/cgroup`` (``4:memory:/a/b``), the
  ``cgroup`` mount with the ``memory`` option, ``memory.limit_in_bytes``, ``memory.usage_in_bytes``
  and ``total_inactive_file`` + ``total_active_file`` of ``memory.stat`` (page cache: reclaimable);
- cgroup v2: the ``0::/a/b`` line, the ``cgroup2`` mount, ``memory.max`` (``max``: none),
  ``memory.current`` and ``file`` of ``memory.stat``.

Limits hold for a group and everything inside it, so every group from the process's own up to the
mount's root counts: the one with the least room decides. ``max`` and the huge numbers v1 writes for
"no limit" (about 2**63) mean no limit.

>>> cg = parse_cgroup_memory("0::/job\\n", "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\\n",
...                          {"/sys/fs/cgroup/job/memory.max": "157286400\\n",
...                           "/sys/fs/cgroup/job/memory.current": "52428800\\n",
...                           "/sys/fs/cgroup/job/memory.stat": "anon 31457280\\nfile 20971520\\n"}.get)
>>> cg.limit >> 20, cg.usage >> 20, cg.file_bytes >> 20, cg.version, cg.path
(150, 50, 20, 2, '/sys/fs/cgroup/job')
>>> cg.room(own_bytes=10 << 20) >> 20      # 150 - (50 - 20 - 10) MiB: others hold 20 MiB
130
"""
from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from typing import Callable, Optional

#: Limits at or above this are "no limit" (cgroup v1 writes 2**63 rounded down to a page).
UNLIMITED = 1 << 62


@dataclass(frozen=True)
class CgroupMemory:
    """The memory limit that binds this process, from its cgroups.

    Attributes:
        limit: bytes the group may hold (the group with the least room on the way up).
        usage: bytes it holds now (this process included; page cache included).
        file_bytes: of ``usage``, page cache the kernel can drop (file-backed pages).
        path: the group's folder (``/sys/fs/cgroup/...``).
        version: 1 or 2.
    """

    limit: int
    usage: int
    file_bytes: int
    path: str
    version: int

    def room(self, own_bytes: int = 0) -> int:
        """The bytes this process may grow to: the limit less what others in the group hold
        (its usage less the page cache less ``own_bytes``, this process's own resident memory)."""
        others = max(0, self.usage - self.file_bytes - max(0, int(own_bytes)))
        return max(0, self.limit - others)


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as ``\\040`` etc."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


@functools.lru_cache(maxsize=8)
def _mounts(mountinfo: str, version: int) -> tuple[tuple[str, str], ...]:
    """``(root, mount point)`` of the memory cgroup mounts of one version, from mountinfo's text
    (memoized on the text, read fresh by every caller: a process parses the same table each time
    it plans, a quarter of a millisecond each)."""
    out = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        tail = line.split(" - ", 1)[1].split()
        if len(tail) < 3:
            continue
        fstype, opts = tail[0], tail[2].split(",")
        if (version == 1 and fstype == "cgroup" and "memory" in opts) or (version == 2 and fstype == "cgroup2"):
            out.append((_unescape(fields[3]), _unescape(fields[4])))
    return tuple(out)


def _own_paths(proc_cgroup: str) -> dict[int, str]:
    """The process's cgroup path for v1's memory controller (key 1) and for v2 (key 2)."""
    out: dict[int, str] = {}
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hier, controllers, path = parts
        if hier == "0" and controllers == "":
            out[2] = path
        elif "memory" in controllers.split(","):
            out[1] = path
    return out


def _number(text: Optional[str]) -> Optional[int]:
    """A limit or usage file's value; None for ``max``, a huge value, or what cannot be read."""
    if text is None:
        return None
    text = text.strip()
    if not text.isascii() or not text.isdigit():
        return None
    value = int(text)
    return None if value >= UNLIMITED else value


def _stat_file(text: Optional[str], keys: tuple[str, ...]) -> int:
    """The sum of ``keys`` in a ``memory.stat`` text (0 for those it lacks)."""
    total = 0
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name in keys and value.strip().isdigit():
            total += int(value.strip())
    return total


_FILES = {1: ("memory.limit_in_bytes", "memory.usage_in_bytes", ("total_inactive_file", "total_active_file")),
          2: ("memory.max", "memory.current", ("file",))}


def parse_cgroup_memory(proc_cgroup: str, mountinfo: str, read: Callable[[str], Optional[str]],
                        own_bytes: int = 0) -> Optional[CgroupMemory]:
    """The binding memory cgroup of a process, from the texts of its ``/proc/<pid>/cgroup`` and
    ``/proc/<pid>/mountinfo`` and ``read(path)`` (a file's text, None when it cannot be read);
    None when no group up the way has a limit.

    Of the groups with a limit (v1 and v2, the process's own and every one above it up to the
    mount's root), the one with the least room (:meth:`CgroupMemory.room` for ``own_bytes``).

    >>> mi = "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\\n"
    >>> files = {"/sys/fs/cgroup/memory/a/memory.limit_in_bytes": "9223372036854771712",
    ...          "/sys/fs/cgroup/memory/a/b/memory.limit_in_bytes": "104857600",
    ...          "/sys/fs/cgroup/memory/a/b/memory.usage_in_bytes": "0"}
    >>> parse_cgroup_memory("4:memory:/a/b\\n0::/\\n", mi, files.get).limit >> 20
    100
    >>> parse_cgroup_memory("4:memory:/a\\n", mi, files.get) is None      # v1's "no limit"
    True
    """
    paths = _own_paths(proc_cgroup)
    best: Optional[CgroupMemory] = None
    for version in (1, 2):
        own = paths.get(version)
        if own is None:
            continue
        limit_name, usage_name, file_keys = _FILES[version]
        for root, point in _mounts(mountinfo, version):
            if root == "/" or own == root or own.startswith(root.rstrip("/") + "/"):
                rel = own[len(root.rstrip("/")):] if root != "/" else own
            else:
                rel = ""           # a cgroup namespace: the mount is the group itself
            folder = os.path.normpath(point + "/" + rel.strip("/")) if rel.strip("/") else os.path.normpath(point)
            point = os.path.normpath(point)
            while True:
                limit = _number(read(os.path.join(folder, limit_name)))
                if limit is not None:
                    usage = _number(read(os.path.join(folder, usage_name))) or 0
                    cache = min(usage, _stat_file(read(os.path.join(folder, "memory.stat")), file_keys))
                    cg = CgroupMemory(limit, usage, cache, folder, version)
                    if best is None or cg.room(own_bytes) < best.room(own_bytes):
                        best = cg
                if folder == point or len(folder) <= len(point):
                    break
                folder = os.path.dirname(folder)
    return best


def _read_text(path: str) -> Optional[str]:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(1 << 16)
    except OSError:
        return None


def cgroup_memory(own_bytes: int = 0) -> Optional[CgroupMemory]:
    """:func:`parse_cgroup_memory` of this process (None off Linux, outside a limited cgroup, or
    when the files cannot be read)."""
    proc_cgroup = _read_text("/proc/self/cgroup")
    mountinfo = _read_text("/proc/self/mountinfo")
    if proc_cgroup is None or mountinfo is None:
        return None
    return parse_cgroup_memory(proc_cgroup, mountinfo, _read_text, own_bytes)


#: Filesystems whose files are memory: pages written there are shared memory, charged to the
#: process's cgroup and never written back (a spill there saves no RAM).
MEMORY_FILESYSTEMS = ("tmpfs", "ramfs", "devtmpfs")


def mount_fstype(path: str, mountinfo: Optional[str] = None) -> Optional[str]:
    r"""The filesystem type of the mount holding ``path`` (the longest mount point above its real
    path, from ``/proc/self/mountinfo``); None where it cannot be told.

    >>> info = ("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
    ...         "30 22 0:25 / /tmp rw - tmpfs tmpfs rw\n")
    >>> mount_fstype("/tmp/spill", info), mount_fstype("/tmpx", info), mount_fstype("/home", info)
    ('tmpfs', 'ext4', 'ext4')
    """
    if mountinfo is None:
        mountinfo = _read_text("/proc/self/mountinfo")
        if mountinfo is None:
            return None
        path = os.path.realpath(path)
    best, fstype = -1, None
    for line in mountinfo.splitlines():
        head, sep, tail = line.partition(" - ")
        fields = head.split()
        if not sep or len(fields) < 5 or not tail.split():
            continue
        point = _unescape(fields[4])
        inside = path == point or point == "/" or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:
            best, fstype = len(point), tail.split()[0]
    return fstype


def in_memory_folder(path: str) -> bool:
    """Whether files in ``path`` live in memory (tmpfs, ramfs: :data:`MEMORY_FILESYSTEMS`)."""
    return mount_fstype(path) in MEMORY_FILESYSTEMS


__all__ = ["CgroupMemory", "MEMORY_FILESYSTEMS", "UNLIMITED", "cgroup_memory", "in_memory_folder", "mount_fstype",
           "parse_cgroup_memory"]
