"""Stage 1: reading the input and cutting it into chunks.

- ``files``: what may be read (``check_input``), compressed and binary input;
- ``specials``: special tokens, the document separators split out before anything else;
- ``chunks``: byte ranges cut only where the cut provably leaves pre-tokenization unchanged.
"""
from ..errors import BinaryInputWarning, CorpusError
from .chunks import SAFE_CUT_PATTERNS, chunk_boundaries, count_specials, file_chunks, split_spans, text_spans
from .files import binary_reason, check_input, compressed_format, open_corpus, open_mmap_bytes, warn_if_binary
from .specials import DEFAULT_SPECIAL_TOKEN, encode_specials, specials_regex, split_on_specials

__all__ = ["BinaryInputWarning", "CorpusError", "DEFAULT_SPECIAL_TOKEN", "SAFE_CUT_PATTERNS", "binary_reason",
           "check_input", "chunk_boundaries", "compressed_format", "count_specials", "encode_specials",
           "file_chunks", "open_corpus", "open_mmap_bytes", "specials_regex", "split_on_specials",
           "split_spans", "text_spans", "warn_if_binary"]
