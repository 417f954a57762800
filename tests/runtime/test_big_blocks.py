"""``big_blocks_mapped``: big blocks get mappings of their own inside the block only (glibc)."""
import ctypes
import os
import platform
import subprocess
import sys

import pytest

from paths import package_parent

# In a fresh process (the heap of a process that ran other tests may already hold a free block of
# that size, served without asking the system for memory): whether a fresh block of 4 MiB gets a
# mapping of its own (glibc counts them: mallinfo2().hblks) inside the block, after it, and one
# above glibc's ceiling after it.
CHECK = r"""
import ctypes
from bpe_core.runtime.workers import GLIBC_MMAP_THRESHOLD_MAX, big_blocks_mapped

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                 "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]

def mapped_by(size):
    before = libc.mallinfo2().hblks
    p = libc.malloc(size)
    try:
        return libc.mallinfo2().hblks > before
    finally:
        libc.free(p)

with big_blocks_mapped(1 << 20) as was_set:
    inside = mapped_by(4 << 20)
print(was_set, inside, mapped_by(4 << 20), mapped_by(GLIBC_MMAP_THRESHOLD_MAX + (1 << 20)))
"""


@pytest.mark.skipif(platform.system() != "Linux" or not hasattr(ctypes.CDLL(None), "mallinfo2"),
                    reason="glibc only")
def test_big_blocks_are_mapped_inside_the_block_only(tmp_path):
    env = dict(os.environ, PYTHONPATH=package_parent())
    # (run from elsewhere: ``python -c`` puts the current folder first, and in a clean clone's root
    # that is the unbuilt source, not the installed package)
    out = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, check=True,
                         cwd=tmp_path)
    assert out.stdout.split() == ["True", "True", "False", "True"]
