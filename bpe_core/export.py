"""Export a trained model to the formats other tools load.

Every export is checked before it is published (:func:`export_checked`, ``formats.exactness``):
the files are loaded with the library users load them with and must give bpe_core's ids on the
user's text, else nothing is written (unless ``allow_inexact``).

- **HF** ``tokenizer.json``: a ByteLevel BPE model; the pre-tokenizer is ``Split`` with the model's
  regex as Oniguruma reads it with the same meaning (``formats.patterns_compat``; ``behavior: isolated``) followed by ``ByteLevel`` with ``use_regex: false`` (bytes to
  GPT-2 characters only); special tokens are added tokens (``special: true``, not normalized); a
  ByteLevel decoder. ``tokenizers.Tokenizer.from_file`` loads it.
- **tiktoken**: a ranks file (``base64(token) rank`` per line, what ``tiktoken.load.load_tiktoken_bpe``
  reads; rank = our token id) plus a sidecar ``<out>.json`` with the pattern and the special tokens
  (``load_tiktoken_encoding`` builds the ``tiktoken.Encoding``).
- **GPT-2** ``vocab.json`` + ``merges.txt`` (``formats.model.dump_gpt2``).

Every file is written atomically. Ids are never renumbered. Two caveats, both measured in
``tests/formats/test_export.py`` and explained in ``docs/formats.md``:

1. Token bytes held by two ids (two merges that build the same bytes) appear once, under the smaller
   id, in every export: the encoders of bpe_core, HF and tiktoken all emit the smaller id anyway.
2. tiktoken does not read merges: it merges any adjacent pair whose concatenation is a token, lowest
   id first. That equals merge-list BPE when every token reachable during encoding is built by its
   own merge; ``check_tiktoken_compatible`` finds the tokens where it is not (none in GPT-2 or in the
   vocabularies we trained for the tests, some in hand-made merge lists).
"""
from __future__ import annotations

import base64
import contextlib
import json
import os
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:
    from .formats.exactness import Exactness

from .encode.tokenizer import Tokenizer, model_encoder
from .formats import registry
from .formats.hf import hf_tokenizer_json, special_ids, unique_ids, usable_merges
from .formats.patterns_compat import PatternNotPortable, portable_pattern
from .formats.model import MERGES_FILE, VOCAB_FILE, Model, check_model, dump_gpt2
from .runtime.atomic import atomic_write, new_temp_dir

FORMATS = ("hf", "tiktoken", "gpt2")
HF_FILE = "tokenizer.json"
TIKTOKEN_FILE = "tokenizer.tiktoken"


# ==== HF tokenizers ==========================================================================


#: Export formats that run bpe_core's own encoder (``transformers``: a folder whose tokenizer class
#: calls the stage-aware encoder): exact for every method, so nothing to caveat.
EXACT_FORMATS = ("transformers",)


def export_caveats(model: Model, fmt: str) -> list[str]:
    """What a format cannot express about this model (printed on stderr by the export tool); the
    model's method says (``formats.registry``: ``Method.export_caveats``). None for the formats
    that reproduce bpe_core's ids exactly (:data:`EXACT_FORMATS`)."""
    if fmt in EXACT_FORMATS:
        return []
    return registry.get(model.method).export_caveats(model, fmt)


def duplicate_tokens(model: Model) -> list[tuple[bytes, list[int]]]:
    """Token bytes that two or more ids hold (ordinary tokens), each with its ids, by smallest id.

    >>> vocab = {**{i: bytes([i]) for i in range(256)}, 256: b"ab", 257: b"ab"}
    >>> duplicate_tokens(Model(vocab=vocab, merges=[(b"a", b"b"), (b"a", b"b")]))
    [(b'ab', [256, 257])]
    """
    specials = {s.encode("utf-8") for s in model.special_tokens}
    ids: dict[bytes, list[int]] = {}
    for i in sorted(model.vocab):
        b = model.vocab[i]
        if b in specials and i >= 256:
            continue
        ids.setdefault(b, []).append(i)
    return [(b, v) for b, v in ids.items() if len(v) > 1]


def check_exportable(model: Model, fmt: str, name: str | os.PathLike) -> None:
    """Refuse (``ValueError`` naming ``name``, one line) an export that would misrepresent the model:
    a format whose ids its method says differ from bpe_core's on most texts
    (``Method.export_refusal``: SupraTok's hf and tiktoken), or a tiktoken export of a model whose
    ids hold duplicate bytes (tiktoken needs ids 0..n-1, one per distinct token: the sidecar's
    ``explicit_n_vocab`` would not load)."""
    name = os.fspath(name)
    if fmt in EXACT_FORMATS:
        return
    reason = registry.get(model.method).export_refusal(model, fmt)
    if reason:
        raise ValueError(f"{name}: {reason}")
    if fmt == "tiktoken":
        dups = duplicate_tokens(model)
        if dups:
            b, ids = dups[0]
            raise ValueError(f"{name}: {len(dups)} token(s) are held by two ids (e.g. {b!r} at ids "
                             f"{', '.join(map(str, ids))}); tiktoken needs one id per distinct token, "
                             f"so no tiktoken export is written (hf and gpt2 keep the smaller id)")


def dump_hf(model: Model, path: str | os.PathLike) -> None:
    """Write HF ``tokenizer.json`` atomically, after HF ``tokenizers`` (when installed) has loaded
    the exact text once: a document it cannot load is never written (ValueError naming ``path``)."""
    _write_hf(model, path)


def _write_hf(model: Model, path: str | os.PathLike) -> None:
    try:
        text = json.dumps(hf_tokenizer_json(model), ensure_ascii=False) + "\n"
    except PatternNotPortable as exc:
        raise ValueError(f"{os.fspath(path)}: {exc}; nothing was written") from None
    try:
        import tokenizers
    except ImportError:
        tokenizers = None
    if tokenizers is not None:
        try:
            tokenizers.Tokenizer.from_str(text)
        except Exception as exc:  # noqa: BLE001  (any failure of the library means: not loadable)
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ValueError(f"{os.fspath(path)}: HF tokenizers cannot load the exported tokenizer.json "
                             f"({first}); nothing was written") from None
    with atomic_write(path, "w", encoding="utf-8") as f:
        f.write(text)


# ==== tiktoken ===============================================================================


def dump_tiktoken(model: Model, path: str | os.PathLike) -> str:
    """Write the ranks file (``base64 rank`` lines, rank = id) and its sidecar ``<path>.json``.

    The sidecar holds what ``tiktoken.Encoding`` needs besides the ranks::

        {"format": "bpe_core.tiktoken", "version": 1, "name": ..., "pat_str": ...,
         "special_tokens": {"<|endoftext|>": 256}, "explicit_n_vocab": ...}

    Returns the sidecar path.
    """
    path = os.fspath(path)
    check_exportable(model, "tiktoken", path)
    try:
        pat_str = portable_pattern(model.pattern or "gpt2", "fancy-regex")
    except PatternNotPortable as exc:
        raise ValueError(f"{path}: {exc}; nothing was written") from None
    ids = unique_ids(model)
    with atomic_write(path, "w", encoding="ascii") as f:
        for b, i in sorted(ids.items(), key=lambda kv: kv[1]):
            f.write(f"{base64.b64encode(b).decode('ascii')} {i}\n")
    specials = special_ids(model)
    meta = {
        "format": "bpe_core.tiktoken",
        "version": 1,
        "name": os.path.splitext(os.path.basename(path))[0],
        "pat_str": pat_str,
        "special_tokens": specials,
        "explicit_n_vocab": len(ids) + len(specials),
    }
    sidecar = path + ".json"
    with atomic_write(sidecar, "w", encoding="utf-8") as f:
        json.dump(meta, f, ensure_ascii=False, indent=1)
        f.write("\n")
    return sidecar


def load_tiktoken_encoding(path: str | os.PathLike):
    """Build a ``tiktoken.Encoding`` from a ranks file written by ``dump_tiktoken`` and its sidecar.

    Needs ``tiktoken`` (an optional dependency).
    """
    import tiktoken
    import tiktoken.load

    path = os.fspath(path)
    with open(path + ".json", encoding="utf-8") as f:
        meta = json.load(f)
    ranks = tiktoken.load.load_tiktoken_bpe(path)
    return tiktoken.Encoding(meta["name"], pat_str=meta["pat_str"], mergeable_ranks=ranks,
                             special_tokens=meta["special_tokens"])


def check_tiktoken_compatible(model: Model, limit: int = 20) -> list[tuple[bytes, list[bytes]]]:
    """Witnesses that tiktoken's rank-by-bytes rule differs from the merge list: ``(token, parts)``.

    tiktoken never reads merges: it merges adjacent tokens ``x, y`` whenever ``x + y`` is a token,
    lowest id first, until no adjacent concatenation is a token. Merge-list BPE stops when no
    adjacent pair is a *merge*. So whenever merge-list BPE leaves two adjacent tokens whose
    concatenation is a token, tiktoken gives a different result. We test every token's own bytes as
    one pretoken: each token whose merge-list encoding keeps such a pair is returned with that
    encoding. An empty list is strong evidence of agreement, not a proof for every text
    (``tests/formats/test_export.py`` also compares the encoders on text).

    >>> vocab = {i: bytes([i]) for i in range(256)}
    >>> merges = [(b"b", b"c"), (b"a", b"b"), (b"ab", b"c")]
    >>> for a, b in merges: vocab[len(vocab)] = a + b
    >>> check_tiktoken_compatible(Model(vocab=vocab, merges=merges))
    [(b'abc', [b'a', b'bc'])]
    """
    ids = unique_ids(model)
    tok = Tokenizer({i: b for b, i in ids.items()}, usable_merges(model, ids), pattern=r"(?s).+")
    enc = tok._encoder()
    found = []
    for t in sorted(ids, key=lambda b: ids[b]):
        if len(t) < 2:
            continue
        parts = [tok.decode_bytes([i]) for i in enc.encode_piece(t)]
        if any(x + y in ids for x, y in zip(parts, parts[1:])):
            found.append((t, parts))
            if len(found) >= limit:
                break
    return found


# ==== GPT-2 files ============================================================================


def dump_gpt2_files(model: Model, folder: str | os.PathLike) -> list[bytes]:
    """Write ``vocab.json`` + ``merges.txt`` into ``folder`` (see ``formats.model.dump_gpt2``)."""
    os.makedirs(folder, exist_ok=True)
    return dump_gpt2(model.vocab, model.merges, folder)


def export_checked(model: Model, fmt: str, out: str | os.PathLike, docs: Sequence[bytes] | None = None,
                   on: str = "", allow_inexact: bool = False,
                   hint: str | None = None,
                   write_transformers: "Callable[[Model, str], object] | None" = None) -> tuple[list[str], "Exactness"]:
    """Write ``model`` in format ``fmt`` (``hf``, ``tiktoken``, ``gpt2``, ``transformers``) only if
    the library a user loads it with gives bpe_core's ids on ``docs`` (``on``: what they are, for
    messages; default: ``formats.exactness.builtin_documents``). Returns the paths written and the
    check's result.

    The files are written into a temp folder beside ``out``, loaded from there and checked
    (``formats.exactness.check_export_files``), then published as one unit
    (``runtime.atomic.publish_files``). Any differing document raises
    :class:`~bpe_core.formats.exactness.InexactExport` (one line: the count, a differing document's
    start, ``hint``: by default :func:`inexact_hint`) and writes nothing -- unless ``allow_inexact``:
    then the files are published and the result says the rate. Without the loading library installed nothing can be checked:
    the export is refused unless ``allow_inexact`` (then written unchecked, said in the result).
    ``write_transformers``: ``transformers_tokenizer.export_transformers`` for the ``transformers``
    format (a module beside this one, which needs ``transformers``).
    """
    import shutil

    from .formats.exactness import Exactness, InexactExport, builtin_documents, check_export_files
    from .runtime.atomic import publish_files

    out = os.fspath(out)
    if fmt not in FORMATS + ("transformers",):
        raise ValueError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS + ('transformers',))})")
    check_model(model)
    check_exportable(model, fmt, out)
    if hint is None:
        hint = inexact_hint(model, fmt)
    if docs is None:
        docs, on = builtin_documents(), "bpe_core's built-in check text"
    if fmt in ("hf", "tiktoken"):
        final_dir, base = (out, HF_FILE if fmt == "hf" else TIKTOKEN_FILE) if os.path.isdir(out) else \
            (os.path.dirname(os.path.abspath(out)), os.path.basename(out))
    else:
        final_dir, base = out, None
    made = [] if os.path.isdir(final_dir) else [final_dir]     # removed again when nothing is written
    os.makedirs(final_dir, exist_ok=True)
    tmp = new_temp_dir(final_dir, f".export.tmp-{os.getpid()}-")
    published = False
    try:
        try:
            if fmt == "hf":
                _write_hf(model, os.path.join(tmp, base))
            elif fmt == "tiktoken":
                dump_tiktoken(model, os.path.join(tmp, base))
            elif fmt == "gpt2":
                dump_gpt2_files(model, tmp)
            else:
                if write_transformers is None:
                    raise ValueError("the transformers format needs its writer "
                                     "(transformers_tokenizer.export_transformers)")
                write_transformers(model, tmp)
        except ValueError as exc:           # name the user's path, not the temp folder
            if type(exc) is not ValueError:
                raise
            raise ValueError(str(exc).replace(os.path.join(tmp, base or ""), out).replace(tmp, final_dir)) from None
        try:
            result = check_export_files(model_encoder(model), fmt, tmp, docs, on)
        except ImportError as exc:
            result = Exactness(fmt, on, 0, 0, notes=[f"not checked: {exc.name or exc} is not installed"])
            if not allow_inexact:
                raise InexactExport(f"{out}: the {fmt} export cannot be checked ({exc.name or exc} is not "
                                    f"installed); nothing was written (--allow-inexact writes it unchecked)") from None
        if not result.exact and not allow_inexact:
            raise InexactExport(f"{out}: {result.line()}; nothing was written"
                                + (f" ({hint})" if hint else "") + " (--allow-inexact writes it anyway, with this rate)")
        names = sorted(os.listdir(tmp))
        if base is not None:     # the sidecar last: it marks the set complete
            names.sort(key=lambda n: n != base)
        pairs = [(os.path.join(tmp, n), os.path.join(final_dir, n)) for n in names]
        publish_files(pairs)
        published = True
        return [p for _, p in pairs], result
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if not published and made:
            with contextlib.suppress(OSError):
                os.rmdir(made[0])


def inexact_hint(model: Model, fmt: str) -> str:
    """What to use instead of an inexact ``fmt`` export of ``model`` (for the refusal's line).

    >>> inexact_hint(Model(vocab={}, merges=[], method="superbpe"), "tiktoken")
    "a superbpe model's exact formats are its folder (model.json: Tokenizer.load) and --format transformers (AutoTokenizer with trust_remote_code)"
    """
    method = registry.get(model.method)
    if method.stage_aware:
        return (f"a {method.name} model's exact formats are its folder (model.json: Tokenizer.load) and "
                f"--format transformers (AutoTokenizer with trust_remote_code)")
    if fmt == "gpt2":
        return ("vocab.json + merges.txt carry no pattern, so loaders split with GPT-2's; --format hf "
                "carries the model's own")
    return "--format transformers runs bpe_core's own encoder"


def export(model: Model, fmt: str, out: str | os.PathLike, docs: Sequence[bytes] | None = None,
           allow_inexact: bool = False) -> list[str]:
    """Write ``model`` in format ``fmt`` (``hf``, ``tiktoken``, ``gpt2``, ``transformers``); returns
    the paths written.

    The model is checked first (``formats.model.check_model``: known method, stages, ids in range, the
    merge chain); a bad one raises :class:`~bpe_core.errors.ModelFormatError` and writes nothing. An
    export that would misrepresent it (:func:`check_exportable`: SupraTok's hf and tiktoken, tiktoken
    with duplicate token bytes) raises ``ValueError`` and writes nothing. Then the written files are
    loaded with the library users load them with and must give bpe_core's ids on ``docs`` (default:
    ``formats.exactness.builtin_documents``; :func:`export_checked`), else
    :class:`~bpe_core.formats.exactness.InexactExport` and nothing written, unless ``allow_inexact``.

    ``out`` is the file for ``hf`` and ``tiktoken`` (a folder gets the default file name) and the
    folder for ``gpt2`` and ``transformers``.
    """
    on = "" if docs is None else "the documents given"
    return export_checked(model, fmt, out, docs, on, allow_inexact)[0]
