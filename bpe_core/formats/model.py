"""Reading and writing tokenizer models.

Two formats are written by ``tools/train_bpe.py``:

- the **native model file** ``model.json``: a versioned JSON document holding the pattern, the special
  tokens, every vocabulary entry and every merge as exact bytes (hex), so it round-trips any byte
  sequence, including invalid UTF-8, plus the method and its stage marks;
- GPT-2 ``vocab.json`` + ``merges.txt`` in the byte-to-unicode convention that HF ``tokenizers``,
  ``transformers`` and tiktoken's ``data_gym_to_mergeable_bpe_ranks`` load.

See ``docs/formats.md`` for the field-by-field description.
"""
from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import ModelFormatError
from ..pretok.patterns import pattern_name, resolve_pattern
from ..runtime.atomic import atomic_write, publish_folder
from . import registry
from .texts import FolderTexts, bytes_to_unicode, merges_hex_pieces, token_hex_pieces, unicode_to_bytes


MODEL_FILE = "model.json"
VOCAB_FILE = "vocab.json"
MERGES_FILE = "merges.txt"
REPORT_FILE = "train_report.json"
#: The files of a model folder, published together (:func:`dump_folder`). A file of these names in
#: the folder that a run does not write belongs to the older model and goes with it; every other
#: file there is carried over. To add a file to the set, write it in :func:`dump_folder` (or pass
#: it in ``extra``) and list its name here.
FOLDER_FILES = (MODEL_FILE, VOCAB_FILE, MERGES_FILE, REPORT_FILE, "tokenizer.json", "tokenizer_config.json",
                "tokenization_bpe_core.py")
FORMAT_NAME = "bpe_core.model"
FORMAT_VERSION = 1


@dataclass
class Model:
    """A trained tokenizer: everything the encoder needs to reproduce training.

    Attributes:
        vocab: id -> token bytes. Ids 0-255 are the single bytes, then the special tokens in
            order, then one id per merge in merge order.
        merges: ordered ``(left_bytes, right_bytes)`` pairs; rank = position.
        special_tokens: the special tokens as strings, in id order.
        pattern: the pre-tokenization regex (the string, never just a name).
        method: ``"bpe"``, ``"superbpe"`` or ``"supratok"``.
        stages: curriculum marks, e.g. ``[{"name": "bpe", "merges": 3000}, ...]``; a stage-aware
            encoder applies each stage's merges with that stage's boundary rules.
        metadata: free-form facts about the run (input, options), stored but not interpreted.
    """

    vocab: dict[int, bytes]
    merges: list[tuple[bytes, bytes]]
    special_tokens: list[str] = field(default_factory=list)
    pattern: str = ""
    method: str = "bpe"
    stages: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def pattern_name(self) -> str | None:
        return pattern_name(self.pattern)


# ==== GPT-2 byte <-> unicode (the tables: formats.texts) ===============================


def token_to_gpt2(token: bytes) -> str:
    """``b" the" -> "Ġthe"``."""
    return token.decode("latin-1").translate(bytes_to_unicode())     # one C call (a byte is a code point)


def gpt2_names(tokens) -> dict[bytes, str]:
    """``{token: token_to_gpt2(token)}`` for each of ``tokens`` (the writers look every merge's parts
    up here instead of converting them again)."""
    table = bytes_to_unicode()
    return {t: t.decode("latin-1").translate(table) for t in tokens}


def gpt2_to_token(text: str) -> bytes:
    """``"Ġthe" -> b" the"``; raises KeyError for a character outside the 256-symbol alphabet."""
    table = unicode_to_bytes()
    return bytes(table[c] for c in text)


# ==== Native model file ======================================================================



#: Files of at least this many bytes are hashed with ``hashlib`` (OpenSSL, with the CPU's SHA
#: instructions where it has them: ~4x CPython's own sha256, 0.3 GB/s; 1.2 GB for 50 MB of one byte)
BIG_DIGEST_BYTES = 64 << 20


def _sha256(big: bool = False):
    """A sha256 hash object: CPython's own implementation when it has one (``hashlib`` would load
    OpenSSL's libcrypto, ~3.5 MB of resident pages in every process that writes a model folder), or
    ``hashlib``'s for a ``big`` file (:data:`BIG_DIGEST_BYTES`: there the speed is worth the pages)."""
    if big:
        from hashlib import sha256 as openssl_sha256
        return openssl_sha256()
    try:
        from _sha2 import sha256          # Python 3.12+
    except ImportError:
        try:
            from _sha256 import sha256    # Python 3.11
        except ImportError:
            from hashlib import sha256
    return sha256()


def file_sha256(path: str | os.PathLike) -> str:
    """The sha256 of a file, hex (what ``model.json`` records for ``vocab.json`` and ``merges.txt``)."""
    h = _sha256(os.path.getsize(path) >= BIG_DIGEST_BYTES)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def dump_model(model: Model, path: str | os.PathLike, files: dict[str, str] | None = None, *,
               texts: FolderTexts | None = None, durable: bool = True) -> None:
    """Write the native model file atomically (temp file + rename).

    ``files`` maps the names of sibling files (``vocab.json``, ``merges.txt``) to their sha256; the
    loaders then refuse a folder whose files do not match (see :func:`dump_folder`). ``texts``: the
    model's ``formats.texts.FolderTexts`` when the caller has it; ``durable=False``: a plain write
    (:func:`dump_folder`'s files are in a private folder that is fsynced and published whole).
    """
    n = len(model.vocab)
    if texts is not None:
        if texts.ids != list(range(n)):
            raise ValueError("vocab ids must be 0..n-1")
        tokens = texts.tokens
    else:
        if sorted(model.vocab) != list(range(n)):
            raise ValueError("vocab ids must be 0..n-1")
        tokens = [model.vocab[i] for i in range(n)]
    head = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "method": model.method,
        "pattern": model.pattern,
        "pattern_name": model.pattern_name,
        "special_tokens": list(model.special_tokens),
    }
    tail: dict[str, Any] = {"stages": model.stages, "metadata": model.metadata}
    if files:
        tail["files"] = {name: {"sha256": digest} for name, digest in files.items()}
    # The text of json.dump(head + vocab + merges + tail, separators=(",", ":")), made with the C
    # encoder (json.dumps) around the two long lists, which are hex strings (nothing to escape)
    # joined directly: the same bytes, without a list object per merge (less time, a lower peak).
    # (the long lists in pieces: formats.texts)
    write_pieces(path, itertools.chain((_json_compact(head)[:-1], ',"vocab":'), token_hex_pieces(tokens),
                                        (',"merges":',), merges_hex_pieces(model.merges),
                                        (",", _json_compact(tail)[1:], "\n")), durable)


def write_pieces(path: str | os.PathLike, pieces, durable: bool = True, digest: bool = False,
                  big: bool = False) -> str | None:
    """Write ``pieces`` (str, as UTF-8, or bytes) one after another into ``path``: through
    :func:`~bpe_core.runtime.atomic.atomic_write` when ``durable``, else a plain write. Returns the
    sha256 of what was written when ``digest`` (no second read of the file; ``big``: a file of
    :data:`BIG_DIGEST_BYTES` or more is expected, hashed by ``hashlib``)."""
    h = _sha256(big) if digest else None
    with (atomic_write(path, "wb") if durable else open(path, "wb")) as f:
        for piece in pieces:
            data = piece.encode("utf-8") if isinstance(piece, str) else piece
            if h is not None:
                h.update(data)
            f.write(data)
            del data
    return h.hexdigest() if h is not None else None


def _json_compact(doc: Any) -> str:
    """``json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))``'s text, made with the C encoder
    (only the one-shot ``json.dumps`` uses it)."""
    return json.dumps(doc, ensure_ascii=False, indent=None, separators=(",", ":"))


def dump_folder(model: Model, folder: str | os.PathLike,
                extra: dict[str, Any] | None = None,
                names: dict[bytes, str] | None = None, *, texts: FolderTexts | None = None,
                early: Callable[[str], Callable[[], dict[str, Any]]] | None = None) -> list[bytes]:
    """Publish a model folder as one unit: ``vocab.json``, ``merges.txt``, ``model.json`` (holding
    their sha256) and the ``extra`` files (name -> text or bytes, e.g. ``train_report.json``, a list
    of them written one after another, or a function that returns one: called when that file is
    written, after ``model.json``) are
    written into a fresh temp folder that then replaces ``folder`` in one step
    (:func:`~bpe_core.runtime.atomic.publish_folder`): a run killed at any point leaves the older
    model whole or the new one, never a mix, and no folder at all where there was none. Other
    files in ``folder`` are carried over; :data:`FOLDER_FILES` this run does not write go with the
    old model.

    Returns the token bytes ``vocab.json`` left out (see :func:`dump_gpt2`). ``texts``: the model's
    ``formats.texts.FolderTexts`` when the caller has it (``names`` is no longer needed: the GPT-2
    strings are made once there). ``early(tmp)``: called with the private folder before the model
    files are written (it may write files there and start work on them); what it returns is called
    after them and gives more extra files, written before ``extra``'s.
    """
    if texts is None:
        texts = FolderTexts(model.vocab, model.merges)
    with publish_folder(folder, owned=FOLDER_FILES, last=MODEL_FILE) as tmp:
        # plain writes: the folder is private until publish_folder fsyncs it and swaps it in
        later = early(tmp) if early is not None else None
        dropped, sums = _write_gpt2(texts, tmp, VOCAB_FILE, MERGES_FILE, durable=False)
        dump_model(model, os.path.join(tmp, MODEL_FILE), files=sums, texts=texts, durable=False)
        files = {**(later() if later is not None else {}), **(extra or {})}
        for name, data in files.items():
            if os.path.basename(name) != name or name in (MODEL_FILE, VOCAB_FILE, MERGES_FILE):
                raise ValueError(f"{name!r}: not a name for an extra file of a model folder")
            if callable(data):          # made now: one long text at a time, not all of them at once
                data = data()
            # text, bytes, or pieces of them written in order
            write_pieces(os.path.join(tmp, name), [data] if isinstance(data, (str, bytes)) else data, durable=False)
            del data
    return dropped


def folder_files(path: str | os.PathLike) -> list[str]:
    """The files a model load reads from ``path`` (a folder or a model file), those that exist:
    what no output of a run that reads this model may be.

    >>> import tempfile; folder_files(tempfile.mkdtemp())
    []
    """
    path = os.fspath(path)
    folder = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    names = [os.path.join(folder, n) for n in (MODEL_FILE, VOCAB_FILE, MERGES_FILE)]
    if not os.path.isdir(path):
        names.insert(0, path)
    return [n for n in dict.fromkeys(names) if os.path.isfile(n)]


def _read_json(path: str, what: str) -> Any:
    """Read a JSON file; every failure is one ModelFormatError naming the file."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ModelFormatError(path, f"cannot read: {exc.strerror or exc}") from None
    except MemoryError:
        raise ModelFormatError(path, "too large to read") from None
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ModelFormatError(path, f"not {what} (not UTF-8: byte {raw[exc.start]:#04x} at offset {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise ModelFormatError(path, f"not {what} (invalid JSON: {exc})") from None
    except RecursionError:
        raise ModelFormatError(path, f"not {what} (JSON nesting too deep)") from None
    except MemoryError:
        raise ModelFormatError(path, "too large to read") from None


def _kind(x: Any) -> str:
    """The JSON name of a value's type, for messages."""
    if x is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "list",
            dict: "object"}.get(type(x), type(x).__name__)


def is_count(x: Any) -> bool:
    """A non-negative integer (not a boolean): a count field of a model file."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def load_model(path: str | os.PathLike) -> Model:
    """Read a native model file (or a folder holding ``model.json``).

    Every field is checked (type, layout, the merge chain, the stages the method needs) and, when
    ``model.json`` records the sha256 of ``vocab.json``/``merges.txt``, those files too. Any problem
    is one :class:`ModelFormatError` naming the file and the field.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, MODEL_FILE)
    doc = _read_json(path, "a bpe_core model file")

    def bad(field_name: str, reason: str) -> ModelFormatError:
        sep = ": " if reason.startswith("entry") else " "
        return ModelFormatError(path, f"field {field_name!r}{sep}{reason}")

    if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
        raise ModelFormatError(path, f"not a bpe_core model file (no \"format\": \"{FORMAT_NAME}\")")
    version = doc.get("version")
    if not (isinstance(version, int) and not isinstance(version, bool)) or version != FORMAT_VERSION:
        raise ModelFormatError(path, f"unsupported format version {version!r} (this bpe_core reads {FORMAT_VERSION})")
    for name in ("vocab", "merges", "pattern"):
        if name not in doc:
            raise bad(name, "is missing")
    if "method" not in doc and isinstance(doc.get("stages"), list) and any(
            not isinstance(st, dict) or st.get("name", "bpe") != "bpe" for st in doc["stages"]):
        # a model of another method (SuperBPE, SupraTok) with its method field lost: read as plain
        # BPE it would encode differently, without a word; only plain BPE stages may go without it
        raise bad("method", "is missing, and the model has stages other than plain BPE's: only a plain BPE "
                            "model may leave it out "
                            "(add \"method\": \"superbpe\" or the method that wrote it)")
    method = doc.get("method", "bpe")
    if not isinstance(method, str) or method not in registry.names():
        raise bad("method", f"must be one of {', '.join(registry.names())}, got {method!r}")
    pattern = doc["pattern"]
    if not isinstance(pattern, str) or not pattern:
        raise bad("pattern", f"must be a non-empty string, got {_kind(pattern)}")
    import regex                # (only a model load needs it: not imported with the package)

    try:
        pattern = resolve_pattern(pattern)
        regex.compile(pattern)
    except (regex.error, ValueError) as exc:
        raise bad("pattern", f"is not a valid regex ({exc})") from None
    specials = doc.get("special_tokens", [])
    if not isinstance(specials, list) or not all(isinstance(s, str) and s for s in specials):
        raise bad("special_tokens", "must be a list of non-empty strings")
    raw_vocab, raw_merges = doc["vocab"], doc["merges"]
    if not isinstance(raw_vocab, list):
        raise bad("vocab", f"must be a list of hex strings, got {_kind(raw_vocab)}")
    if not isinstance(raw_merges, list):
        raise bad("merges", f"must be a list of [left_hex, right_hex] pairs, got {_kind(raw_merges)}")
    vocab: dict[int, bytes] = {}
    for i, h in enumerate(raw_vocab):
        try:
            vocab[i] = bytes.fromhex(h)
        except (TypeError, ValueError):
            raise bad("vocab", f"entry {i} must be a hex string, got {h!r:.40}") from None
        if not vocab[i]:
            raise bad("vocab", f"entry {i} is empty")
    merges: list[tuple[bytes, bytes]] = []
    for r, pair in enumerate(raw_merges):
        try:
            a, b = pair
            a, b = bytes.fromhex(a), bytes.fromhex(b)
        except (TypeError, ValueError):
            raise bad("merges", f"entry {r} must be a pair of hex strings, got {pair!r:.60}") from None
        if not a or not b:
            raise bad("merges", f"entry {r} has an empty part")
        merges.append((a, b))
    stages = doc.get("stages") or []
    if not isinstance(stages, list) or not all(isinstance(s, dict) for s in stages):
        raise bad("stages", f"must be a list of objects, got {_kind(stages)}")
    metadata = doc.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise bad("metadata", f"must be an object, got {_kind(metadata)}")
    files = doc.get("files") or {}
    if not isinstance(files, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("sha256"), str) for v in files.values()):
        raise bad("files", "must map file names to {\"sha256\": hex}")
    model = Model(vocab=vocab, merges=merges, special_tokens=list(specials), pattern=pattern,
                  method=method, stages=list(stages), metadata=dict(metadata))
    _check_layout(path, vocab, merges, specials)
    check_model(model, path)
    _check_files(path, files)
    return model


def _check_files(path: str, files: dict[str, dict]) -> None:
    """The sibling files ``model.json`` records must match their sha256 (absent files are fine:
    ``model.json`` alone is a whole model)."""
    folder = os.path.dirname(os.path.abspath(path))
    shown = os.path.join(os.path.dirname(path), "") or "./"
    for name, entry in files.items():
        if os.path.basename(name) != name:
            raise ModelFormatError(path, f"field 'files': {name!r} is not a file name")
        sibling = os.path.join(folder, name)
        if not os.path.exists(sibling):
            continue
        try:
            digest = file_sha256(sibling)
        except OSError as exc:
            raise ModelFormatError(sibling, f"cannot read: {exc.strerror or exc}") from None
        if digest != entry["sha256"]:
            raise ModelFormatError(shown, f"{name} does not match {os.path.basename(path)} (written by another "
                                   f"run; was a run interrupted?): retrain into this folder, or delete "
                                   f"{name} to use {os.path.basename(path)} alone")


def _check_layout(path, vocab, merges, specials) -> None:
    """The native layout: ids 0-255 the single bytes, then the special tokens, then one id per merge."""
    for i in range(256):
        if vocab.get(i) != bytes([i]):
            raise ModelFormatError(path, f"field 'vocab': id {i} must be the single byte {i}")
    for k, s in enumerate(specials):
        if vocab.get(256 + k) != s.encode("utf-8"):
            raise ModelFormatError(path, f"field 'special_tokens': {s!r} must have id {256 + k}")
    base = 256 + len(specials)
    if len(vocab) != base + len(merges):
        raise ModelFormatError(path, f"field 'vocab' has {len(vocab)} entries, expected {base} + {len(merges)} merges")
    for r, (a, b) in enumerate(merges):
        if vocab[base + r] != a + b:
            raise ModelFormatError(path, f"field 'merges': merge {r} ({a!r}, {b!r}) does not build vocab id {base + r}")


def check_model(model: Model, path: str | os.PathLike = "model") -> None:
    """Check what every consumer of a model relies on; raise :class:`ModelFormatError` naming ``path``.

    - ``method`` is known and ``stages`` has what its encoder needs (each stage's ``merges`` count,
      adding up to the number of merges);
    - ids are non-negative and dense enough to index (below ``len(vocab) + len(merges)``), the 256
      single bytes and the special tokens are in the vocab;
    - the merge chain: each merge's two parts exist before it (a single byte or built by an earlier
      merge) and the bytes it builds are in the vocab. Two merges may build the same bytes
      (docs/semantics.md); that is allowed.

    Linear in the size of the model.

    >>> vocab = {i: bytes([i]) for i in range(256)}; vocab[256] = b" in"
    >>> check_model(Model(vocab=vocab, merges=[(b" i", b"n")]))
    Traceback (most recent call last):
    ...
    bpe_core.errors.ModelFormatError: model: field 'merges': merge 0 (b' i', b'n'): b' i' is neither a single byte nor built by an earlier merge
    """
    path = os.fspath(path)
    if model.method not in registry.names():
        raise ModelFormatError(path, f"field 'method' must be one of {', '.join(registry.names())}, "
                                     f"got {model.method!r}")
    _check_stages(path, model)
    limit = len(model.vocab) + len(model.merges)
    present: set[bytes] = set()
    for i, b in model.vocab.items():
        if not (isinstance(i, int) and not isinstance(i, bool)) or not 0 <= i < max(limit, 1):
            raise ModelFormatError(path, f"field 'vocab': id {i!r} is out of range (ids are 0..{limit - 1} "
                                   f"for {len(model.vocab)} tokens and {len(model.merges)} merges)")
        if not isinstance(b, bytes) or not b:
            raise ModelFormatError(path, f"field 'vocab': id {i} must hold non-empty bytes")
        present.add(b)
    singles = [bytes([x]) for x in range(256)]
    missing = [x for x in range(256) if singles[x] not in present]
    if missing:
        raise ModelFormatError(path, f"field 'vocab' lacks the single-byte tokens {missing[:8]}")
    for s in model.special_tokens:
        if s.encode("utf-8") not in present:
            raise ModelFormatError(path, f"field 'special_tokens': {s!r} is not in the vocab")
    known = set(singles)
    for r, (a, b) in enumerate(model.merges):
        for part in (a, b):
            if part not in known:
                raise ModelFormatError(path, f"field 'merges': merge {r} ({a!r}, {b!r}): {part!r} is neither a "
                                       f"single byte nor built by an earlier merge")
        if a + b not in present:
            raise ModelFormatError(path, f"field 'merges': merge {r} ({a!r}, {b!r}) builds {a + b!r}, which is "
                                   f"not in the vocab")
        known.add(a + b)


def _check_stages(path: str, model: Model) -> None:
    method = registry.get(model.method)
    stages, n = model.stages, len(model.merges)
    want = method.n_stages
    if not stages and want is None:
        return
    if want is not None and len(stages) != want:
        raise ModelFormatError(path, f"field 'stages': a {model.method} model needs {want} stages, got {len(stages)}")
    total = 0
    for k, st in enumerate(stages):
        if not isinstance(st, dict):
            raise ModelFormatError(path, f"field 'stages': stage {k} must be an object, got {_kind(st)}")
        if not is_count(st.get("merges")):
            raise ModelFormatError(path, f"field 'stages': stage {k} needs \"merges\", a count of merges, "
                                   f"got {st.get('merges')!r:.40}")
        total += st["merges"]
    if total != n:
        raise ModelFormatError(path, f"field 'stages': the stages hold {total} merges, the model has {n}")
    method.check_stages(path, model)          # what the method itself writes into its stages


# ==== GPT-2 vocab.json + merges.txt ==========================================================


def dump_gpt2(vocab: dict[int, bytes], merges: list[tuple[bytes, bytes]], folder: str | os.PathLike,
              vocab_name: str = VOCAB_FILE, merges_name: str = MERGES_FILE,
              names: dict[bytes, str] | None = None) -> list[bytes]:
    """Write ``vocab.json`` and ``merges.txt`` (GPT-2 byte-to-unicode form) atomically.

    JSON keys must be unique: when two ids hold the same bytes (two merges can build the same
    string, e.g. ``(a, bc)`` and ``(ab, c)``), the smaller id keeps the entry. The encoders of
    bpe_core, HF and tiktoken all emit the smaller id for such bytes, so ids do not change.
    Returns the token bytes that were left out that way. (``names`` is no longer needed: each
    token's GPT-2 string is made once, ``formats.texts``.)
    """
    dropped, _ = _write_gpt2(FolderTexts(vocab, merges), os.fspath(folder), vocab_name, merges_name)
    return dropped


def _write_gpt2(texts: FolderTexts, folder: str, vocab_name: str, merges_name: str,
                durable: bool = True) -> tuple[list[bytes], dict[str, str]]:
    """Write ``vocab.json`` and ``merges.txt`` from ``texts``; the bytes left out and each file's sha256."""
    pieces, dropped = texts.vocab_json()
    big = texts.n_bytes >= BIG_DIGEST_BYTES           # (each file holds every token's bytes, or nearly)
    sums = {vocab_name: write_pieces(os.path.join(folder, vocab_name), itertools.chain(pieces, ("\n",)), durable,
                                      digest=True, big=big)}
    sums[merges_name] = write_pieces(os.path.join(folder, merges_name), texts.merges_txt(), durable,
                                      digest=True, big=big)
    return dropped, sums


def load_gpt2(vocab_path: str | os.PathLike, merges_path: str | os.PathLike,
              special_tokens: "list[str] | tuple[str, ...] | None" = None
              ) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Read GPT-2 ``vocab.json`` + ``merges.txt`` and check that they belong together.

    Errors (:class:`ModelFormatError`) name the file, and the line in ``merges.txt``:

    - ids must be distinct non-negative integers below ``len(vocab) + len(merges)``;
    - each merge's two parts must be single bytes or built by an earlier merge, and what it builds
      must be in ``vocab.json``;
    - every entry of ``vocab.json`` is a single byte, built by a merge, or an added token. An added
      token is one of ``special_tokens`` or a string that cannot be an encoded ordinary token:
      printable ASCII only (like ``<|endoftext|>``), or holding a character outside the byte
      alphabet. A token such as ``Ġthe`` that no merge builds means the files come from different
      runs (or ``merges.txt`` was cut short).

    >>> import json, os, tempfile; d = tempfile.mkdtemp(); b2u = bytes_to_unicode()
    >>> raw = {b2u[b]: b for b in range(256)}; raw.update({"Ġt": 256, "Ġth": 257, "<|endoftext|>": 258})
    >>> _ = open(os.path.join(d, "vocab.json"), "w", encoding="utf-8").write(json.dumps(raw))
    >>> _ = open(os.path.join(d, "merges.txt"), "w", encoding="utf-8").write("#version: 0.2\\nĠ t\\nĠt h\\n")
    >>> vocab, merges = load_gpt2(os.path.join(d, "vocab.json"), os.path.join(d, "merges.txt"))
    >>> len(vocab), merges, vocab[258]
    (259, [(b' ', b't'), (b' t', b'h')], b'<|endoftext|>')
    """
    vocab_path, merges_path = os.fspath(vocab_path), os.fspath(merges_path)
    raw = _read_json(vocab_path, "a GPT-2 vocab.json")
    if not isinstance(raw, dict):
        raise ModelFormatError(vocab_path, f"expected a JSON object of token -> id, got {_kind(raw)}")
    merges, lines = _read_merges(merges_path)
    limit = len(raw) + len(merges)
    vocab: dict[int, bytes] = {}
    keys: dict[int, str] = {}
    for tok, i in raw.items():
        if not (isinstance(i, int) and not isinstance(i, bool)):
            raise ModelFormatError(vocab_path, f"id of {_show(tok)} must be an integer, got {_kind(i)}")
        if not 0 <= i < limit:
            raise ModelFormatError(vocab_path, f"id {i} of {_show(tok)} is out of range (0..{limit - 1} for "
                                   f"{len(raw)} tokens and {len(merges)} merges in {merges_path})")
        if i in vocab:
            raise ModelFormatError(vocab_path, f"id {i} is given to both {_show(keys[i])} and {_show(tok)}")
        if not tok:
            raise ModelFormatError(vocab_path, f"id {i} has an empty token")
        try:
            vocab[i] = gpt2_to_token(tok)
        except KeyError:
            # Not in the byte alphabet: an added/special token stored verbatim (e.g. <|endoftext|>).
            try:
                vocab[i] = tok.encode("utf-8")
            except UnicodeEncodeError:
                raise ModelFormatError(vocab_path, f"token of id {i} is not valid Unicode (a lone surrogate)") from None
        keys[i] = tok
    present = set(vocab.values())
    known = {bytes([x]) for x in range(256)}
    missing = [x for x in range(256) if bytes([x]) not in present]
    if missing:
        raise ModelFormatError(vocab_path, f"lacks the single-byte tokens {[token_to_gpt2(bytes([x])) for x in missing[:8]]}")
    for (a, b), lineno in zip(merges, lines):
        for part in (a, b):
            if part not in known:
                raise ModelFormatError(merges_path, f"line {lineno}: {token_to_gpt2(part)!r} is neither a single "
                                       f"byte nor built by an earlier merge")
        if a + b not in present:
            raise ModelFormatError(merges_path, f"line {lineno}: builds {token_to_gpt2(a + b)!r}, which is not in "
                                   f"{vocab_path} (the two files do not belong together)")
        known.add(a + b)
    named = set(special_tokens or ())
    for i in sorted(vocab):
        if vocab[i] in known:
            continue
        tok = keys[i]
        alphabet = unicode_to_bytes()
        if tok in named or all(0x21 <= ord(c) <= 0x7E for c in tok) or any(c not in alphabet for c in tok):
            continue
        raise ModelFormatError(vocab_path, f"token {tok!r} (id {i}) is built by no merge in {merges_path}: the two "
                               f"files do not belong together (or merges.txt was cut short)")
    return vocab, merges


def _show(tok: Any) -> str:
    return repr(tok) if len(repr(tok)) <= 60 else repr(tok)[:57] + "..."


def _read_merges(path: str) -> tuple[list[tuple[bytes, bytes]], list[int]]:
    """The pairs of ``merges.txt`` and their line numbers; each bad line is one error naming it."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ModelFormatError(path, f"cannot read: {exc.strerror or exc}") from None
    except MemoryError:
        raise ModelFormatError(path, "too large to read") from None
    merges: list[tuple[bytes, bytes]] = []
    lines: list[int] = []
    table = unicode_to_bytes()
    for lineno, raw in enumerate(data.split(b"\n"), 1):
        try:
            line = raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as exc:
            raise ModelFormatError(path, f"line {lineno}: not UTF-8 (byte {raw[exc.start]:#04x})") from None
        if not line or (lineno == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise ModelFormatError(path, f"line {lineno}: expected two tokens separated by one space")
        try:
            merges.append((bytes(table[c] for c in parts[0]), bytes(table[c] for c in parts[1])))
        except KeyError:
            raise ModelFormatError(path, f"line {lineno}: character outside the GPT-2 byte alphabet") from None
        lines.append(lineno)
    return merges, lines


# ==== Any model folder =========================================================================


def load_any(path: str | os.PathLike) -> Model:
    """A native ``model.json`` (file or folder), or a folder with GPT-2 ``vocab.json`` + ``merges.txt``.

    GPT-2 files carry no pattern or special tokens: the GPT-2 pattern is assumed, and vocab entries
    that no merge builds and that are not single bytes (e.g. ``<|endoftext|>``) become special
    tokens. Both are checked on load (``load_model``, ``load_gpt2``); errors are
    one :class:`~bpe_core.errors.ModelFormatError` naming the file.
    """
    path = os.fspath(path)
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, MODEL_FILE)) \
            and os.path.exists(os.path.join(path, VOCAB_FILE)):
        vocab, merges = load_gpt2(os.path.join(path, VOCAB_FILE), os.path.join(path, MERGES_FILE))
        built = {a + b for a, b in merges}
        specials = [vocab[i].decode("utf-8") for i in sorted(vocab)
                    if vocab[i] not in built and len(vocab[i]) > 1]
        model = Model(vocab=vocab, merges=merges, special_tokens=specials, pattern=resolve_pattern("gpt2"))
        check_model(model, os.path.join(path, VOCAB_FILE))
        return model
    return load_model(path)
