"""Atomic file output: write to a temp file in the target folder, fsync, then rename.

A run killed at any point leaves either the old file or the new one at the target path, never a
half-written file (only a ``.tmp-*`` file that the next run's writer ignores).

The temp file gets the permissions a plain ``open(path, "w")`` would give the output: those of the
file it replaces, or ``0o666 & ~umask`` for a new file (``mkstemp`` alone would leave it 0600).
"""
from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import threading
from typing import IO, Iterator


def _read_umask_by_setting() -> int:
    """The umask, read by setting it and putting it back (under a lock: not thread-safe otherwise)."""
    with _UMASK_LOCK:
        old = os.umask(0o022)
        os.umask(old)
    return old


_UMASK_LOCK = threading.Lock()
_IMPORT_UMASK = _read_umask_by_setting()


def current_umask() -> int:
    """The process umask: from ``/proc/self/status`` (``Umask:``, Linux) when available, which reads it
    without changing it; else the value read once when this module was imported.

    >>> 0 <= current_umask() <= 0o777
    True
    """
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return _IMPORT_UMASK


def output_mode(path: str | os.PathLike) -> int:
    """The permission bits a plain ``open(path, "w")`` would leave on ``path``: those of the regular
    file already there, else ``0o666 & ~umask``.

    >>> import tempfile, os
    >>> output_mode(os.path.join(tempfile.mkdtemp(), "new")) == 0o666 & ~current_umask()
    True
    """
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if st is not None and stat.S_ISREG(st.st_mode):
        return stat.S_IMODE(st.st_mode)
    return 0o666 & ~current_umask()


def _mkstemp_beside(path: str) -> tuple[int, str]:
    """A temp file in the folder of ``path``, with the mode the output should end up with."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + f".tmp-{os.getpid()}-")
    try:
        os.fchmod(fd, output_mode(path))
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return fd, tmp


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb", encoding: str | None = None) -> Iterator[IO]:
    """Open a temp file beside ``path``; on clean exit fsync and rename it onto ``path``.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> with atomic_write(os.path.join(d, "x.txt"), "w", encoding="utf-8") as f:
    ...     _ = f.write("hi")
    >>> open(os.path.join(d, "x.txt")).read()
    'hi'
    """
    path = os.fspath(path)
    fd, tmp = _mkstemp_beside(path)
    try:
        with os.fdopen(fd, mode, encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_path(path: str | os.PathLike) -> tuple[str, callable]:
    """A temp path beside ``path`` and a ``commit()`` that renames it onto ``path``.

    For writers that need a file name rather than a file object (``np.lib.format.open_memmap``).
    """
    path = os.fspath(path)
    fd, tmp = _mkstemp_beside(path)
    os.close(fd)

    def commit() -> None:
        os.replace(tmp, path)

    return tmp, commit


def owner_pid(name: str, prefix: str) -> int | None:
    """The pid written into a temp name after ``prefix`` (``<prefix><pid>-<random>``), if any.

    >>> owner_pid(".ids.npy.tmp-4242-abc", ".ids.npy.tmp-"), owner_pid(".ids.npy.tmp-abc", ".ids.npy.tmp-")
    (4242, None)
    """
    head = name[len(prefix):].split("-", 1)[0]
    return int(head) if head.isdigit() and "-" in name[len(prefix):] else None


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (on this machine)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:          # exists, owned by someone else
        return True
    return True


def is_stale(full: str, name: str, prefix: str, min_age: float) -> bool:
    """A temp file or folder left by a writer that is gone: its pid (in the name) no longer runs,
    or, for a name without a pid, it was untouched for ``min_age`` seconds."""
    import time

    pid = owner_pid(name, prefix)
    if pid is not None:
        return pid != os.getpid() and not pid_alive(pid)
    try:
        return time.time() - os.path.getmtime(full) >= min_age
    except OSError:
        return False


def remove_stale(path: str | os.PathLike, kinds: tuple[str, ...] = ("tmp",), min_age: float = 60.0) -> list[str]:
    """Remove what a killed writer of ``path`` left beside it: ``.<name>.tmp-*`` files (and, with
    ``kinds=("tmp", "spill")``, ``.<name>.spill-*`` folders) whose writer is gone.

    Temp names carry the writer's pid (``.<name>.tmp-<pid>-*``): a run killed with SIGKILL leaves
    them, and the next run removes them at once; a writer that still runs is left alone. Names
    without a pid (older versions) go when untouched for ``min_age`` seconds.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    base = "." + os.path.basename(path) + "."
    return remove_stale_in(folder, [base + kind + "-" for kind in kinds], min_age)


def remove_stale_in(folder: str, prefixes: list[str], min_age: float = 60.0) -> list[str]:
    """``remove_stale`` for any name prefixes in ``folder`` (e.g. ``bpe_core-spill-``)."""
    import shutil

    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        prefix = next((p for p in prefixes if name.startswith(p)), None)
        if prefix is None:
            continue
        full = os.path.join(folder, name)
        try:
            if not is_stale(full, name, prefix, min_age):
                continue
            if os.path.isdir(full):
                shutil.rmtree(full, ignore_errors=True)
            else:
                os.unlink(full)
            removed.append(full)
        except OSError:
            pass
    return removed


def output_problem(path: str | os.PathLike, what: str = "a file path") -> str | None:
    """What stops :func:`atomic_write` from writing ``path``, checked before any work; None if nothing.

    Probes the folder with a real temp file (``os.access`` says yes to root on a read-only mount).

    >>> import tempfile, os; d = tempfile.mkdtemp()
    >>> output_problem(os.path.join(d, "x.json")) is None, output_problem(d)
    (True, 'is a directory, expected a file path')
    >>> output_problem(os.path.join(d, "missing", "x.json")).startswith("folder ")
    True
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        return f"is a directory, expected {what}"
    if os.path.lexists(path):
        try:
            mode = os.stat(path).st_mode
        except OSError as exc:
            return f"cannot check it: {exc.strerror or exc}"
        if not stat.S_ISREG(mode):
            return "exists and is not a regular file (writing would replace it); give a file path"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"folder {folder} does not exist"
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"folder {folder} is not writable ({exc.strerror or exc})"
    return None
