"""Stage 1: reading the input and cutting it into chunks.

``corpus/`` flows one way -- **find the inputs -> cut shards -> open a reader per format -> read
ranges** -- and each module imports only modules after it in this order (the import graph is a
DAG; ``tests/test_architecture.py`` checks it):

1. ``inputs``: find the inputs (``expand_inputs``: files, folders, globs, URLs, ``-``, iterators,
   ``datasets`` objects) and detect each one's format (:class:`inputs.Source`);
2. ``shards``: cut shards (``Source.shards``/``input_shards``, ``source_shards``: byte ranges,
   JSON Lines lines, Parquet row groups, streams) and give the corpus in order as tasks of blocks
   (``ReadOptions``, ``Block``, ``iter_tasks``, ``load``, ``shard_blocks``, ``corpus_bytes``,
   ``spool``);
3. ``readers``: open a reader per format (decompressors, JSON Lines, Parquet, iterators; bad
   records);
4. ``ranges``: read byte ranges and streams of a local path (``pread``) or an fsspec URL, and
   stamp their content (``read_source``, ``open_source``, ``source_stamp``, ``check_source``);
5. ``chunks``: byte ranges cut only where the cut provably leaves pre-tokenization unchanged;
6. ``files``: what may be read (``check_input``), compressed and binary input;
7. ``specials``: special tokens, the document separators split out before anything else.

The last three are the low-level helpers (the single-file fast path uses them directly).
"""
from ..errors import BinaryInputWarning, CorpusError
from .chunks import SAFE_CUT_PATTERNS, chunk_boundaries, count_specials, file_chunks, split_spans, text_spans
from .files import binary_reason, check_input, compressed_format, open_corpus, open_mmap_bytes, warn_if_binary
from .specials import DEFAULT_SPECIAL_TOKEN, encode_specials, specials_regex, split_on_specials

__all__ = ["BinaryInputWarning", "CorpusError", "DEFAULT_SPECIAL_TOKEN", "SAFE_CUT_PATTERNS", "binary_reason",
           "check_input", "chunk_boundaries", "compressed_format", "count_specials", "encode_specials",
           "file_chunks", "open_corpus", "open_mmap_bytes", "specials_regex", "split_on_specials",
           "split_spans", "text_spans", "warn_if_binary"]
