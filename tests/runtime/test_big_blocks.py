"""``big_blocks_mapped``: big blocks get mappings of their own inside the block only (glibc)."""
import ctypes
import platform

import pytest

from bpe_core.runtime.workers import GLIBC_MMAP_THRESHOLD_MAX, big_blocks_mapped


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _mapped_blocks() -> int:
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = _MallInfo2
    return libc.mallinfo2().hblks


def _mapped_by(size: int) -> bool:
    """Whether a fresh ``size``-byte block gets a mapping of its own."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    before = _mapped_blocks()
    p = libc.malloc(size)
    try:
        return _mapped_blocks() > before
    finally:
        libc.free(p)


@pytest.mark.skipif(platform.system() != "Linux" or not hasattr(ctypes.CDLL(None), "mallinfo2"),
                    reason="glibc only")
def test_big_blocks_are_mapped_inside_the_block_only():
    size = 4 << 20
    with big_blocks_mapped(1 << 20) as was_set:
        assert was_set
        assert _mapped_by(size)
    assert not _mapped_by(size)                      # the heap again, below glibc's ceiling
    assert _mapped_by(GLIBC_MMAP_THRESHOLD_MAX + (1 << 20))
