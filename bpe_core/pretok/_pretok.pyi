"""Type stubs for the native pre-tokenizer (bpe_core/_pretok.pyx)."""
import array
from typing import Literal, Optional, Sequence, Tuple, overload

import numpy as np
import numpy.typing as npt

Buffer = bytes | bytearray | memoryview | npt.NDArray[np.uint8]
WordTable = Tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64], npt.NDArray[np.int64]]
# WordTable + ids: uint32, the row of every pretoken in text order.
RecordedTable = Tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64], npt.NDArray[np.int64],
                      npt.NDArray[np.uint32]]

TABLES_REGEX_VERSION: str
TABLES_UNICODE_VERSION: str
TABLES_DIGEST: str
PATTERN_IDS: dict[str, int]  # {"gpt2": 0, "cl100k": 1, "o200k": 2}

def split_ends(buf: Buffer, pattern_id: int) -> npt.NDArray[np.int64]: ...
def split_pieces(buf: Buffer, pattern_id: int, specials: npt.NDArray[np.int64]) -> list[bytes]: ...
def find_special(buf: Buffer, token: Buffer) -> npt.NDArray[np.int64]: ...
# tokens: non-empty, longest first; the (k, 2) spans of their occurrences in buf[start:end].
def special_spans(buf: Buffer, start: int, end: int, tokens: Sequence[bytes]) -> npt.NDArray[np.int64]: ...
class CountScratch:
    """A counting worker's hash tables, kept from one ``count_pretokens(scratch=)`` call to the next."""
    @property
    def nbytes(self) -> int: ...
    def clear(self) -> None: ...
# Whether front slots turn misses away by their age (the default) or every miss takes its slot; the previous setting.
def set_front_aging(on: bool) -> bool: ...
@overload
def count_pretokens(buf: Buffer, spans: npt.NDArray[np.int64], pattern_id: int,
                    record: Literal[False] = ..., numpy: Literal[True] = ...,
                    scratch: Optional[CountScratch] = ...) -> WordTable: ...
@overload
def count_pretokens(buf: Buffer, spans: memoryview, pattern_id: int, record: Literal[False] = ...,
                    *, numpy: Literal[False]) -> Tuple[array.array, array.array, array.array]: ...
@overload
def count_pretokens(buf: Buffer, spans: npt.NDArray[np.int64], pattern_id: int,
                    record: Literal[True], *,
                    span_ends: Optional[npt.NDArray[np.int64]] = ...) -> RecordedTable: ...
MERGE_PAR_MIN_WORDS: int
def merge_counts(tables: Sequence[WordTable], threads: int = ..., par_min_words: int = ...) -> WordTable: ...
# Per word of an (arena, offsets) table: \p{N} / first \s / last \s flags (1, 2, 4), and the byte classes.
def word_char_flags(arena: npt.NDArray[np.uint8], offsets: npt.NDArray[np.int64]) -> npt.NDArray[np.uint8]: ...
def word_byte_classes(arena: npt.NDArray[np.uint8], offsets: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]: ...
# (pretokens, text bytes, one-byte words) of a table; the table without its one-byte words (None: none).
def table_sums(offsets: Buffer, counts: Buffer) -> Tuple[int, int, int]: ...
def drop_one_byte_words(arena: Buffer, offsets: Buffer, counts: Buffer
                        ) -> Optional[Tuple[array.array, array.array, array.array]]: ...
