"""Atomic file output: write to a temp file in the target folder, fsync, then rename.

A run killed at any point leaves either the old file or the new one at the target path, never a
half-written file (only a ``.tmp-*`` file that the next run's writer ignores).

Sets of files that belong together are published as one unit (docs/formats.md, "Output sets"):

- a folder (a model folder): :func:`publish_folder` yields a fresh temp folder beside the target
  and swaps it with the old folder in one step (Linux ``renameat2(RENAME_EXCHANGE)``);
- files at fixed paths (ids + document index, shards + manifest): :func:`publish_files` renames
  complete, fsynced temp files in order, with SIGINT/SIGTERM held until the last rename and a
  journal that lets the next writer (:func:`recover_files`) finish renames a SIGKILL cut short.

The temp file gets the permissions a plain ``open(path, "w")`` would give the output: those of the
file it replaces, or ``0o666 & ~umask`` for a new file (``mkstemp`` alone would leave it 0600).
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import signal
import stat
import sys
import tempfile
import threading
from typing import IO, Iterable, Iterator, Sequence


#: The outputs this process has published, in order (:func:`atomic_write`, :func:`atomic_path`'s
#: ``commit``, :func:`publish_files`, :func:`publish_folder`): ``cli.run_main`` tells a signal that
#: came after its run published from one before ("output complete; interrupted after publishing").
PUBLISHED: list[str] = []


class FolderTaken(OSError):
    """Another run published the output folder while this one was writing it (two runs started
    together into a fresh ``--out``): that run owns the folder, this run's files are discarded."""


def new_temp_file(folder: str | None, prefix: str, suffix: str = "") -> tuple[int, str]:
    """Create a new empty file ``<prefix><random><suffix>`` in ``folder`` (the temp folder when None),
    mode 0600, and return ``(fd, path)``, like ``tempfile.mkstemp``, but safe against a signal at any
    moment: the name is chosen before the file exists, so if SIGINT/SIGTERM (raised by
    ``cli.run_main``'s handlers) lands just after the file was created, the file is removed before
    the exception goes on. (``mkstemp`` only tells the name once it returns: an exception raised
    between its ``open`` and its return leaves a file nobody knows of.)

    >>> import tempfile; fd, p = new_temp_file(tempfile.mkdtemp(), ".x-", ".tmp"); os.close(fd)
    >>> os.path.basename(p).startswith(".x-") and p.endswith(".tmp") and os.path.getsize(p) == 0
    True
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    return _new_temp(folder, prefix, suffix, lambda path: os.open(path, flags, 0o600))


def new_temp_dir(folder: str | None, prefix: str, suffix: str = "") -> str:
    """Create a new empty folder (mode 0700) as :func:`new_temp_file` creates a file: the same
    guarantee against a signal (``tempfile.mkdtemp`` has the same gap as ``mkstemp``)."""
    return _new_temp(folder, prefix, suffix, lambda path: os.mkdir(path, 0o700))[1]


def _new_temp(folder, prefix, suffix, create):
    folder = tempfile.gettempdir() if folder is None else os.fspath(folder)
    for _ in range(tempfile.TMP_MAX):
        path = os.path.join(folder, f"{prefix}{os.urandom(6).hex()}{suffix}")
        try:
            fd = create(path)
        except FileExistsError:
            continue                       # (another file has this name: never ours to remove)
        except OSError:
            raise                          # nothing was created
        except BaseException:              # a signal's exception, raised after the create returned
            with contextlib.suppress(OSError):
                os.rmdir(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
            raise
        return fd, path
    raise FileExistsError(errno.EEXIST, "no unused temporary name", folder)


def probe_writable(folder: str) -> OSError | None:
    """Whether a file can be created in ``folder``: None, or the error that creating one gave. The
    probe file (``.write-test-*``) is gone again when this returns or raises, a signal included."""
    try:
        fd, probe = new_temp_file(folder, ".write-test-")
    except OSError as exc:
        return exc
    try:
        os.close(fd)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(probe)
    return None


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
    fd, tmp = new_temp_file(folder, "." + os.path.basename(path) + f".tmp-{os.getpid()}-")
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
        PUBLISHED.append(path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise named(exc, path) from None
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
        PUBLISHED.append(path)

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
    exc = probe_writable(folder)
    if exc is not None:
        return f"folder {folder} is not writable ({exc.strerror or exc})"
    return None


#: The errors of an output that does not fit (a full disk, a quota, a file-size limit).
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def named(exc: OSError, path: str | os.PathLike) -> OSError:
    """``exc`` with ``path`` as its file name when it has none (a full disk raises ``ENOSPC`` from a
    write, which names no file): the tools print ``path: No space left on device``.

    >>> str(named(OSError(28, "No space left on device"), "tok"))
    "[Errno 28] No space left on device: 'tok'"
    """
    if getattr(exc, "filename", None) or not isinstance(exc, OSError) or exc.errno is None:
        return exc
    return type(exc)(exc.errno, exc.strerror or str(exc), os.fspath(path))


@contextlib.contextmanager
def naming(folder: str | os.PathLike | None) -> Iterator[None]:
    """Inside the block, a full disk (``DISK_FULL``: ``ENOSPC`` from a write into a spill or temp
    folder names no file) is raised naming ``folder`` (:func:`named`): the tools print ``FOLDER: No
    space left on device`` instead of the bare reason. Other errors, and ``folder`` None, pass as they are.

    >>> with naming("/spill"):
    ...     raise OSError(28, "No space left on device")
    Traceback (most recent call last):
    ...
    OSError: [Errno 28] No space left on device: '/spill'
    """
    try:
        yield
    except OSError as exc:
        if folder is None or exc.errno not in DISK_FULL:
            raise
        raise named(exc, folder) from None


# ==== Sets of files published as one unit ====================================================


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM that arrive inside the block are delivered when it ends (main thread
    only; elsewhere this does nothing): a publish step of several renames is not cut in two by
    Ctrl-C or SIGTERM. Only SIGKILL (or a crash) can stop it halfway; see :func:`recover_files`."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []

    def hold(signum, frame):
        got.append(signum)

    old = {}
    try:
        for s in (signal.SIGINT, signal.SIGTERM):
            old[s] = signal.signal(s, hold)
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        if got:
            signal.raise_signal(got[0])


def _fsync_dir(folder: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def exchange(a: str, b: str) -> bool:
    """Swap the paths ``a`` and ``b`` in one step (Linux ``renameat2(RENAME_EXCHANGE)``, glibc 2.28+).
    False where that is not available (another system, an older libc, a filesystem without it);
    other failures raise ``OSError``."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), b)


def _journal_prefix(key: str) -> str:
    return "." + os.path.basename(key) + ".commit-"


def publish_files(pairs: Sequence[tuple[str, str]], key: str | os.PathLike | None = None,
                  remove: Iterable[str] = ()) -> None:
    """Rename each complete temp file onto its final path, in order (the file that marks the set
    complete, a manifest, last), then remove the paths in ``remove``: one unit as far as POSIX
    allows for files at paths the user named.

    Every temp file is fsynced first; SIGINT and SIGTERM wait until the end (:func:`signals_held`);
    a journal ``.<key>.commit-<pid>-*`` beside ``key`` (default: the first final path) lists the
    renames while they run, so that after a SIGKILL between two of them the next writer of
    ``key`` finishes them (:func:`recover_files`) before anything else.
    """
    pairs = [(os.fspath(t), os.fspath(f)) for t, f in pairs]
    remove = [os.fspath(r) for r in remove]
    if not pairs:
        return
    key = os.fspath(key) if key is not None else pairs[-1][1]
    for tmp, _ in pairs:
        _fsync_file(tmp)
    folder = os.path.dirname(os.path.abspath(key))
    with signals_held():
        journal = None
        if len(pairs) > 1 or remove:
            fd, journal = new_temp_file(folder, _journal_prefix(key) + f"{os.getpid()}-")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"rename": [[os.path.abspath(t), os.path.abspath(p)] for t, p in pairs],
                           "remove": [os.path.abspath(r) for r in remove]}, f)
                f.flush()
                os.fsync(f.fileno())
            _fsync_dir(folder)
        for tmp, path in pairs:
            os.replace(tmp, path)
        for folder_done in {os.path.dirname(os.path.abspath(p)) for _, p in pairs}:
            _fsync_dir(folder_done)
        for path in remove:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        if journal is not None:
            os.unlink(journal)
        PUBLISHED.append(key)


def recover_files(key: str | os.PathLike) -> list[str]:
    """Finish what a writer killed inside :func:`publish_files` left: for each journal of a dead
    writer beside ``key``, the renames whose temp file is still there and the removals; then the
    journal goes. Returns the final paths it renamed onto. Call it before :func:`remove_stale`,
    which would remove those temp files."""
    key = os.fspath(key)
    folder = os.path.dirname(os.path.abspath(key))
    prefix = _journal_prefix(key)
    done: list[str] = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return done
    for name in names:
        if not name.startswith(prefix):
            continue
        full = os.path.join(folder, name)
        if not is_stale(full, name, prefix, min_age=float("inf")):
            continue
        try:
            with open(full, encoding="utf-8") as f:
                plan = json.load(f)
        except (OSError, ValueError):
            plan = {}
        for tmp, path in plan.get("rename", []):
            if os.path.exists(tmp):
                os.replace(tmp, path)
                done.append(path)
        for path in plan.get("remove", []):
            with contextlib.suppress(OSError):
                os.unlink(path)
        with contextlib.suppress(OSError):
            os.unlink(full)
    return done


def _holds(folder: str, path: str) -> bool:
    """Whether ``path`` is ``folder`` or inside it (both resolved)."""
    folder, path = os.path.realpath(folder), os.path.realpath(path)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def recover_folder(target: str | os.PathLike) -> None:
    """What a killed :func:`publish_folder` left beside or inside ``target``: a fresh folder of a
    dead writer is removed; an old folder moved aside (the fallback without ``RENAME_EXCHANGE``)
    goes back to ``target`` if nothing took its place, else it is removed; renames of the
    in-place fallback are finished."""
    target = os.fspath(target)
    parent = os.path.dirname(os.path.abspath(target))
    name = os.path.basename(os.path.abspath(target))
    new, old = f".{name}.new-", f".{name}.old-"
    if os.path.isdir(target):               # first: its journals may name files in a fresh folder
        for key in os.listdir(target):
            if ".commit-" in key and key.startswith("."):
                recover_files(os.path.join(target, key[1:key.index(".commit-")]))
        remove_stale_in(target, [".publish-"], min_age=float("inf"))
    with contextlib.suppress(OSError):
        for entry in sorted(os.listdir(parent)):
            full = os.path.join(parent, entry)
            if entry.startswith(old) and is_stale(full, entry, old, float("inf")) and not os.path.lexists(target):
                with contextlib.suppress(OSError):
                    os.rename(full, target)
    remove_stale_in(parent, [new, old], min_age=float("inf"))


def _can_swap(target: str) -> bool:
    """Whether ``target`` (an existing folder) can be replaced by renaming: its parent is writable,
    it is not a mount point, it holds neither this process's working folder nor a subfolder or
    special file (which hard links cannot carry over)."""
    parent = os.path.dirname(os.path.abspath(target))
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = None
    if os.path.ismount(target) or (cwd is not None and _holds(target, cwd)) or not os.access(parent, os.W_OK):
        return False
    if probe_writable(parent) is not None:
        return False
    with os.scandir(target) as it:
        for entry in it:
            if entry.is_dir(follow_symlinks=False) or not (entry.is_file(follow_symlinks=False)
                                                          or entry.is_symlink()):
                return False
    return True


def _carry(src: str, dst: str) -> None:
    """Put ``src`` at ``dst`` without copying its bytes when possible: a hard link (the same file,
    under a second name), a symlink recreated, else a copy."""
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _is_temp_name(name: str) -> bool:
    """A temp name of a bpe_core writer (never carried into a new folder)."""
    return name.startswith((".publish-", ".write-test-")) or (
        name.startswith(".") and any(k in name for k in (".tmp-", ".commit-", ".spill-")))


def _folder_mode(path: str) -> int:
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0o777 & ~current_umask()


def _publish_in_place(tmp: str, target: str, written: list[str], owned: set, last: str | None) -> None:
    """The files of ``tmp`` renamed into ``target`` by :func:`publish_files`, ``last`` last; the
    ``owned`` names this run did not write removed."""
    order = sorted(written, key=lambda n: n == last)
    gone = [os.path.join(target, n) for n in sorted(owned - set(written)) if os.path.lexists(os.path.join(target, n))]
    if order:
        publish_files([(os.path.join(tmp, n), os.path.join(target, n)) for n in order],
                      key=os.path.join(target, order[-1]), remove=gone)
    else:
        for path in gone:
            os.unlink(path)
    os.rmdir(tmp)


@contextlib.contextmanager
def publish_folder(target: str | os.PathLike, owned: Iterable[str] = (), last: str | None = None
                   ) -> Iterator[str]:
    """Yield a fresh, empty temp folder; write the whole set into it with plain ``open``; on a clean
    exit it becomes ``target`` in one step. A failure or a signal inside the block removes it and
    leaves ``target`` as it was.

    - ``target`` absent: the temp folder (``.<name>.new-<pid>-*`` beside it) is renamed to it.
    - ``target`` a folder: entries this run did not write are **carried over** into the temp folder
      (hard links: the same files under a second name; symlinks recreated), except names in
      ``owned`` (files of the set that this run did not write: they belong to the old set and go
      with it); then the two folders are swapped with ``renameat2(RENAME_EXCHANGE)`` and the old one
      is removed. Without ``RENAME_EXCHANGE`` (not Linux, old libc, a filesystem without it), the old
      folder is renamed aside (``.<name>.old-<pid>-*``) and the new one into place, signals held
      in between; a SIGKILL in that gap leaves no ``target``, and the next writer renames the old
      folder back (:func:`recover_folder`).
    - ``target`` a folder that cannot be swapped (its parent is not writable, a mount point, the
      working folder, or it holds subfolders or special files): **in place**. The files are
      written in ``target/.publish-<pid>-*`` and renamed into ``target`` by :func:`publish_files`
      (``last`` the final rename), owned names this run did not write removed.

    A symlink ``target`` is followed: the folder it points to is the one replaced. An ``OSError``
    that names no file (``ENOSPC`` from a write) is raised naming ``target``.
    """
    target = os.fspath(target)
    if os.path.islink(target) and os.path.isdir(target):
        target = os.path.realpath(target)
    target = target.rstrip(os.sep) or target
    parent = os.path.dirname(os.path.abspath(target))
    name = os.path.basename(os.path.abspath(target))
    owned = set(owned)
    recover_folder(target)
    exists = os.path.isdir(target)
    in_place = exists and not _can_swap(target)
    try:
        if in_place:
            tmp = new_temp_dir(target, f".publish-{os.getpid()}-")
        else:
            os.makedirs(parent, exist_ok=True)
            tmp = new_temp_dir(parent, f".{name}.new-{os.getpid()}-")
    except OSError as exc:
        raise named(exc, target) from None
    try:
        yield tmp
        written = sorted(os.listdir(tmp))
        if exists:
            for n in written:                 # a file keeps the mode of the one it replaces
                with contextlib.suppress(OSError):
                    old = os.stat(os.path.join(target, n), follow_symlinks=False)
                    if stat.S_ISREG(old.st_mode):
                        os.chmod(os.path.join(tmp, n), stat.S_IMODE(old.st_mode))
        if in_place:
            _publish_in_place(tmp, target, written, owned, last)
            return
        for n in written:
            _fsync_file(os.path.join(tmp, n))
        if exists:
            for n in os.listdir(target):
                if n in owned or n in written or _is_temp_name(n):
                    continue
                _carry(os.path.join(target, n), os.path.join(tmp, n))
        os.chmod(tmp, _folder_mode(target) if exists else 0o777 & ~current_umask())
        _fsync_dir(tmp)
        with signals_held():
            if not exists:
                try:
                    os.rename(tmp, target)
                except OSError as exc:
                    if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not os.path.isdir(target):
                        raise
                    # another run, started with this one, published the folder first: it owns it
                    raise FolderTaken(exc.errno, "another run published this output folder while this one was "
                                      "writing it and owns it now; this run's files were discarded (run again "
                                      "to replace it)", target) from None
            else:
                try:
                    swapped = exchange(tmp, target)
                except OSError as exc:
                    if exc.errno not in (errno.EPERM, errno.EACCES, errno.EBUSY, errno.EXDEV):
                        raise
                    # not allowed to rename the folder after all (a sticky parent, a bind mount)
                    carried = [n for n in os.listdir(tmp) if n not in written]
                    for n in carried:
                        os.unlink(os.path.join(tmp, n))
                    _publish_in_place(tmp, target, written, owned, last)
                    return
                if swapped:
                    shutil.rmtree(tmp, ignore_errors=True)          # now the old folder
                else:
                    aside = new_temp_dir(parent, f".{name}.old-{os.getpid()}-")
                    os.rename(target, aside)                        # replaces the empty folder
                    os.rename(tmp, target)
                    shutil.rmtree(aside, ignore_errors=True)
        _fsync_dir(parent)
        PUBLISHED.append(target)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise named(exc, target) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
