"""Exact or refused: an export is loaded by the library a user loads it with (HF ``tokenizers``,
``tiktoken``) and encodes a sample of the user's own text; any document whose ids differ from
bpe_core's encoder (the stage-aware one for SuperBPE and SupraTok) makes it inexact.

The sample (:func:`sample_documents`): documents drawn across the whole training input, not only its
head -- seeded byte offsets over all the files, each snapped to the next document start (after a
special token, else a blank line, else a line end) and read to the next one -- at most
:data:`MAX_DOCS` documents and :data:`MAX_BYTES` bytes. Where the input cannot be read again
(stdin, an iterator, compressed or record files, URLs) and no ``--check-text`` is given, the check
runs on :func:`builtin_documents`: adversarial text made here (digit runs, contractions, whitespace
runs, several scripts, emoji), never the packaged sample.

>>> docs = builtin_documents()
>>> len(docs) > 100 and any(b"1234567" in d for d in docs)
True
"""
from __future__ import annotations

import json
import os
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Optional, Sequence

from ..corpus.specials import encode_specials
from .model import Model

#: bpe_core's encoder for a model (the one that reproduces its training: stage-aware for SuperBPE
#: and SupraTok), given by the caller -- ``export.model_encoder`` -- since the encoder is a layer
#: above this one
Encode = Callable[[bytes], "Sequence[int]"]

__all__ = ["MAX_BYTES", "MAX_DOCS", "Exactness", "FolderCheck", "InexactExport", "builtin_documents",
           "check_export_files", "check_tokenizer_file", "check_tokenizer_json", "documents_for", "hf_folder_check",
           "input_files", "load_tiktoken_files", "sample_documents", "start_tokenizer_file_check"]

#: the most documents and bytes a check encodes (about a second for HF ``tokenizers``)
MAX_DOCS = 1000
MAX_BYTES = 2 << 20
#: bytes read at each picked offset to find one document (a longer document is cut at a line end)
_WINDOW = 32 << 10


class InexactExport(ValueError):
    """An export gives other ids than bpe_core on the checked text (the message: one line)."""


@dataclass
class Exactness:
    """The result of one check: ``what`` (the file checked, e.g. ``tokenizer.json``) on
    ``n_docs`` documents of ``on`` (the text's description); ``differing`` documents had other ids,
    ``example`` is the start of the first of them; ``seconds`` the cost of the check."""

    what: str
    on: str
    n_docs: int
    n_bytes: int
    differing: int = 0
    example: Optional[str] = None
    seconds: float = 0.0
    loader: str = ""
    exact_by_construction: bool = False
    notes: list = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return self.differing == 0

    @property
    def rate(self) -> float:
        """The share of documents with identical ids."""
        return 1 - self.differing / self.n_docs if self.n_docs else 1.0

    def line(self) -> str:
        """The result in words (one line).

        >>> Exactness("tokenizer.json", "corpus.txt", 200, 10_000, 20, "1234567 and").line()
        "tokenizer.json: other ids than bpe_core on 20 of 200 documents (90.0% identical) of corpus.txt, e.g. the document starting '1234567 and'"
        >>> Exactness("tokenizer.json", "corpus.txt", 200, 10_000, seconds=0.25).line()
        'tokenizer.json: identical ids on all 200 documents (10,000 bytes) of corpus.txt, checked in 0.25 s'
        """
        if self.exact_by_construction:
            return f"{self.what}: exact by construction (it runs bpe_core's own encoder)"
        if self.exact:
            return (f"{self.what}: identical ids on all {self.n_docs:,} documents ({self.n_bytes:,} bytes) of "
                    f"{self.on}, checked in {self.seconds:.2f} s")
        return (f"{self.what}: other ids than bpe_core on {self.differing:,} of {self.n_docs:,} documents "
                f"({100 * self.rate:.1f}% identical) of {self.on}, e.g. the document starting {self.example!r}")

    def as_dict(self) -> dict:
        out = asdict(self)
        out.update(exact=self.exact, identical_share=round(self.rate, 6), seconds=round(self.seconds, 3))
        return out


# ==== the text to check on =======================================================================


def _separator(head: bytes, specials: list[bytes]) -> bytes:
    """What separates documents in this text: the first special token it holds, else a blank line,
    else a line end."""
    for s in specials:
        if s in head:
            return s
    return b"\n\n" if b"\n\n" in head else b"\n"


def sample_documents(paths: Sequence[str | os.PathLike], special_tokens: Iterable[str] = (),
                     max_docs: int = MAX_DOCS, max_bytes: int = MAX_BYTES, seed: int = 0) -> list[bytes]:
    """Documents drawn across the plain-text files ``paths`` (see the module docstring): all of
    them when the files are small, else ``max_docs`` picks at seeded byte offsets over the whole
    input, each snapped to a document start; at most ``max_bytes`` bytes in all.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp(); p = os.path.join(d, "c.txt")
    >>> _ = open(p, "wb").write(b"".join(b"doc %d\\n\\n" % i for i in range(100_000)))
    >>> docs = sample_documents([p], max_docs=50)
    >>> len(docs), docs == sorted(docs, key=lambda x: int(x.split()[1])), int(docs[-1].split()[1]) > 90_000
    (50, True, True)
    """
    specials = encode_specials(list(special_tokens))
    files = [(os.fspath(p), os.path.getsize(p)) for p in paths]
    total = sum(size for _, size in files)
    docs: list[bytes] = []
    if total <= max_bytes:
        for path, _ in files:
            with open(path, "rb") as f:
                data = f.read()
            docs.extend(_split(data, _separator(data[:1 << 20], specials)))
        if len(docs) > max_docs:              # evenly spaced over the whole input
            step = len(docs) / max_docs
            docs = [docs[int(k * step)] for k in range(max_docs)]
        return docs
    rng = random.Random(seed)
    offsets = sorted(rng.randrange(total) for _ in range(max_docs))
    seen: set[tuple[int, int]] = set()
    budget = max_bytes
    handles: dict[int, object] = {}
    try:
        seps = {}
        for k, (path, _) in enumerate(files):
            handles[k] = open(path, "rb")
            seps[k] = _separator(os.pread(handles[k].fileno(), 1 << 20, 0), specials)
        for offset in offsets:
            k = 0
            while offset >= files[k][1]:
                offset -= files[k][1]
                k += 1
            fd, sep = handles[k].fileno(), seps[k]
            if offset:                        # the next document start after the offset
                at = os.pread(fd, _WINDOW, offset).find(sep)
                if at < 0:
                    continue
                offset += at + len(sep)
            start = offset
            if (k, start) in seen:
                continue
            seen.add((k, start))
            body = os.pread(fd, _WINDOW, start)
            end = body.find(sep)
            if end < 0:                       # a long document (or the file's end): cut at a line end
                cut = body.rfind(b"\n")
                end = cut + 1 if cut > 0 and len(body) == _WINDOW else len(body)
            doc = body[:end]
            if doc.strip():
                docs.append(doc)
                budget -= len(doc)
                if budget <= 0:
                    break
    finally:
        for h in handles.values():
            h.close()
    return docs


def _split(data: bytes, sep: bytes) -> list[bytes]:
    return [p for p in data.split(sep) if p.strip()]


def builtin_documents() -> list[bytes]:
    """Adversarial documents made here (deterministic): digit runs of every length in several
    scripts, contractions in every case, whitespace runs of every kind, mixed scripts, emoji,
    combining marks, code, and lines ending in spaces."""
    rng = random.Random(36)
    words = ["the", "The", "THE", "naïve", "Straße", "добрый", "день", "日本語", "한국어", "مرحبا", "שלום",
             "हिन्दी", "ไทย", "ΣΊΣΥΦΟΣ", "e\u0301", "👍🏽", "👨\u200d👩\u200d👧", "x²", "½", "a_b", "http://x.org/a?b=1",
             "I'm", "you'RE", "we'll", "it's", "'s", "don't", "O'Neil", "''", "--", "...", "(x)", "{1,3}", "#!"]
    spaces = [" ", "  ", "   ", "\t", "\n", "\n\n", " \n", "\r\n", "\u00a0", "\u3000", "  \n  "]
    docs = []
    for n in range(1, 25):
        digits = "".join(rng.choice("0123456789") for _ in range(n))
        docs.append(f"{digits} and {digits[::-1]},{digits}.{n} ({digits})  \n٣٤{digits}١".encode())
    for _ in range(200):
        parts = []
        for _ in range(rng.randrange(3, 30)):
            parts.append(rng.choice(words) if rng.random() < 0.7 else str(rng.randrange(10 ** rng.randrange(1, 12))))
            parts.append(rng.choice(spaces) if rng.random() < 0.4 else " ")
        docs.append("".join(parts).encode())
    docs.append(b"1234567 12345678901 on 2024-01-01 at 3.14159, +1 (555) 0100")
    docs.append(b"def f(x):\n    return x ** 2  # square\n\n\n    \n")
    docs.append("trailing spaces   \nand tabs\t\t\n   ".encode())
    return docs


# ==== the checks ================================================================================


def _compare(what: str, on: str, encode: Encode, docs: Sequence[bytes],
             encode_batch: Callable[[list[str]], list[list[int]]], loader: str, t0: float) -> Exactness:
    """Encode ``docs`` (as UTF-8 text, invalid bytes as U+FFFD: the libraries take text) both ways."""
    texts = _texts(docs)
    return _compare_ids(what, on, encode, docs, texts, encode_batch(texts), loader, t0)


def _texts(docs: Sequence[bytes]) -> list[str]:
    return [d.decode("utf-8", "replace") for d in docs]


def _compare_ids(what: str, on: str, encode: Encode, docs: Sequence[bytes], texts: list[str],
                 theirs: Sequence[Sequence[int]], loader: str, t0: float,
                 mine: Optional[Sequence[Sequence[int]]] = None) -> Exactness:
    """Compare the library's ids of ``texts`` (``theirs``) with bpe_core's (``mine``, when already made)."""
    differing, example = 0, None
    if mine is None:
        mine = [encode(text.encode("utf-8")) for text in texts]
    for text, ids, own in zip(texts, theirs, mine):
        if list(own) != list(ids):
            differing += 1
            if example is None:
                example = text[:60]
    return Exactness(what, on, len(texts), sum(len(d) for d in docs), differing, example,
                     time.perf_counter() - t0, loader)


def check_tokenizer_json(encode: Encode, text: str, docs: Sequence[bytes], on: str,
                         what: str = "tokenizer.json") -> Exactness:
    """Load ``text`` (a ``tokenizer.json``) with ``tokenizers.Tokenizer.from_str`` and compare its
    ids with bpe_core's (``encode``) on ``docs``. Needs HF ``tokenizers``."""
    import tokenizers

    t0 = time.perf_counter()
    tok = tokenizers.Tokenizer.from_str(text)

    def batch(texts):
        return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]

    return _compare(what, on, encode, docs, batch, f"tokenizers {tokenizers.__version__}", t0)


def check_tokenizer_file(encode: Encode, path: str, docs: Sequence[bytes], on: str,
                         what: str = "tokenizer.json") -> Exactness:
    """:func:`check_tokenizer_json` on a written file, loaded as a user loads it
    (``tokenizers.Tokenizer.from_file``)."""
    return start_tokenizer_file_check(encode, path, docs, on, what, separate=False)()


#: A ``tokenizer.json`` this large (a vocabulary of long tokens: 1.2 GB for 50 MB of one byte) is
#: loaded by HF ``tokenizers`` in a child process while this one writes the folder's other files
#: (loading holds the GIL for seconds: a thread would not overlap).
SEPARATE_CHECK_BYTES = 64 << 20

#: The child: load the file with HF ``tokenizers`` (nothing of bpe_core), encode the texts, give the ids.
_CHILD = """if True:
    import json, sys, time
    sys.path[:], path, texts = json.load(sys.stdin)      # (this process's modules: the same tokenizers)
    try:
        t0 = time.perf_counter()
        import tokenizers
        tok = tokenizers.Tokenizer.from_file(path)
        ids = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
        out = ("ids", (tokenizers.__version__, time.perf_counter() - t0), ids)
    except ImportError as exc:
        out = ("import", type(exc).__name__, str(exc))
    except BaseException as exc:
        out = ("error", type(exc).__name__, str(exc))
    json.dump(out, sys.stdout)
"""


def start_tokenizer_file_check(encode: Encode, path: str, docs: Sequence[bytes], on: str,
                               what: str = "tokenizer.json", separate: Optional[bool] = None,
                               mine: Optional[list[list[int]]] = None) -> Callable[[], Exactness]:
    """Begin :func:`check_tokenizer_file`; returns the function that waits for its result (raises
    what loading raised: ``ImportError`` when HF ``tokenizers`` is not installed, any other error when
    it cannot load the file). ``separate``: load it in a child process (default: for a file of
    :data:`SEPARATE_CHECK_BYTES` or more), so that the caller writes its other files meanwhile. The
    child loads the same file with the same library; the ids are compared here, with bpe_core's
    (``mine``: bpe_core's ids of ``docs``, when the caller made them already)."""
    t0 = time.perf_counter()
    if separate is None:
        separate = os.path.getsize(path) >= SEPARATE_CHECK_BYTES
    texts = _texts(docs)
    if not separate:
        import tokenizers

        tok = tokenizers.Tokenizer.from_file(path)
        theirs = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
        result = _compare_ids(what, on, encode, docs, texts, theirs, f"tokenizers {tokenizers.__version__}", t0,
                              mine)
        return lambda: result
    import json
    import subprocess
    import sys
    import threading

    proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    got: list = []
    feeder = threading.Thread(target=lambda: got.append(proc.communicate(json.dumps([sys.path, path, texts]).encode())[0]),
                              daemon=True)
    feeder.start()

    def wait() -> Exactness:
        try:
            own = mine if mine is not None else [list(encode(t.encode("utf-8"))) for t in texts]  # (while it loads)
            feeder.join()
        finally:
            if proc.poll() is None:         # (an error or a signal here: the child goes too)
                proc.kill()
                proc.wait()
        try:
            kind, name, value = json.loads(got[0]) if got and got[0] else ("error", "exit", proc.returncode)
        except Exception:  # noqa: BLE001  (a child killed half-way: no result)
            kind, name, value = "error", "exit", proc.returncode
        if kind == "import":
            raise ImportError(value)
        if kind != "ids":
            raise RuntimeError(value if name != "exit" else f"the check's process exited {value}")
        version, seconds = name           # (the check's cost: the child's load and encoding, not the wait)
        return _compare_ids(what, on, encode, docs, texts, value, f"tokenizers {version}", time.perf_counter() - seconds,
                            own)

    def cancel() -> None:
        if proc.poll() is None:
            proc.kill()
        proc.wait()

    wait.cancel = cancel                # (the caller failed before waiting: the child goes)
    return wait


def load_tiktoken_files(ranks_path: str, sidecar_path: str, name: Optional[str] = None):
    """A ``tiktoken.Encoding`` from a ranks file (``tiktoken.load.load_tiktoken_bpe``) and the
    sidecar ``dump_tiktoken`` writes beside it."""
    import tiktoken
    import tiktoken.load

    with open(sidecar_path, encoding="utf-8") as f:
        meta = json.load(f)
    ranks = tiktoken.load.load_tiktoken_bpe(ranks_path)
    return tiktoken.Encoding(name or meta["name"], pat_str=meta["pat_str"], mergeable_ranks=ranks,
                             special_tokens=meta["special_tokens"])


def check_export_files(encode: Encode, fmt: str, folder: str, docs: Sequence[bytes], on: str) -> Exactness:
    """Check the files of a ``fmt`` export written into ``folder`` (not yet published) with the
    library a user loads them with: ``tokenizer.json`` with HF ``tokenizers``; the tiktoken ranks
    and sidecar with ``tiktoken``; GPT-2 ``vocab.json`` + ``merges.txt`` with
    ``tokenizers.ByteLevelBPETokenizer`` (the GPT-2 split: these files carry no pattern); a
    ``transformers`` folder by the ``tokenizer.json`` it wraps, if any (else it runs bpe_core's own
    encoder: exact by construction)."""
    names = sorted(os.listdir(folder))
    t0 = time.perf_counter()
    # hf: the one file written (any name); transformers: a tokenizer.json it wraps, if any
    hf_files = names[:1] if fmt == "hf" else [n for n in names if _is_hf_json(os.path.join(folder, n))]
    if fmt in ("hf", "transformers") and hf_files:
        name = hf_files[0]
        return check_tokenizer_file(encode, os.path.join(folder, name), docs, on,
                                    what="the HF tokenizer.json" if fmt == "hf" else f"{fmt} {name}")
    if fmt == "transformers":
        return Exactness("the transformers folder", on, 0, 0, exact_by_construction=True)
    if fmt == "tiktoken":
        ranks = next(n for n in names if not n.endswith(".json"))
        enc = load_tiktoken_files(os.path.join(folder, ranks), os.path.join(folder, ranks + ".json"))
        import tiktoken

        return _compare("the tiktoken files", on, encode, docs, lambda texts: enc.encode_ordinary_batch(texts),
                        f"tiktoken {tiktoken.__version__}", t0)
    if fmt == "gpt2":
        import tokenizers

        tok = tokenizers.ByteLevelBPETokenizer(os.path.join(folder, "vocab.json"), os.path.join(folder, "merges.txt"))

        def batch(texts):
            return [e.ids for e in tok.encode_batch(texts)]

        return _compare("vocab.json + merges.txt", on, encode, docs, batch,
                        f"tokenizers {tokenizers.__version__} ByteLevelBPETokenizer", t0)
    raise ValueError(f"unknown format {fmt!r}")


def _is_hf_json(path: str) -> bool:
    if not path.endswith(".json") or os.path.basename(path) == "tokenizer_config.json":
        return False
    with open(path, "rb") as f:
        head = f.read(4096)
    return b'"pre_tokenizer"' in head or b'"added_tokens"' in head


def input_files(input_path) -> tuple[list[str], str]:
    """The plain-text files of a training input (``TrainConfig.input_path`` or a report's
    ``input_path``) that a check can sample, and why not when there are none (``([], why)``):
    stdin, iterators, compressed or record files and URLs cannot be read again here.

    >>> input_files("-")
    ([], 'the training input was standard input')
    """
    from ..corpus.inputs import expand_inputs

    if input_path is None:
        return [], "the training input is not recorded"
    if input_path == "-":
        return [], "the training input was standard input"
    try:
        sources = expand_inputs(input_path)
    except Exception as exc:  # noqa: BLE001  (gone, moved, unreadable: any reason means not here)
        return [], f"the training input cannot be read here ({(str(exc).splitlines() or [''])[0]})"
    paths = [s.name for s in sources if s.plain_text and not s.is_url and s.obj is None]
    if not paths:
        return [], "the training input is not plain text files (compressed, records, URLs or an iterator)"
    return paths, ""


def documents_for(model: Model, check_text: "str | None" = None, input_path=None,
                  max_docs: int = MAX_DOCS) -> tuple[list[bytes], str, str]:
    """The documents an export of ``model`` is checked on, what they are, and a note when they are
    not the user's text: ``check_text`` (a file) when given, else a sample across the training
    input (:func:`input_files`), else :func:`builtin_documents`."""
    if check_text is not None:
        docs = sample_documents([check_text], model.special_tokens, max_docs=max_docs)
        if docs:
            return docs, f"{os.path.basename(check_text)} ({max_docs:,} documents at most, drawn across it)", ""
        why = f"{check_text} holds no text"
    else:
        paths, why = input_files(input_path)
        if paths:
            name = os.path.basename(paths[0]) + (f" and {len(paths) - 1} more file(s)" if len(paths) > 1 else "")
            docs = sample_documents(paths, model.special_tokens, max_docs=max_docs)
            if docs:
                return docs, f"the training input {name} (a sample across it)", ""
            why = "the training input holds no text"
    return (builtin_documents(), "bpe_core's built-in check text",
            f"{why}, so the check ran on bpe_core's built-in check text; give --check-text FILE to check on yours")


def hf_folder_check(encode: Encode, docs: Optional[Sequence[bytes]] = None, on: str = "",
                    allow_inexact: bool = False):
    """The check ``formats.folder.save_folder`` runs on a model folder's ``tokenizer.json`` before
    publishing it: a :class:`FolderCheck`, ``(model, path) -> (write, facts)`` -- whether to keep HF's
    files, and what the report says of them (``hf_files``: the check's result and cost, why they are
    left out). ``encode``: bpe_core's encoder for the model; ``docs``: the documents to check on
    (default :func:`builtin_documents`)."""
    if docs is None:
        docs, on = builtin_documents(), "bpe_core's built-in check text"
    return FolderCheck(encode, docs, on, allow_inexact)


class FolderCheck:
    """:func:`hf_folder_check`'s check: ``check(model, path) -> (write, facts)``, where ``path`` is the
    written ``tokenizer.json`` (loaded with ``tokenizers.Tokenizer.from_file``, as a user loads it);
    ``check.start(model, path)`` begins it and returns the function that waits for ``(write, facts)``
    (a large file is loaded in a child process meanwhile: :func:`start_tokenizer_file_check`).

    bpe_core's ids of the documents are made here, once, and the encoder is not kept: the folder is
    written without it in memory (a vocabulary of long tokens: its token table is another copy of
    every token's bytes)."""

    def __init__(self, encode: Encode, docs: Sequence[bytes], on: str, allow_inexact: bool = False):
        self.docs, self.on, self.allow_inexact = docs, on, allow_inexact
        self.mine = [list(encode(t.encode("utf-8"))) for t in _texts(docs)]
        self.encode = self._encoded

    def _encoded(self, data: bytes) -> list[int]:
        raise AssertionError("FolderCheck compares the ids it made at its start")   # (mine is always given)

    def __call__(self, model: Model, path: str) -> tuple[bool, dict]:
        return self.start(model, path)()

    def start(self, model: Model, path: str) -> Callable[[], tuple[bool, dict]]:
        try:
            wait = start_tokenizer_file_check(self.encode, path, self.docs, self.on, mine=self.mine)
        except Exception as exc:  # noqa: BLE001  (failed at once: the same facts, later)
            failed = exc
            return lambda: self._facts(None, failed)

        def result() -> tuple[bool, dict]:
            try:
                return self._facts(wait(), None)
            except Exception as exc:  # noqa: BLE001
                return self._facts(None, exc)

        result.cancel = getattr(wait, "cancel", lambda: None)
        return result

    def _facts(self, result: Optional[Exactness], exc: Optional[BaseException]) -> tuple[bool, dict]:
        if isinstance(exc, ImportError):
            return False, {"why": "HF tokenizers is not installed, so they could not be checked"}
        if exc is not None:           # (any failure of the library means: not loadable)
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            return False, {"why": f"HF tokenizers cannot load this tokenizer.json ({first})"}
        facts: dict = {"check": result.as_dict()}
        if not result.exact:
            facts["why"] = result.line()
        return result.exact or self.allow_inexact, facts
