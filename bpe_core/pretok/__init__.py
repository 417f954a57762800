"""Stage 2: pre-tokenization and counting.

- ``patterns``: the named patterns (GPT-2, cl100k, o200k and their tiktoken aliases), custom regexes
  and gap filling;
- ``pretokenize``: pieces and count tables of a buffer (the native scanner ``_pretok``, byte-identical
  to ``regex``);
- ``wordtable``: the sorted count table (unique pretokens and counts), the mergeable format;
- ``counting``: a whole file counted on worker threads into one ``WordTable``.
"""
from .patterns import PATTERNS, is_pattern_name, pattern_name, pattern_names, regex_pieces, resolve_pattern
from .pretokenize import count_pretokens, is_native, merge_counts, pretoken_ends, pretokenize
from .wordtable import WordTable

__all__ = ["PATTERNS", "WordTable", "count_pretokens", "is_native", "is_pattern_name", "merge_counts",
           "pattern_name", "pattern_names", "pretoken_ends", "pretokenize", "regex_pieces", "resolve_pattern"]
