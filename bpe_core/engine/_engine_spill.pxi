# _engine.pyx, part 3 of 6 (``include``d: compiled into the module as if written there).
# Read-only arrays in RAM or in a memory-mapped file under the spill folder (_SpillFile).

# ==== Read-only arrays: in RAM or in a mapped file ============================================


class _SpillFile:
    """A read-only array written sequentially to a file under ``folder``, then memory-mapped
    (page cache: the kernel may drop its pages under memory pressure and read them again).

    The file is unlinked once mapped: the mapping keeps it until the array is dropped, and a killed
    process leaves nothing behind. It is written behind (``runtime.writeback.WriteBehind``): at most
    two pieces of it are dirty at a time, so a memory cgroup can drop what was written.
    """

    def __init__(self, folder, name):
        self.fd, self.path = new_temp_file(folder, f"bpe_core-spill-{os.getpid()}-engine-{name}-")
        self.out = WriteBehind(self.fd)

    def write(self, arr):
        """Append a contiguous array (in pieces: no copy of the whole)."""
        self.out.write(np.ascontiguousarray(arr))

    def mapped(self, dtype, nbytes):
        """Map what was written (``nbytes``, checked) read-only; the file is gone from the folder."""
        try:
            size = os.fstat(self.fd).st_size
            if size != nbytes:
                raise OSError(f"{self.path}: wrote {size} bytes, expected {nbytes}")
            self.out.finish()            # clean pages: reclaimable at once
            if nbytes == 0:
                return np.zeros(0, dtype=dtype)
            return np.memmap(self.path, dtype=dtype, mode="r")
        finally:
            self.discard()

    def discard(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            os.unlink(self.path)



class _SpillMap:
    """A read-only array filled in place: a file under ``folder`` of ``n`` items of ``dtype``,
    allocated at once and mapped shared and writable (``arr``), which the build writes through the
    mapping: no buffer in RAM copied to the file, no anonymous memory for it (the mapping's pages are
    the page cache's). A full disk fails at the allocation (an ``OSError`` naming nothing: the caller
    names the folder), not at a later page fault.

    The caller says which bytes are written (``written``): their writeback starts then, as
    ``_SpillFile`` writes behind, and ``clean`` waits until everything written is on disk (its pages
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
            else:
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
        """The array, clean; the file is gone from the folder."""
        try:
            self.out.finish()
            arr, self.arr = self.arr, None
            return arr
        finally:
            self.discard()

    def discard(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            os.unlink(self.path)
