"""Training: the pipeline from a corpus to a model, and the public ``train`` / ``train_bpe``.

``train`` is five stages, each a function taking the value the one before returned (each timed
in the run report and marked for the memory profile):

1. ``prepare_inputs`` -> :class:`Inputs`: find the inputs (``corpus``); when the method or the
   entropy filter reads the corpus again and it is not one local plain file, spool it into one;
   curate it when ``entropy_filter`` asks (``methods.curate``).
2. ``start`` -> :class:`Run`: check the pattern and ``--init-from``; the RAM budget becomes
   workers, chunk size and a spill threshold (``runtime.budget.plan_training``).
3. ``count`` -> :class:`Counts`: worker threads (or a cluster) count the pretokens of each chunk;
   the tables are summed into one sorted ``WordTable`` (``pretok.counting``), totals checked.
4. ``plan_merges`` -> :class:`MergePlan`: the plan is made again with the real number of unique
   pretokens (``Plan.with_count``): the merge phase fits, or the run stops naming the budget that does.
5. ``learn`` -> ``MethodResult``, then ``finish`` -> :class:`TrainResult`: the method the config
   names (``formats.registry``: BPE, SuperBPE, SupraTok...) learns vocab, merges and stages; the
   model and the report are assembled.

No stage asks which method it runs: what differs between methods is a member of
``formats.registry.Method`` (``reads_input_again``, ``drops_single_byte_words``,
``records_pretokens``/``uses_record``, ``train``).

Results do not depend on the number of workers or the chunk size: chunks are cut only where the cut
provably leaves pre-tokenization unchanged, counts are summed, and the engine breaks ties by bytes,
never by order of arrival.
"""
from __future__ import annotations

import array
import contextlib
import dataclasses
import os
import resource
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Optional, Sequence

from . import methods  # noqa: F401  (registers the methods)
from .config import TrainConfig
from .corpus import encode_specials
from .corpus.readers import BadRecords
from .corpus.inputs import Source, expand_inputs
from .corpus.ranges import is_url
from .corpus.shards import ReadOptions, spool
from .errors import BinaryInputWarning, BudgetError
from .formats import registry
from .formats.model import Model
from .pretok.counting import check_distributable, count_corpus, count_sources_on
from .pretok.patterns import resolve_pattern
from .pretok.sample import SAMPLE_PIECES, sample_words
from .pretok.wordtable import WordTable
from .runtime import budget
from .runtime.atomic import naming, new_temp_dir
from .runtime.executors import open_executor
from .runtime.lazy import np  # numpy on first use (a small run never imports it)
from .runtime.memmon import MemoryMonitor, phase, tree_memory
from .runtime.workers import release_free_memory

__all__ = ["TrainResult", "plan", "train", "train_bpe", "train_from_iterator"]


@dataclass
class TrainResult:
    """What a run produced: the model and a report of the run."""

    model: Model
    report: dict[str, Any] = field(default_factory=dict)

    @property
    def vocab(self) -> dict[int, bytes]:
        return self.model.vocab

    @property
    def merges(self) -> list[tuple[bytes, bytes]]:
        return self.model.merges

    def save(self, folder: str | os.PathLike) -> str:
        """Write the folder ``tools/train_bpe.py --out`` writes (``formats.folder.save_folder``:
        ``vocab.json`` + ``merges.txt``, ``model.json``, HF's ``tokenizer.json`` +
        ``tokenizer_config.json`` for plain BPE, and ``train_report.json``), published as one unit,
        parent folders made. ``bpe_core.load(folder)``, ``Tokenizer.load(folder)`` and, for plain
        BPE, ``transformers.AutoTokenizer.from_pretrained(folder)`` read it back; returns the folder.
        """
        self.publish(folder)
        return os.fspath(folder)

    def publish(self, folder: str | os.PathLike, hf_check: Any = None) -> list[bytes]:
        """:meth:`save`, with the writing inside the memory monitor: the report's peaks
        (``memory``: ``peak_anon_bytes``, ``peak_anon_by_phase["write"]``, ...) then cover the whole run,
        writing included (``train_report.json`` is written last, with them), and a writing peak
        above the budget warns as the merge phase's does. Returns the token bytes ``vocab.json``
        left out (``formats.folder.save_folder``). ``hf_check``: the check of HF's files
        (``formats.exactness.hf_folder_check``; default: on the built-in check text)."""
        from .encode.tokenizer import model_encoder
        from .formats.exactness import hf_folder_check
        from .formats.folder import save_folder

        if hf_check is None:         # HF's files only when HF tokenizers gives these ids
            hf_check = hf_folder_check(model_encoder(self.model))

        memory = self.report.get("memory") or {}
        with MemoryMonitor(interval=0.05, budget=memory.get("budget_bytes")) as monitor:
            phase("write")

            def final_report() -> dict[str, Any]:
                monitor.sample()         # the model files are written: one sample now, however short the writing
                _add_peaks(memory, monitor.summary())
                self.report["memory"] = memory
                return self.report
            dropped = save_folder(self.model, folder, final_report, hf_check=hf_check)
            monitor.sample()
        before = memory.get("budget_exceeded")
        _add_peaks(memory, monitor.summary())
        if not before:
            budget.warn_exceeded(memory, "training")       # the writing went above the budget
        return dropped


def _add_peaks(memory: dict, later: dict) -> None:
    """Fold a later monitor's ``summary()`` (the writing) into a run's ``memory`` report."""
    for key in ("peak_anon_bytes", "peak_file_bytes", "peak_rss_bytes"):
        memory[key] = max(int(memory.get(key) or 0), int(later.get(key) or 0))
    for key in ("peak_anon_by_phase", "peak_file_by_phase", "peak_by_phase"):
        phases = memory.setdefault(key, {})
        for name, value in (later.get(key) or {}).items():
            phases[name] = max(int(phases.get(name, 0)), int(value))
    limit = memory.get("budget_bytes")
    if limit:
        excess = max(0, int(memory["peak_anon_bytes"]) - int(limit))
        memory["budget_exceeded"], memory["budget_excess_bytes"] = excess > 0, excess


def peak_rss_bytes() -> dict[str, int]:
    """Peak resident memory of this process (``getrusage``; Linux reports KiB).

    No figure for children: ``RUSAGE_CHILDREN`` is the largest child ever waited for, including
    processes from before this run (a pip build, an earlier run in the same interpreter). The
    workers of this run are in the sampled peak of the process tree (``tree_sampled``).
    """
    scale = 1 if sys.platform == "darwin" else 1024
    return {"self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale}


#: The input size the plan assumes for a source of unknown size (stdin, an iterator).
UNKNOWN_INPUT_BYTES = 1 << 30


def sources_of(config: TrainConfig) -> list[Source]:
    """The inputs of a run (``corpus.inputs.expand_inputs``; checked, nothing read yet)."""
    return expand_inputs(config.input_path, config.input_format, config.text_column)


def _input_bytes(sources: list[Source]) -> int:
    size = sum(s.estimated_bytes for s in sources)
    if any(s.kind == "iterator" or s.is_stdin for s in sources):
        size += UNKNOWN_INPUT_BYTES
    return size


def plan(config: TrainConfig, sources: list[Source] | None = None) -> budget.Plan:
    """The memory plan of a run (workers, chunk size, spilling) before any work.

    Raises:
        errors.BudgetError: the run cannot fit ``config.memory_limit``.
    """
    size = _input_bytes(sources if sources is not None else sources_of(config))
    # Workers are threads running nogil kernels: more of them than cores only adds memory, so a
    # larger --workers is capped at the cores (the plan's notes say so).
    return budget.plan_training(size, config.memory_limit, os.cpu_count() or 1, None,
                                num_workers=config.num_workers, chunk_bytes=config.chunk_bytes,
                                vocab_size=config.vocab_size)


#: A local file at least this large is sampled before counting (``pretok.sample``) when the merge
#: phase might not fit its budget (a smaller one is counted in seconds: the check after counting
#: decides).
SAMPLE_MIN_BYTES = 256 << 20
#: ... the run is refused before counting when even this share of the sample's estimate of unique
#: pretokens does not fit (the estimate runs high on corpora whose new words thin out: 1.4x on the
#: 2 GB prefix of the growing-vocabulary corpus); the budget named is the whole estimate's.
SAMPLE_TRUST = 0.85
#: ... and sampled only when Heaps' law's estimate times this does not fit (the growing-vocabulary
#: corpus holds 2.1x what Heaps' law says for its size): a run far inside its budget is not sampled.
SAMPLE_WHEN_HEAPS_TIMES = 4


def _refuse_from_sample(config: TrainConfig, inputs: Inputs, the_plan: budget.Plan, pattern: str,
                        specials: list[bytes]) -> Optional[dict[str, Any]]:
    """Before counting: estimate a large local file's unique pretokens from a spread sample
    (``pretok.sample.sample_words``, ~0.5 CPU-s for 128 MiB) and stop the run here when the merge
    phase cannot fit the budget with ``SAMPLE_TRUST`` of them, naming the budget the whole estimate
    needs (a run at that budget counts, and names the exact figure if the corpus holds more). Returns
    what the sample said (the report's ``sample``), or None when nothing was sampled.

    Raises:
        errors.BudgetError: the estimate does not fit the budget.
    """
    if (not inputs.one_local_plain_file or config.cluster is not None or config.min_pretoken_count > 1
            or inputs.sources[0].size < SAMPLE_MIN_BYTES):
        return None
    try:
        the_plan.with_count(SAMPLE_WHEN_HEAPS_TIMES * the_plan.unique_pretokens)
        return None                              # fits even with many more words than Heaps' law says
    except BudgetError:
        pass
    t0 = time.perf_counter()
    s = sample_words(inputs.sources[0].name, specials, pattern, threads=the_plan.num_workers)
    info = {"sample_bytes": s.sample_bytes, "unique": s.unique, "unique_half": s.unique_half,
            "exponent": s.exponent, "estimate": s.estimate, "seconds": round(time.perf_counter() - t0, 3)}
    try:
        the_plan.with_count(max(s.unique, int(s.estimate * SAMPLE_TRUST)))
        return info
    except BudgetError:
        pass
    try:
        the_plan.with_count(s.estimate)
    except BudgetError as exc:
        raise BudgetError(
            f"{exc} (before counting: the unique pretokens estimated from {budget.fmt_bytes(s.sample_bytes)} in "
            f"{SAMPLE_PIECES} pieces spread over the file, {s.unique:,} unique there, carried to the whole "
            f"file by Heaps' law with the exponent they show, {s.exponent:.2f}; a run at that budget names "
            f"the exact figure after counting if the file holds more)", exc.min_budget) from None
    return info                                  # (not reached: a smaller count did not fit)


def _read_options(config: TrainConfig) -> ReadOptions:
    return ReadOptions(text_field=config.text_field, text_column=config.text_column,
                       bad=BadRecords(skip=config.skip_bad_records))


# ====================================================================================================
# The pipeline
# ====================================================================================================

def train(config: TrainConfig) -> TrainResult:
    """Train from a :class:`TrainConfig`; returns the model and a run report.

    Five stages, each a function that takes the value the one before handed on
    (``docs/architecture.md``, "Training as stages"):

    ``prepare_inputs`` -> :class:`Inputs` -> ``start`` -> :class:`Run` -> ``count`` -> :class:`Counts`
    -> ``plan_merges`` -> :class:`MergePlan` -> ``learn`` -> ``MethodResult`` -> ``finish`` ->
    :class:`TrainResult` (the ``Model`` and the report).
    """
    method = registry.get(config.method)
    with prepare_inputs(config, method) as inputs:                     # spooled or curated when asked
        run = start(inputs, method)                                    # plan, init model, report head
        with MemoryMonitor(interval=0.05, budget=run.plan.memory_limit) as monitor, \
                open_executor(config.cluster, run.plan.num_workers, announce=_announcer(config.progress),
                              timeout=config.cluster_timeout) as executor:
            counts = count(inputs, run, executor, monitor)             # the WordTable, totals checked
            merge_plan = plan_merges(counts, run)                      # the merge phase fits, or stop
            learned = learn(merge_plan, run, executor)                 # the method's merges
        return finish(learned, run, monitor)                           # Model + report


# ---- stage 1: inputs --------------------------------------------------------------------------------

@dataclass
class Inputs:
    """What counting reads: the run's config (its ``input_path`` may name a prepared temp file), the
    sources found in it, and what preparing them did (for the report)."""

    config: TrainConfig
    sources: list[Source]
    #: the config the caller gave (its input is what the report names)
    given: TrainConfig
    #: report entries of the preparation, in the order they are added: ``entropy_filter``,
    #: ``spooled`` and ``bad_records`` (the spooled inputs' bad records)
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def one_local_plain_file(self) -> bool:
        """One local plain file: what a second pass (SupraTok, curation, SuperBPE's record) reads."""
        return _one_local_plain_file(self.sources)


def _one_local_plain_file(sources: list[Source]) -> bool:
    return len(sources) == 1 and sources[0].plain_text and not sources[0].is_url


@contextlib.contextmanager
def prepare_inputs(config: TrainConfig, method: registry.Method) -> Iterator[Inputs]:
    """Stage 1: find the inputs; when the method or the entropy filter reads the corpus again and it
    is not one local plain file, spool it into one (a temp file); then curate it when
    ``entropy_filter`` asks (``methods.curate``). Temp files are removed when the block ends."""
    sources = sources_of(config)             # local paths and fsspec URLs alike (corpus.inputs)
    if config.cluster is not None:
        check_distributable(sources)         # stdin and iterators cannot go to cluster workers
    given, notes = config, {}
    with contextlib.ExitStack() as stack:
        if not _one_local_plain_file(sources) and \
                (config.entropy_filter or method.reads_input_again(config, sources)):
            config, info = stack.enter_context(_spooled(config, sources))
            notes["spooled"], notes["bad_records"] = info, info["bad_records"]
            sources = sources_of(config)
        if config.entropy_filter:            # curate the input first (methods/curate.py), then train on it
            from .methods.curate import curated_config

            config, curation = stack.enter_context(curated_config(config))
            notes = {"entropy_filter": curation, **notes}
            sources = sources_of(config)
        if notes:                            # the temp files are ours: no warning about their bytes
            stack.enter_context(warnings.catch_warnings())
            warnings.simplefilter("ignore", BinaryInputWarning)
        yield Inputs(config, sources, given, notes)


@contextlib.contextmanager
def _spooled(config: TrainConfig, sources: list[Source]):
    """A config whose input is one plain file holding the corpus (a temp file under the spill
    folder, removed after use), for a method or filter that reads the input again."""
    specials = encode_specials(config.special_tokens)
    opts = _read_options(config)
    opts.special_tokens = specials
    folder = new_temp_dir(config.spill_dir, "bpe_core-spool-")
    try:
        path = os.path.join(folder, "corpus.txt")
        with naming(path), open(path, "wb") as f:          # a full disk names the spooled file
            n = spool(sources, opts, f)
        info = {"inputs": [s.describe() for s in sources], "spooled_bytes": n,
                "bad_records": opts.bad.to_dict()}
        yield dataclasses.replace(config, input_path=path, input_format="text"), info
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ---- the run: plan and report head ----------------------------------------------------------------

@dataclass
class Run:
    """What every later stage reads: the method, the memory plan, the pattern and special tokens, the
    model to start from (``--init-from``), and the report being filled in."""

    config: TrainConfig
    method: registry.Method
    plan: budget.Plan
    pattern: str
    specials: list[bytes]
    init: Any
    report: dict[str, Any]
    #: the preparation's report entries (``Inputs.notes``), added last
    notes: dict[str, Any]
    t_start: float
    #: when the plan was made (the cluster's start is timed from here)
    t_planned: float = 0.0


def start(inputs: Inputs, method: registry.Method) -> Run:
    """Check what can be checked before any work (pattern, ``--init-from``) and plan the memory.

    Raises:
        errors.BudgetError: the run cannot fit ``config.memory_limit``.
    """
    t_start = time.perf_counter()
    phase("plan")
    config = inputs.config
    pattern = resolve_pattern(config.pattern)
    specials = encode_specials(config.special_tokens)
    init = None
    if config.init_from is not None:   # --init-from: checked before any work
        from .methods.init_from import load_init

        init = load_init(config)
    the_plan = plan(config, inputs.sources)
    budget.warn_over_machine(the_plan)       # a --memory-limit above the RAM or the cgroup: one line
    sampled = _refuse_from_sample(config, inputs, the_plan, pattern, specials)
    report: dict[str, Any] = {
        "input_path": _describe_input(inputs.given.input_path),
        "inputs": len(inputs.sources),
        "vocab_size": config.vocab_size,
        "special_tokens": list(config.special_tokens),
        "pattern": pattern,
        "num_workers": the_plan.num_workers,
        "chunk_bytes": the_plan.chunk_bytes,
        "memory_limit": the_plan.memory_limit,
        "plan": the_plan.to_dict(),
        "seconds": {"plan": round(time.perf_counter() - t_start, 3)},
    }
    if sampled is not None:
        report["sample"] = sampled
    return Run(config, method, the_plan, pattern, specials, init, report, inputs.notes, t_start,
               time.perf_counter())


# ---- stage 2: counts ------------------------------------------------------------------------------

@dataclass
class Counts:
    """The counted corpus: the ``WordTable`` with its totals checked, the corpus size, the config
    the method runs with (on a cluster, its executor), and each pretoken's row when recorded."""

    table: WordTable
    input_bytes: int
    config: TrainConfig
    recorded: Optional[list] = None


def count(inputs: Inputs, run: Run, executor: Any, monitor: MemoryMonitor) -> Counts:
    """Stage 2: pre-tokenize and count the inputs (worker threads here, or the shards on a cluster)."""
    config, report, the_plan = inputs.config, run.report, run.plan
    if executor.remote:
        report["seconds"]["cluster_start"] = round(time.perf_counter() - run.t_planned, 3)
    recorded = None
    if config.cluster is not None:
        # Each task reads its own shard of the inputs (byte ranges, row groups, whole compressed
        # files); the tables are combined on the workers.
        table = count_sources_on(executor, inputs.sources, run.specials, run.pattern, the_plan.chunk_bytes,
                                 progress=config.progress, report=report, read_options=_read_options(config))
        config = replace(config, cluster=executor)     # the method's own data-parallel phases too
    else:
        # A method that can use each pretoken's row (SuperBPE's stage 2 lists its units from them
        # instead of pre-tokenizing the file again) gets them recorded as the corpus is counted
        # (4 B a pretoken: at most 4 B a byte of text, ~0.9 B on English), held in RAM up to an
        # eighth of the budget and the chunks past it written to the spill folder (mapped when
        # read): the plan does not count it.
        method = run.method
        record = None
        if method.records_pretokens and method.uses_record(config) and inputs.one_local_plain_file:
            from .methods.record import PretokenRecord
            record = PretokenRecord(budget.record_ram_bytes(the_plan.memory_limit), config.spill_dir)
        table = count_corpus(inputs.sources, run.specials, run.pattern, the_plan.num_workers, the_plan.chunk_bytes,
                             progress=config.progress, report=report, monitor=monitor,
                             memory_limit=the_plan.memory_limit, per_worker_bytes=the_plan.per_worker_bytes,
                             spill_threshold_bytes=the_plan.spill_threshold_bytes or None,
                             spill_dir=config.spill_dir, check_words=_stop_when_unfit(run),
                             read_options=_read_options(config), record=record, plain=method.plain_tables,
                             check_stretches=lambda ranges: budget.check_uncut(the_plan, ranges))
        recorded = record or None
        if record is not None:
            report["record"] = {"chunks": len(record), "ram_bytes": record.ram_held,
                                "spilled_chunks": record.spilled_chunks, "spilled_bytes": record.spilled_bytes}
    size = report["input_bytes"] = report["corpus_bytes"]
    report["unique_pretokens"] = table.n_words
    report["pretokens"] = table.n_pretokens
    return Counts(table, size, config, recorded)


def _stop_when_unfit(run: Run):
    """Stop counting as soon as the merge phase provably cannot fit (``n_words`` is a lower bound)."""
    def check_words(n_words: int) -> None:
        if n_words * budget.TABLE_BYTES_PER_WORD < run.plan.memory_limit // 8 or run.config.min_pretoken_count > 1:
            return          # far from the limit (cheap check first); pruning decides after counting
        try:
            run.plan.with_count(n_words)
        except BudgetError as exc:
            # a lower bound: more unique pretokens may follow (the exact figure comes after counting)
            raise BudgetError(f"stopped while counting: {n_words:,} unique pretokens so far already need more "
                              f"than the budget; " + str(exc).replace("the smallest budget that works is",
                                                                      "the smallest budget that works is at least")
                              + " (more may follow: a run at that budget names the exact figure after counting)",
                              exc.min_budget) from None
    return check_words


# ---- stage 3: merge plan --------------------------------------------------------------------------

@dataclass
class MergePlan:
    """The merge phase, checked against the budget with the real counts: the table the method
    learns from (pruned by ``min_pretoken_count``; in mapped files when the plan says so), the
    plan, and the config and extras (``init``, ``recorded``) the method's ``train`` takes."""

    table: Any
    plan: budget.Plan
    config: TrainConfig
    extras: dict[str, Any]


def plan_merges(counts: Counts, run: Run) -> MergePlan:
    """Stage 3: prune, check the merge phase against the budget with the real count (and the symbols
    the engine will hold), and move the table to mapped files when the plan says so.

    Raises:
        errors.BudgetError: the merge phase cannot fit.
    """
    config, report, table = counts.config, run.report, counts.table
    counts.table = None             # this stage owns the table now: a pruned or mapped one replaces it
    if config.min_pretoken_count > 1:
        table = table.at_least(config.min_pretoken_count)
        report["unique_pretokens_kept"] = table.n_words
    n_symbols = len(table.arena)
    if run.method.drops_single_byte_words:     # they hold no pair: the engine drops them
        n_symbols -= table.one_byte_words
    longest, sites = _longest(table)
    release_free_memory()          # what counting freed goes back before it is measured (1 GB: 61 -> 44 MiB)
    # the record of the pretokens (methods.record) is outside the plan, in the eighth of the budget it
    # leaves free: what it holds in RAM is not the process's overhead (with it, a 1 GB run under
    # --memory-limit 3G planned a smaller stage-2 sample than the same run without a record)
    record_ram = getattr(counts.recorded, "ram_held", 0) if counts.recorded else 0
    merge_plan = run.plan.with_count(table.n_words, symbols=n_symbols, longest_pretoken=longest,
                                     longest_pair_sites=sites,
                                     parent_overhead=max(0, _held_beside(table) - record_ram))
    # ``count_bytes``: the counting phase's figure again with the words counted. Before counting the
    # plan has only Heaps' law's estimate of them, which a corpus whose vocabulary keeps growing
    # passes (the 15 GB synthetic corpus: 8.9 M estimated, 18.8 M counted; its counting peaked at
    # 1,028 MiB anonymous against 853 planned, 1,341 with the words counted); what bounds the
    # counting whatever the words is the spill threshold, inside the budget.
    report["merge_plan"] = {k: merge_plan.to_dict()[k] for k in
                            ("merge_bytes", "merge_file_bytes", "merge_mapped", "unique_pretokens",
                             "symbols", "phase_seconds", "count_bytes")}
    if merge_plan.merge_mapped:
        # The table and the engine's read-only arrays go to mapped files (page cache); only what
        # the merge loop changes stays in RAM. The table in RAM is dropped here.
        phase("map words")
        tm = time.perf_counter()
        budget.refuse_memory_folder(config.spill_dir or tempfile.gettempdir())   # tmpfs saves no memory
        with naming(config.spill_dir or tempfile.gettempdir()):      # a full disk names the folder
            table = table.to_files(config.spill_dir or tempfile.gettempdir(),
                                   drop_singletons=run.method.drops_single_byte_words)
        release_free_memory()        # the table's pages in RAM go back before the engine is built
        report["seconds"]["map_words"] = round(time.perf_counter() - tm, 3)
    if not run.method.plain_tables:            # a small run's array.array table, as numpy views
        table = table.as_numpy()
    extras: dict[str, Any] = {}
    if counts.recorded:
        extras["recorded"] = counts.recorded
    if run.init is not None:
        extras["init"] = run.init
    counts.recorded = None          # the plan holds the only reference now
    return MergePlan(table, merge_plan, config, extras)


def _held_beside(table) -> int:
    """The anonymous memory this process holds now beside the counted table: the interpreter, numpy
    and the compiled modules (imported after the plan measured the process before counting), and
    what counting left. The merge phase holds it too (``Plan.with_count(parent_overhead=)``).

    >>> from bpe_core.pretok.wordtable import WordTable
    >>> _held_beside(WordTable.from_counts({b"ab": 3})) > 0
    True
    """
    in_ram = 0 if getattr(table, "mapped", False) else sum(
        memoryview(a).nbytes for a in (table.arena, table.offsets, table.counts))
    return max(0, tree_memory()["anon"] - in_ram)


def _longest(table, window: int = 1 << 20, step: int = 1 << 20) -> tuple[int, int]:
    """``(bytes, pair sites)`` of the longest word of a table (numpy arrays or a small run's
    ``array.array``): its length, and the occurrences of its most frequent byte pair, counted in
    windows of ``window`` bytes (a word may be GBs long, and the budget holds a few MiB here: 16 MiB
    windows as int32 took 200 MiB beside a 50 MB word). Sites 0 for words under 4 KiB (the plan's
    per-word figures hold them).

    >>> from bpe_core.pretok.wordtable import WordTable
    >>> _longest(WordTable.from_counts({b"ab": 3, b"a" * 5000 + b"b" * 10: 1}), window=1000)
    (5010, 4999)
    >>> _longest(WordTable.from_counts({b"abc": 1, b"de": 2, b"fgh": 3, b"i": 4}).as_numpy(), step=1)
    (3, 0)
    """
    offsets = table.offsets
    if len(offsets) < 2:
        return 0, 0
    if isinstance(offsets, array.array):
        k = max(range(len(offsets) - 1), key=lambda i: offsets[i + 1] - offsets[i])
    else:                     # the first longest, ``step`` words at a time (no lengths of every word at once)
        offsets = np.asarray(offsets)
        k, best = 0, -1
        for lo in range(0, len(offsets) - 1, step):
            lengths = np.diff(offsets[lo:lo + step + 1])
            i = int(np.argmax(lengths))
            if lengths[i] > best:
                k, best = lo + i, int(lengths[i])
    start, end = int(offsets[k]), int(offsets[k + 1])
    if end - start < 4096:
        return end - start, 0
    counts = np.zeros(1 << 16, np.int64)
    arena = table.arena
    for a in range(start, end - 1, window):
        w = np.frombuffer(memoryview(arena)[a:min(end, a + window + 1)], np.uint8)
        counts += np.bincount((w[:-1].astype(np.uint16) << 8) | w[1:], minlength=1 << 16)   # 2 B per byte
    return end - start, int(counts.max())


# ---- stage 4: the method's merges -----------------------------------------------------------------

def learn(merge_plan: MergePlan, run: Run, executor: Any) -> registry.MethodResult:
    """Stage 4: the method learns its merges from the table (``formats.registry.Method.train``)."""
    extras, merge_plan.extras = merge_plan.extras, {}
    table, merge_plan.table = merge_plan.table, None      # the method holds the only reference
    learned = run.method.train(merge_plan.config, table, merge_plan.plan, progress=merge_plan.config.progress,
                               **extras)
    del table, extras
    if executor.remote:
        run.report["cluster"] = executor.describe()
    return learned


# ---- stage 5: model and report --------------------------------------------------------------------

def finish(learned: registry.MethodResult, run: Run, monitor: MemoryMonitor) -> TrainResult:
    """Stage 5: the ``Model`` and the whole report (the method's section, memory, the preparation)."""
    config, report = run.config, run.report
    section = dict(learned.report)
    report["seconds"].update(section.pop("seconds", {}))
    report.update(section)
    # every report has these, whichever method ran (the tools read them)
    report.setdefault("merges", len(learned.merges))
    report.setdefault("merges_requested", max(config.vocab_size - 256 - len(run.specials), 0))
    report["vocab_size_reached"] = len(learned.vocab)
    report["seconds"]["total"] = round(time.perf_counter() - run.t_start, 3)
    report["memory"] = monitor.summary()
    # CPU seconds (all threads) per phase: on a shared machine the wall times above are noise
    report["cpu_seconds"] = monitor.cpu_by_phase()
    budget.warn_exceeded(report["memory"], "training")     # the measured peak above the budget: one line
    report["peak_rss_bytes"] = {"tree_sampled": monitor.peak, **peak_rss_bytes()}
    model = Model(
        vocab=learned.vocab,
        merges=learned.merges,
        special_tokens=[s if isinstance(s, str) else s.decode("utf-8") for s in config.special_tokens],
        pattern=run.pattern,
        method=config.method,
        stages=learned.stages,
        metadata={"input_bytes": report["input_bytes"], "unique_pretokens": report["unique_pretokens"]},
    )
    if run.init is not None:
        report["init_from"] = model.metadata["init_from"] = run.init.info
    report.update(run.notes)        # entropy_filter, spooled, bad_records: what preparing the input did
    if "entropy_filter" in run.notes:
        model.metadata["entropy_filter"] = run.notes["entropy_filter"]
    return TrainResult(model=model, report=report)


def _announcer(progress):
    """Where the dashboard link goes: stderr, once, when progress is shown."""
    if progress in (False, None, "none"):
        return None
    return lambda line: print(line, file=sys.stderr, flush=True)


def train_bpe(input_path: str | os.PathLike, vocab_size: int, special_tokens: Sequence[str] = (),
              **options) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Train a byte-level BPE tokenizer on a file (the CS336 assignment-1 interface).

    Args:
        input_path: the corpus: a text file (read as bytes, never loaded whole), or anything
            ``TrainConfig.input_path`` takes: compressed files, JSON Lines, Parquet, directories,
            glob patterns, a list of these, a ``datasets.Dataset`` (see ``docs/inputs.md``).
        vocab_size: 256 bytes + special tokens + merges.
        special_tokens: split out before pre-tokenization, never merged; ids 256, 257, ...
        **options: any other :class:`TrainConfig` field: ``pattern`` (``"gpt2"``, ``"cl100k"``,
            ``"o200k"`` or a regex), ``num_workers``, ``chunk_bytes``, ``memory_limit`` (bytes, or
            a size string such as ``"8G"``), ``min_pretoken_count``, ``spill_dir``, ``progress``,
            ``cluster`` (``"local:4"``, ``"tcp://host:8786"`` or a ``distributed.Client``: count on
            a Dask cluster, ``docs/cluster.md``; ``input_path`` may then be an fsspec URL).

    Returns:
        ``(vocab, merges)``: ``vocab`` maps id -> bytes; ``merges`` lists ``(left, right)`` in order.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "c.txt")
    >>> _ = open(p, "wb").write(b"low low low lower<|endoftext|>lowest")
    >>> vocab, merges = train_bpe(p, 260, ["<|endoftext|>"], num_workers=1)
    >>> merges[:2], vocab[256]
    ([(b'o', b'w'), (b'l', b'ow')], b'<|endoftext|>')
    """
    unknown = set(options) - set(TrainConfig.field_names())
    if unknown:
        raise TypeError(f"unknown option(s): {', '.join(sorted(unknown))}")
    config = TrainConfig(input_path=input_path, vocab_size=vocab_size,
                         special_tokens=tuple(special_tokens), **options)
    result = train(config)
    return result.vocab, result.merges


def _describe_input(inputs: Any) -> Any:
    """The input as the report shows it: absolute path(s), or the type of an iterator."""
    if isinstance(inputs, str):
        return inputs if inputs == "-" or is_url(inputs) else os.path.abspath(inputs)
    if isinstance(inputs, (list, tuple)):
        return [_describe_input(p) if isinstance(p, str) else f"<{type(p).__name__}>" for p in inputs]
    return f"<{type(inputs).__name__}>"


def train_from_iterator(iterator: Any, vocab_size: int, special_tokens: Sequence[str] = (),
                        **options) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Train on an iterator of documents (the shape Hugging Face ``tokenizers`` users know).

    Each item is one document: ``str`` (UTF-8, surrogateescape) or ``bytes``; an item that is a
    list or tuple is a batch of documents. The documents are joined by the first special token,
    exactly as the ``.txt`` holding them with separators (without special tokens they are kept
    apart: no pretoken or merge crosses two documents). The iterator is read once, in bounded
    memory; a method that reads the corpus twice (``superbpe``, ``supratok``) gets it written to a
    temp file under ``spill_dir`` first. A ``datasets.Dataset`` / ``IterableDataset`` is read by
    its ``text_column`` option (default ``"text"``).

    >>> vocab, merges = train_from_iterator(["low low low", "lower", b"lowest"], 260, ["<|endoftext|>"],
    ...                                     num_workers=1)
    >>> merges[:2], vocab[256]
    ([(b'o', b'w'), (b'l', b'ow')], b'<|endoftext|>')
    """
    if isinstance(iterator, (str, bytes, os.PathLike)):
        raise TypeError("train_from_iterator takes an iterator of documents; for a file use train_bpe(path)")
    if isinstance(iterator, (list, tuple)):
        iterator = iter(iterator)           # documents, not a list of paths
    return train_bpe(iterator, vocab_size, special_tokens, **options)
