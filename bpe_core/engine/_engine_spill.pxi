# _engine.pyx, part 3 of 6 (``include``d: compiled into the module as if written there).
# Read-only arrays in RAM or in a memory-mapped file under the spill folder, written in place (_SpillMap).

# ==== Read-only arrays: in RAM or in a mapped file ============================================


class _SpillMap:
    """A read-only array filled in place: a file under ``folder`` of ``n`` items of ``dtype``,
    allocated at once and mapped shared and writable (``arr``), which the build writes through the
    mapping: no buffer in RAM copied to the file, no anonymous memory for it (the mapping's pages are
    the page cache's). A full disk fails at the allocation (an ``OSError`` naming nothing: the caller
    names the folder), not at a later page fault.

    The caller says which bytes are written (``written``): their writeback starts then
    (``runtime.writeback.WriteBehind``: the writeback started before is waited for, so at most two
    pieces are dirty at a time), and ``clean`` waits until everything written is on disk (its pages
    clean: a memory cgroup can drop them at once). ``mapped`` gives the array, clean; the file is
    unlinked (the mapping keeps it, a killed process leaves nothing behind).
    """

    def __init__(self, folder, name, dtype, Py_ssize_t n):
        self.fd, self.path = new_temp_file(folder, f"bpe_core-spill-{os.getpid()}-engine-{name}-")
        try:
            self.out = WriteBehind(self.fd)
            nbytes = n * np.dtype(dtype).itemsize
            if nbytes == 0:
                self.arr = np.zeros(0, dtype=dtype)
                return
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(self.fd, 0, nbytes)     # (the blocks now: ENOSPC here)
            else:                # (no such call, macOS: a sparse file, a full disk shows at a page fault)
                os.ftruncate(self.fd, nbytes)
            self.arr = np.memmap(self.path, dtype=dtype, mode="r+", shape=(n,))
        except BaseException:
            self.discard()
            raise

    def written(self, Py_ssize_t nbytes):
        """``nbytes`` more bytes of the array, after those said before, are written: start their
        writeback (``WriteBehind``: waits for the writeback started before)."""
        self.out.wrote(nbytes)

    def clean(self):
        """Wait until every byte written is on disk."""
        self.out.finish()

    def mapped(self):
        """The array, clean; the file is gone from the folder. Its pages are marked cold (``MADV_COLD``:
        the least recently used of the page cache, as pages written with ``write`` are, not pages
        the build touched just now; a hint, ignored by kernels without it): under a memory cgroup's
        cap the merge loop keeps the pages it reads, and the others go first."""
        cdef size_t start, end
        try:
            self.out.finish()
            arr, self.arr = self.arr, None
            if arr.size:
                start = (<size_t>arr.ctypes.data + 4095) & ~(<size_t>4095)
                end = (<size_t>arr.ctypes.data + <size_t>arr.nbytes) & ~(<size_t>4095)
                if end > start:
                    madvise(<void*>start, end - start, MADV_COLD)
            return arr
        finally:
            self.discard()

    def discard(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            os.unlink(self.path)
