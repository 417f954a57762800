"""Native pre-tokenizer: the GPT-2, cl100k and o200k split patterns, hand-compiled over UTF-8 bytes.

The truth is ``regex``: for ``text = data.decode("utf-8", "surrogateescape")`` the pretokens are
``[m.group().encode("utf-8", "surrogateescape") for m in regex.finditer(pattern, text)]``. The
scanners here give byte-identical pieces without decoding to ``str``:

- A character is one valid UTF-8 sequence (Python's strict rules: no overlongs, no encoded
  surrogates, nothing above U+10FFFF), or else one byte, which ``surrogateescape`` turns into
  U+DC80..U+DCFF: a lone surrogate, "other" to every class.
- Its classes (``\\p{L}``, ``\\p{N}``, ``\\s``, o200k's case classes, and what ``(?i:s)`` etc.
  match) come from ``_unicode_tables.h``, probed from ``regex`` by ``scripts/gen_unicode_tables.py``.
- Each ``_end_<pattern>`` tries the alternatives of its pattern in order, reproducing the
  backtracking that matters (a whitespace run gives its last character back to ``(?!\\S)``; o200k's
  ``[U]*[W]+`` ends at the last W of the U-run), so each character is looked at a bounded number of
  times: linear time on any input.

Only ``pretokenize.py`` imports this module; the Python functions below check inputs and release
the GIL around the ``noexcept nogil`` cores declared in ``_pretok.pxd``.
"""
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memchr, memcmp, memcpy, memmove, memset
from libcpp.algorithm cimport sort
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.ref cimport PyObject, Py_INCREF, Py_XDECREF
from cpython cimport array

import array as _array

from bpe_core.runtime.lazy import np  # numpy on first use (a small run never imports it)

# Templates of the ``array.array`` outputs (``numpy=False``): uint8, int64.
cdef array.array _U8 = _array.array("B")
cdef array.array _I64 = _array.array("q")


# The parts of this module, in order (``include``: one compiled module, every cdef function inlined
# as before; each part's first lines say its job):
include "_pretok_layout.pxi"     # C declarations: Unicode tables, ASCII windows, front cache, helpers
include "_pretok_chars.pxi"      # characters and runs of a class
include "_pretok_scanners.pxi"   # the scanners of each pattern; the split driver
include "_pretok_table.pxi"      # counting: hashing, the count table
include "_pretok_counter.pxi"    # counting: the plain counter (front cache, short/long tables)
include "_pretok_record.pxi"     # counting: record mode (entry number of every pretoken)
include "_pretok_sort.pxi"       # sorting words by bytes; a counter's words as arrays
include "_pretok_split.pxi"      # entry points: split_ends, split_pieces, special tokens
include "_pretok_count.pxi"      # entry points: count_pretokens and its outputs
include "_pretok_merge.pxi"      # merge_counts: merging sorted count tables
include "_pretok_words.pxi"      # per-word character facts (SuperBPE stage-2 units)
