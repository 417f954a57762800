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

