"""Atomic file output: write to a temp file in the target folder, fsync, then rename.

A run killed at any point leaves either the old file or the new one at the target path, never a
half-written file (only a ``.tmp-*`` file that the next run's writer ignores).
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from typing import IO, Iterator


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
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".tmp-")
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
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".tmp-")
    os.close(fd)

    def commit() -> None:
        os.replace(tmp, path)

    return tmp, commit


def remove_stale(path: str | os.PathLike, kinds: tuple[str, ...] = ("tmp",), min_age: float = 60.0) -> list[str]:
    """Remove what a killed writer of ``path`` left beside it: ``.<name>.tmp-*`` files (and, with
    ``kinds=("tmp", "spill")``, ``.<name>.spill-*`` folders) untouched for ``min_age`` seconds.

    A writer that is still running keeps touching its temp file, so it is left alone.
    """
    import shutil
    import time

    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    base = "." + os.path.basename(path) + "."
    removed = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    now = time.time()
    for name in names:
        if not any(name.startswith(base + kind + "-") for kind in kinds):
            continue
        full = os.path.join(folder, name)
        try:
            if now - os.path.getmtime(full) < min_age:
                continue
            if os.path.isdir(full):
                shutil.rmtree(full, ignore_errors=True)
            else:
                os.unlink(full)
            removed.append(full)
        except OSError:
            pass
    return removed
