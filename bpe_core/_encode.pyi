"""Type stubs for the compiled encoder core (bpe_core/_encode.pyx)."""
from typing import Any

import numpy as np
import numpy.typing as npt

class RankTable:
    n_merges: int
    n_pairs: int
    def __init__(self, lefts: npt.NDArray[np.uint32], rights: npt.NDArray[np.uint32],
                 merged_ids: npt.NDArray[np.uint32], byte_ids: npt.NDArray[np.uint32]) -> None: ...
    def lookup(self, left: int, right: int) -> tuple[int, int] | None: ...

class Encoder:
    table: RankTable
    max_entries: int
    max_cached_len: int
    misses: int
    def __init__(self, table: RankTable, max_entries: int = ..., max_cached_len: int = ...) -> None: ...
    def encode_piece(self, piece: bytes, method: str = "auto") -> list[int]: ...
    def encode_pieces(self, buf: Any, ends: npt.NDArray[np.int64], start: int = 0,
                      forced_ids: npt.NDArray[np.int64] | None = None) -> npt.NDArray[np.uint32]: ...
    def cache_info(self) -> dict[str, int]: ...
    def clear_cache(self) -> None: ...
