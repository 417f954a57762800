"""SuperBPE (Liu et al., COLM 2025): a two-stage curriculum on the same merge engine.

Stage 1 is standard BPE until the vocabulary reaches the *transition* size ``t``. Stage 2 continues
from the stage-1 segmentation with whitespace boundaries lifted: its words are **units**, runs of
consecutive pretokens of one text piece, each already split into its stage-1 tokens. Units are cut
only at hard boundaries, by ``stage2_split``:

- ``"hf"`` (the default): the edges of text pieces (document edges, special tokens); a pretoken
  holding a digit (``\\p{N}``) is a unit of its own; two pretokens that meet inside a run of
  whitespace are cut apart. Every cut is a place in the text that one regex finds
  (:func:`hf_split_regex`, the HF export's ``Split``), and inside a unit no stage-1 merge can cross a
  pretoken boundary, so HF's one-list BPE gives the stage-aware ids on almost every document.
- ``"units"`` (the previous default; ``"default"`` in older model files): document edges; a numeric
  pretoken is a unit of its own, cut further where its stage-1 tokens meet at a digit/non-digit
  change or between groups of three digits counted from the right (``numeric_cuts``).

A stage-2 merge must pass the rules (:class:`Stage2Rules`): at most ``max_words`` words
(``len(token.split())``), no forbidden substring (``": "``), no run of more than ``max_digits``
digits (3: the paper's groups of three), not the bytes of an existing token (``distinct``: so V ids
are V different strings), and the optional guardrails ``max_token_bytes`` and ``max_nonalnum``
(characters that are neither alphanumeric nor whitespace).

``stage2_split="official"`` reproduces the stage-2 pre-tokenizer of the official implementation for
parity: inside each line, the pieces ``\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]{2,}[\\r\\n/]*| +(?!\\S)`` are
isolated and the gaps between them are the units; each unit is pre-tokenized and stage-1 merged on its
own.

The encoder is stage-aware (:class:`StageAwareEncoder`): stage-1 merges inside pretokens, then stage-2
merges inside units, which reproduces training exactly (the token count of the training corpus equals
the count training ended with). ``reference.train_superbpe_from_bytes`` is the plain twin.

Scale: units are listed in text order, each word as its stage-1 tokens (``_units.chunk_unit_stream``);
stage 2 cuts them where no merge it makes can cross and deduplicates the pieces (:func:`stage2_merges`).
When the stage-2 table still would not fit the budget, stage 2 trains on a deterministic sample of
units (kept by a hash of their content, so the sample does not depend on worker count); the run report
says how much text it saw.

The package, by job (each module imports only those above it):

- ``rules``: the stage-2 merge rules, the transition size, the names of the splits.
- ``words``: per word of the table, digits, whitespace edges and byte classes; encoded-looking units.
- ``units``: the stage-2 units of a corpus (a scan, shards on an executor, or the counting record).
- ``official``: the official implementation's stage-2 split (a parity mode).
- ``stage2``: stage 2's merges on pieces of the units; its budget share and sample.
- ``train``: :func:`train_superbpe`, stage 1 then stage 2, and the run report.
- ``export``: the stage-2 split as one regex for the HF export.
- ``encoder``: :class:`StageAwareEncoder`.
- ``method``: the registry's ``SuperBPE`` method (registered on import) and the model-file marks.

This ``__init__`` re-exports the names other modules and the tests use
(``from bpe_core.methods.superbpe import stage2_merges``; those of ``export`` and ``encoder`` when first
asked for, as training needs neither); a test that replaces a name the code looks up patches the
module that uses it (``superbpe.stage2``, ``superbpe.train``).
"""
from .rules import (DEFAULT_TRANSITION, SPLITS, Stage2Rules, model_split, normal_split,  # noqa: F401
                    resolve_transition, valid_rules)
from .words import (ASCII_SPACE, ENCODED_MAX_SPACE_RATIO, ENCODED_MIN_ALNUM_RATIO, ENCODED_MIN_CHARS,  # noqa: F401
                    ENCODED_MIN_DIGIT_RATIO, ENCODED_MIN_PUNCT_RATIO, ENDS_SPACE, NUMERIC, STARTS_SPACE,
                    encoded_units, looks_encoded_counts, numeric_cuts, numeric_mask, word_classes,
                    word_classes_python, word_flags, word_flags_python)
from .units import (UnitsContext, combine_units, count_units, count_units_on, count_units_sharded,  # noqa: F401
                    has_url, record_table_rows, record_word_maps, slice_segments, stage2_table, units_from_records,
                    units_shard,
                    units_source_shard)
from .official import (OFFICIAL_STAGE2_PATTERN, official_unit_texts, official_units, stage1_ids,  # noqa: F401
                       stage1_merger)
from .stage2 import (FRACTION_STEPS, MAP_THRESHOLD, OVERHEAD_STEP, STAGE2_BYTES_PER_SYMBOL,  # noqa: F401
                     STAGE2_CUT_RANK, STAGE2_CUT_SAMPLE_RANKS, STAGE2_MAP_THRESHOLD, STAGE2_WINDOWS_PER_COUNTER,
                     Stage2Result, cut_sample_bits, first_cut, rows_before_stage1, sample_fraction, sketch_bits,
                     stage2_budget_share, stage2_huge_pages, stage2_merges, unit_weights)
from .train import train_superbpe  # noqa: F401
from .method import SuperBPE, check_stage_marks  # noqa: F401  (registers the method)

#: names of ``export`` and ``encoder``, imported when first asked for: training never needs them, and
#: the encoder brings the whole tokenizer package (``bpe_core.encode``, its native module, the model
#: files' formats: ~20 ms of a SuperBPE run's CPU that plain BPE does not spend)
_LAZY = {"HF_SPLIT_CL100K": "export", "HF_SPLIT_GPT2": "export", "HF_SPLIT_UNITS_GPT2": "export",
         "hf_split_regex": "export", "StageAwareEncoder": "encoder"}


def __getattr__(name: str):
    """The names of ``_LAZY``: their module imported on first use (``from bpe_core.methods.superbpe
    import StageAwareEncoder`` works as before)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
