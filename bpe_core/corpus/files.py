"""Input files: what may be read, and how it is checked before any work.

``check_input`` refuses, in one line naming the file, what cannot be a corpus: a missing file, a
folder, a FIFO or device (it would read as empty), an unreadable file, and, for the pread fast
path of plain text, a compressed file (gzip, xz, zstd, bzip2, lz4, zip, by their magic bytes;
``corpus.shards`` reads the first four as streams). ``warn_if_binary`` warns (``BinaryInputWarning``)
when the start of a file does not look like text; a byte-level tokenizer takes any bytes.
"""
from __future__ import annotations

import codecs
import io
import mmap
import os
import stat
import sys
import warnings

from ..runtime.lazy import np  # numpy on first use (a small run never imports it)

from ..errors import BinaryInputWarning, CorpusError

__all__ = ["check_input", "compressed_format", "binary_reason", "warn_if_binary", "open_corpus",
           "open_mmap_bytes"]


#: Compressed formats refused by their magic bytes: (name, magic, how to decompress). bzip2's
#: "BZh" + level is also checked against the block or end-of-stream magic that follows it; a zstd
#: file may also start with a skippable frame (``ZSTD_SKIPPABLE``; every ``pzstd`` output does).
COMPRESSED_MAGIC: tuple[tuple[str, bytes, str], ...] = (
    ("gzip", b"\x1f\x8b\x08", "gzip -dk {}"),
    ("xz", b"\xfd7zXZ\x00", "xz -dk {}"),
    ("zstd", b"\x28\xb5\x2f\xfd", "zstd -d {}"),
    ("bzip2", b"BZh", "bzip2 -dk {}"),
    ("lz4", b"\x04\x22\x4d\x18", "lz4 -d {}"),
    ("zip", b"PK\x03\x04", "unzip {}"),
)
_BZIP2_NEXT = (b"\x31\x41\x59\x26\x53\x59", b"\x17\x72\x45\x38\x50\x90")
#: The magic of a zstd skippable frame, 0x184D2A50..0x184D2A5F little-endian, less its first byte.
ZSTD_SKIPPABLE = b"\x2a\x4d\x18"

_FILE_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def compressed_format(head: bytes) -> tuple[str, str] | None:
    """``(format, decompress command template)`` when ``head`` starts with a known compressed
    format's magic bytes, else None.

    >>> compressed_format(b"\\xfd7zXZ\\x00\\x00"), compressed_format(b"hello")
    (('xz', 'xz -dk {}'), None)
    >>> compressed_format(b"BZh is not bzip2"), compressed_format(b"BZh91AY&SY")[0]
    (None, 'bzip2')
    >>> compressed_format(b"\\x50\\x2a\\x4d\\x18\\x04\\x00\\x00\\x00")[0]      # a zstd skippable frame
    'zstd'
    """
    if len(head) >= 4 and head[0] & 0xF0 == 0x50 and head[1:4] == ZSTD_SKIPPABLE:
        return "zstd", "zstd -d {}"
    for name, magic, hint in COMPRESSED_MAGIC:
        if head.startswith(magic):
            if name == "bzip2" and not (len(head) >= 10 and head[3:4] in b"123456789"
                                        and head[4:10] in _BZIP2_NEXT):
                continue
            if name == "gzip" and not (len(head) >= 10 and head[3] & 0xE0 == 0):
                continue          # a gzip member: a 10-byte header, deflate, reserved flag bits 0
            return name, hint
    return None


#: Names of standard input as a path; the tools read it as ``-`` (a pipe has no size to plan with).
STDIN_PATHS = ("/dev/stdin", "/dev/fd/0", "/proc/self/fd/0")


#: The line a run prints on stderr when it reads the corpus from a terminal (``open_stdin``).
TERMINAL_HINT = "reading the corpus from the terminal; end with Ctrl-D"


def stdin_problem() -> str | None:
    """Why standard input cannot be read as the corpus, or None: closed (``0<&-``: Python has no
    ``sys.stdin``; or descriptor 0 closed since).

    >>> stdin_problem() is None or isinstance(stdin_problem(), str)
    True
    """
    closed = "standard input is closed: pipe the corpus in, or give a file instead of -"
    if sys.stdin is None or getattr(sys.stdin, "closed", False):
        return closed
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, ValueError, OSError):       # a stream without a descriptor (a test's)
        return None
    try:
        os.fstat(fd)
    except OSError:                                     # descriptor 0 closed under Python
        return closed
    return None


def open_stdin(name: str = "-"):
    """Standard input's binary stream, to read the corpus from.

    On a terminal it says so first on stderr (:data:`TERMINAL_HINT`): a run that waits for text
    typed in is otherwise indistinguishable from a hung one; and the text ends at the first Ctrl-D.

    Raises:
        CorpusError: ``stdin_problem`` (closed standard input, a folder).
    """
    problem = stdin_problem()
    if problem is not None:
        raise CorpusError(name, problem)
    try:
        tty = os.isatty(sys.stdin.fileno())
    except (OSError, ValueError, AttributeError):
        tty = False
    stream = getattr(sys.stdin, "buffer", sys.stdin)
    if not tty:
        return stream
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] not in ("", "-c", "-") else "bpe_core"
    print(f"{prog}: {TERMINAL_HINT}", file=sys.stderr, flush=True)
    # What is typed, read to the first end of input: a terminal gives more after a Ctrl-D, so the
    # buffered reads that fill a whole piece would ask for a second one.
    return io.BufferedReader(io.BytesIO(stream.read()))


def check_input(path: str | os.PathLike, compressed_ok: bool = False) -> int:
    """Check that ``path`` is a readable regular file and not compressed; return its size in bytes.

    The fast path of a single plain-text file (pread chunks) calls it as is; ``corpus.shards``,
    which reads gzip, xz, zstd and bzip2 streams, passes ``compressed_ok=True``.

    Raises:
        CorpusError: no such file, a directory, not a regular file (a FIFO or device, which would
            read as empty here: save it to a file first), unreadable, or compressed (gzip, xz,
            zstd, bzip2, lz4, zip: decompress it first).

    >>> import tempfile, os, gzip; p = os.path.join(tempfile.mkdtemp(), "c.txt.gz")
    >>> _ = open(p, "wb").write(gzip.compress(b"hi"))
    >>> check_input(p)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    bpe_core.errors.CorpusError: ...c.txt.gz: is gzip-compressed; decompress it first (gzip -dk ...c.txt.gz)
    """
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise CorpusError(path, "no such file") from None
    except OSError as exc:
        raise CorpusError(path, f"cannot read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise CorpusError(path, "is a directory, expected a text file")
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _FILE_KINDS if test(st.st_mode)), "a special file")
        if os.path.realpath(path) == os.path.realpath("/dev/stdin") or path in STDIN_PATHS:
            raise CorpusError(path, f"is not a regular file ({kind}); to read standard input, give - "
                                    f"instead of {path}")
        raise CorpusError(path, f"is not a regular file ({kind}); save it to a file first")
    if not os.access(path, os.R_OK):
        raise CorpusError(path, "permission denied")
    if st.st_size:
        try:
            with open(path, "rb") as f:
                head = f.read(16)
        except OSError as exc:
            raise CorpusError(path, f"cannot read: {exc.strerror or exc}") from None
        found = compressed_format(head)
        if found is not None and not compressed_ok:
            name, hint = found
            raise CorpusError(path, f"is {name}-compressed; decompress it first ({hint.format(path)})")
    return st.st_size


#: How much of the input :func:`binary_reason` looks at.
SNIFF_BYTES = 64 << 10
#: Share of the sniffed bytes that may be invalid UTF-8 or control characters before the input
#: looks binary (Latin-1 or CP-1252 prose stays far below it: one invalid byte per accented letter).
BINARY_SHARE = 0.30
_CONTROL = bytes(b for b in range(32) if b not in b"\t\n\x0b\x0c\r") + b"\x7f"


def binary_reason(head: bytes) -> str | None:
    """Why ``head`` (the start of a file) looks binary rather than text, or None.

    >>> binary_reason("plain text, ünïcödé".encode()), binary_reason(b"ab\\x00cd")
    (None, 'it has NUL bytes')
    >>> binary_reason(bytes(range(128, 256)) * 4)
    '100% of its first 512 bytes are invalid UTF-8 or control characters'
    """
    if not head:
        return None
    if b"\x00" in head:
        return "it has NUL bytes"
    text, consumed = codecs.utf_8_decode(head, "surrogateescape", False)   # a cut last character stays out
    # each invalid byte decoded to one lone surrogate (U+DC80..U+DCFF), the only ones in ``text``
    # (UTF-8 cannot hold surrogates): strict encoding drops them, so the length difference counts them
    invalid = len(text) - len(text.encode("utf-8", "ignore").decode("utf-8"))
    control = len(head[:consumed]) - len(head[:consumed].translate(None, _CONTROL))
    share = (invalid + control) / max(1, consumed)
    if consumed and share > BINARY_SHARE:
        return (f"{share:.0%} of its first {_fmt_sniffed(consumed)} are invalid UTF-8 or control "
                f"characters")
    return None


def _fmt_sniffed(n: int) -> str:
    return f"{n >> 10} KiB" if n >= 1 << 10 and n % (1 << 10) == 0 else f"{n} bytes"


def warn_if_binary(path: str | os.PathLike, stacklevel: int = 2) -> str | None:
    """Warn (:class:`BinaryInputWarning`) when the start of ``path`` does not look like text.

    Returns the reason, or None. A byte-level tokenizer takes any bytes, so this never stops a run.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            head = f.read(SNIFF_BYTES)
    except OSError:
        return None         # check_input reports unreadable files
    reason = binary_reason(head)
    if reason is not None:
        warnings.warn(f"{path}: looks binary, not text ({reason}); using its bytes anyway",
                      BinaryInputWarning, stacklevel=stacklevel + 1)
    return reason


def open_corpus(path: str | os.PathLike) -> np.ndarray:
    """Memory-map a file read-only as ``uint8`` (an empty file gives an empty array).

    >>> import tempfile; p = tempfile.mktemp(); _ = open(p, "wb").write(b"hi")
    >>> open_corpus(p).tobytes()
    b'hi'
    """
    size = check_input(path)
    if size == 0:
        return np.zeros(0, dtype=np.uint8)
    try:
        return np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as exc:
        raise CorpusError(path, f"cannot memory-map: {exc}") from None


def open_mmap_bytes(path: str | os.PathLike):
    """A read-only ``mmap.mmap`` of the file (``b""`` for an empty file); ``re`` can scan it."""
    size = check_input(path)
    if size == 0:
        return b""
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
