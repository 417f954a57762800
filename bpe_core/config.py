"""``TrainConfig``: the single source of training options and their defaults.

The CLI (``tools/train_bpe.py``) builds its flags from these fields, and ``train_bpe(**options)``
accepts the same names.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any, Optional

from .corpus.specials import DEFAULT_SPECIAL_TOKEN
from .formats import registry
from .pretok.patterns import pattern_name, resolve_pattern
from .runtime.budget import parse_size
from .runtime.executors import check_cluster_spec, cluster_timeout
from .runtime.progress import check_mode



@dataclass(frozen=True)
class TrainConfig:
    """Options of a training run.

    Attributes:
        input_path: the corpus: a path (a text file, read as bytes; or compressed, JSON Lines,
            Parquet, a directory, a glob pattern, ``-`` for stdin), a list of them, an iterator of
            ``str``/``bytes`` or a ``datasets`` object (``corpus.inputs.expand_inputs``).
        input_format: ``auto`` (default: Parquet by magic bytes, JSON Lines by a ``.jsonl``/``.json``
            name, else text), ``text``, ``jsonl`` or ``parquet``.
        text_field: the JSON Lines field holding the text (a dotted path reaches nested objects).
        text_column: the Parquet or ``datasets`` column holding the text.
        skip_bad_records: count and skip bad records (invalid JSON, a missing field, a truncated
            stream...) instead of stopping at the first one.
        vocab_size: target vocabulary size: 256 bytes + special tokens + merges.
        special_tokens: split out before pre-tokenization; never merged. Ids 256, 257, ...
        pattern: a name, any case: ``gpt2`` (aliases ``r50k``, ``r50k_base``, ``p50k``,
            ``p50k_base``), ``cl100k`` (``cl100k_base``), ``o200k`` (``o200k_base``), stored as its
            canonical name; or a custom regex, which must contain a regex metacharacter (a string
            without one is read as a name, so a misspelt name is a ValueError listing the names)
            and compile. Text a custom regex does not match becomes pretokens of its own.
        num_workers: pre-tokenization processes (None: one per CPU core).
        chunk_bytes: target chunk size for pre-tokenization (None: chosen from the input size).
        memory_limit: RAM budget for the whole process tree, in bytes or as a size string such as
            ``"8G"`` (None: 8 GiB, or less when less RAM is available).
        min_pretoken_count: drop pretokens seen fewer times before the merge loop. 1 (default)
            keeps all; a larger value CHANGES THE RESULT (rare words no longer count) and saves
            memory in the merge phase.
        spill_dir: where sorted runs of the pretoken table go when it outgrows the budget
            (default: the system temp folder).
        method: a registered method (``formats.registry.names()``): ``"bpe"``, ``"superbpe"`` (two-stage
            curriculum, ``bpe_core/methods/superbpe/``) or ``"supratok"``.
        transition: SuperBPE's transition point: a vocabulary size (int) or a fraction of
            ``vocab_size`` (float in (0, 1]); default 0.4, the paper's most compression-efficient
            ratio (its downstream-best was 0.9).
        stage2_split: ``"hf"`` (default: units between document edges, numbers and the inside of
            whitespace runs, a split HF's ``tokenizer.json`` expresses), ``"units"`` (the previous
            default, ``"default"`` in older files: numbers cut into digit groups between stage-1
            tokens) or ``"official"`` (the official implementation's stage-2 pre-tokenizer).
        max_words, forbidden, max_token_bytes, max_nonalnum, max_digits: SuperBPE stage-2 rules: at
            most ``max_words`` words per token (default 4), no forbidden substring (default
            ``": "``), no run of more than ``max_digits`` digits (default 3; None: no cap), and
            optional guardrails: a byte cap and a cap on characters that are neither alphanumeric
            nor whitespace (keeps table rules and URL prefixes out of the vocabulary).
            ``max_token_bytes`` also applies to plain BPE (``method="bpe"``): a pair whose token
            would be longer never merges (None, the default: any length).
        stage2_duplicates: let stage 2 merge a pair whose bytes are already a token (it then
            spends an id on bytes another id has). Default False: such pairs are never merged, so
            the V ids of a SuperBPE model are V different strings.
        stage2_skip_encoded: the units of stage-2 regions that look like encoded binary
            (uuencode: little whitespace, much ASCII punctuation, digits; ``reference.looks_encoded``
            on the region, docs/superbpe.md) count for nothing in stage 2 (default True), so the
            vocabulary holds no such junk. SupraTok's pass 2 follows the same rule (a unit counts
            for nothing when most of its bytes lie in such regions; docs/supratok.md). Stage 1,
            SupraTok's pass 1 and plain BPE are unaffected.
        progress: progress on stderr: ``False``/``"none"`` (default), ``True``/``"auto"`` (a tqdm bar
            on a terminal, else a plain line every 10 s or 10 %), ``"bar"``, ``"plain"`` or
            ``"json"`` (JSON lines); see ``bpe_core.progress``.
        seed_pmi, seed_min_count, seed_max_n: SupraTok pass-2 seed mining: word n-grams of 2 to
            ``seed_max_n`` words with PMI >= ``seed_pmi`` (bits) and count >= ``seed_min_count``
            (paper: 2.0, 100, 6). ``transition`` is SupraTok's pass-1 size.
        pass2_cross: which cross-pretoken merges SupraTok's pass 2 may make (all must pass the
            stage-2 rules): ``"all"`` (default: any, as SuperBPE's stage 2), ``"words"`` (only
            across word-word boundaries), ``"seeds"`` (inside a PMI seed phrase, the paper) or
            ``"none"``. The default is the best of the grid in ``docs/supratok.md``.
        span_pmi, span_min_count, span_max_n, span_max_candidates: SupraTok pass-3 screening of
            candidate spans (paper's production values: PMI 5.0, count 5, 5 words) and a cap on
            candidates scored per length.
        heldout_fraction: share of training documents (by hash) held out for pass-3 gains (only
            when pass 3 runs; else every document trains passes 1 and 2).
        supratok_rounds: pass-3 rounds of leaf surgery (each from the current vocabulary); default
            0, no pass 3 (the paper: 2; it costs compression after ``pass2_cross="all"``,
            ``docs/supratok.md``).
        script_aware: SupraTok's script-aware processing (bigram gate for Chinese/Japanese/Thai,
            Turkish/Finnish suffix gate, Arabic hamza normalization of statistics).
        script_bigram_min: character-bigram evidence needed by the spaceless-script gate.
        entropy_filter, entropy_seed: curate the input by character-bigram entropy before training
            (``bpe_core/curate.py``; any method).
        cluster: where the data-parallel phases (counting pretokens, SuperBPE's stage-2 units) run:
            None (default: this machine's threads), ``"local:N"`` (a Dask ``LocalCluster`` of N
            worker processes), a Dask scheduler address (``"tcp://host:8786"``), ``"env"``
            (``DASK_SCHEDULER_ADDRESS``), a ``distributed.Client`` or a ``runtime.executors``
            executor. The merges are the same wherever it runs (``docs/cluster.md``). With a
            cluster (or an fsspec URL as ``input_path``: ``s3://``, ``gs://``, ``hf://``, ...) the
            workers read their own shards of the input.
        cluster_timeout: seconds a cluster run waits for a worker when none is connected (at the
            start, or after losing every worker), and the base of how long it may go without a task
            finishing; past it the run stops with ``ClusterError`` (default: 30,
            ``runtime.executors.CLUSTER_TIMEOUT``; ``docs/cluster.md``, "When the cluster fails").
        tie_break: which pair wins among pairs of equal count: ``"bytes"`` (default, CS336: the
            greatest ``(left_bytes, right_bytes)``) or ``"hf"`` (HF ``tokenizers``' BpeTrainer: the
            smallest pair of ids in HF's order, so the merges are HF's on the same pre-tokenization
            and special tokens; ``docs/semantics.md``). Plain BPE (``method="bpe"``) only.
        init_from: start from an existing BPE model (a folder with ``model.json``, a ``model.json``,
            or a folder with GPT-2 ``vocab.json`` + ``merges.txt``): ``bpe`` continues its merges up
            to ``vocab_size``, ``superbpe`` runs stage 2 on top of it (the transition is its size).
            Its special tokens and pattern must be this run's and its vocabulary smaller than
            ``vocab_size`` (``methods/init_from.py``; ``docs/superbpe.md``, "Extending a tokenizer").
    """

    input_path: Any
    vocab_size: int
    special_tokens: tuple[str, ...] = (DEFAULT_SPECIAL_TOKEN,)
    pattern: str = "gpt2"
    num_workers: Optional[int] = None
    chunk_bytes: Optional[int] = None
    memory_limit: Optional[int] = None
    min_pretoken_count: int = 1
    spill_dir: Optional[str] = None
    method: str = "bpe"
    transition: Optional[float] = None
    stage2_split: str = "hf"
    max_words: int = 4
    forbidden: tuple[str, ...] = (": ",)
    max_token_bytes: Optional[int] = None
    max_nonalnum: Optional[int] = None
    max_digits: Optional[int] = 3
    stage2_duplicates: bool = False
    stage2_skip_encoded: bool = True
    progress: bool | str = False
    seed_pmi: float = 2.0
    seed_min_count: int = 100
    seed_max_n: int = 6
    pass2_cross: str = "all"
    span_pmi: float = 5.0
    span_min_count: int = 5
    span_max_n: int = 5
    span_max_candidates: int = 4000
    heldout_fraction: float = 0.05
    supratok_rounds: int = 0
    script_aware: bool = True
    script_bigram_min: int = 50
    entropy_filter: bool = False
    entropy_seed: int = 0
    input_format: str = "auto"
    text_field: str = "text"
    text_column: str = "text"
    skip_bad_records: bool = False
    cluster: Any = None
    cluster_timeout: Optional[float] = None
    init_from: Optional[str] = None
    tie_break: str = "bytes"

    def __post_init__(self):
        if isinstance(self.input_path, (str, os.PathLike)):
            object.__setattr__(self, "input_path", os.fspath(self.input_path))
        elif isinstance(self.input_path, (list, tuple)):
            object.__setattr__(self, "input_path", tuple(p if not isinstance(p, os.PathLike) else os.fspath(p)
                                                         for p in self.input_path))
        if self.input_format not in ("auto", "text", "jsonl", "parquet"):
            raise ValueError(f"unknown input_format {self.input_format!r} (auto, text, jsonl, parquet)")
        object.__setattr__(self, "special_tokens", tuple(self.special_tokens))
        if not isinstance(self.vocab_size, int) or isinstance(self.vocab_size, bool):
            raise ValueError("vocab_size must be an integer")
        for tok in self.special_tokens:
            if not isinstance(tok, (str, bytes)) or len(tok) == 0:
                raise ValueError("special tokens must be non-empty strings")
        if self.vocab_size < 256 + len(self.special_tokens):
            raise ValueError(
                f"vocab_size {self.vocab_size} is below 256 + {len(self.special_tokens)} special token(s)"
                f" = {256 + len(self.special_tokens)}")
        resolve_pattern(self.pattern)        # ValueError: an unknown name (listing them) or a bad regex
        if pattern_name(self.pattern) is not None and pattern_name(self.pattern) != self.pattern:
            object.__setattr__(self, "pattern", pattern_name(self.pattern))   # "CL100K_BASE" -> "cl100k"
        if self.num_workers is not None and self.num_workers < 1:
            raise ValueError("num_workers must be >= 1")
        if self.memory_limit is not None:
            object.__setattr__(self, "memory_limit", parse_size(self.memory_limit))
            if self.memory_limit < 1:
                raise ValueError("memory_limit must be positive")
        if self.min_pretoken_count < 1:
            raise ValueError("min_pretoken_count must be >= 1")
        if self.stage2_split not in ("hf", "units", "default", "official"):
            raise ValueError(f"unknown stage2_split {self.stage2_split!r} (hf, units, official)")
        if self.stage2_split == "default":          # its name before "hf" became the default
            object.__setattr__(self, "stage2_split", "units")
        if self.tie_break not in ("bytes", "hf"):
            raise ValueError(f"unknown tie_break {self.tie_break!r} (bytes, hf)")
        if self.max_digits is not None and self.max_digits < 1:
            raise ValueError("max_digits must be >= 1")
        object.__setattr__(self, "forbidden", tuple(self.forbidden))
        if self.init_from is not None:
            object.__setattr__(self, "init_from", os.fspath(self.init_from))
            if not registry.get(self.method).supports_init:
                raise ValueError(f"init_from: method {self.method!r} cannot start from an existing model "
                                 f"(bpe and superbpe can)")
        registry.get(self.method).check_config(self)    # ValueError: an unknown method, bad options
        check_mode(self.progress)
        if self.max_words < 1:
            raise ValueError("max_words must be >= 1")
        if self.chunk_bytes is not None and self.chunk_bytes < 1:
            raise ValueError("chunk_bytes must be >= 1")
        check_cluster_spec(self.cluster)
        if self.cluster_timeout is not None:
            object.__setattr__(self, "cluster_timeout", cluster_timeout(self.cluster_timeout))

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
