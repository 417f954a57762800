"""``runtime.writeback.WriteBehind``: the bytes written are the bytes given, in any pieces and
windows, with ``sync_file_range`` and with the ``fdatasync`` fallback; and its dirty pages stay
bounded (a file written through it leaves at most two windows dirty at a time)."""
from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bpe_core.runtime import writeback
from bpe_core.runtime.writeback import WriteBehind


@settings(max_examples=40, deadline=None)
@given(pieces=st.lists(st.binary(max_size=300), max_size=12), window=st.integers(1, 257),
       fallback=st.booleans(), head=st.binary(max_size=20))
def test_the_file_holds_exactly_what_was_written(pieces, window, fallback, head):
    """A file with a head written before (the npy header) then the pieces through WriteBehind."""
    saved = writeback._SYNC_FILE_RANGE
    if fallback:
        writeback._SYNC_FILE_RANGE = None
    fd, path = tempfile.mkstemp()
    try:
        os.write(fd, head)
        out = WriteBehind(fd, window=window)
        for p in pieces:
            out.write(p)
        out.finish()
        assert out.written == sum(map(len, pieces))
        assert open(path, "rb").read() == head + b"".join(pieces)
    finally:
        writeback._SYNC_FILE_RANGE = saved
        os.close(fd)
        os.unlink(path)


def test_writeback_is_started_and_waited_for_as_it_goes(monkeypatch):
    """Each full window's writeback starts when it is written; the one before is waited for."""
    calls = []
    monkeypatch.setattr(writeback, "_SYNC_FILE_RANGE", lambda fd, off, n, flags: calls.append((off, n, flags)) or 0)
    fd, path = tempfile.mkstemp()
    try:
        out = WriteBehind(fd, window=10)
        out.write(b"x" * 35)
        wait = writeback._SYNC_WAIT_BEFORE | writeback._SYNC_WRITE | writeback._SYNC_WAIT_AFTER
        assert calls == [(0, 10, writeback._SYNC_WRITE), (0, 10, wait), (10, 10, writeback._SYNC_WRITE),
                         (10, 10, wait), (20, 10, writeback._SYNC_WRITE)]
    finally:
        os.close(fd)
        os.unlink(path)


@pytest.mark.skipif(writeback._SYNC_FILE_RANGE is None, reason="no sync_file_range here")
def test_few_pages_stay_dirty(tmp_path):
    """64 MiB written through 4 MiB windows: after each write, at most two windows of the file are
    dirty or under writeback (``/proc/self/...`` does not say per file: ``mincore`` cannot either, so
    this checks the writer's own bookkeeping against what it wrote)."""
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    try:
        out = WriteBehind(fd, window=4 << 20)
        for _ in range(16):
            out.write(bytes(4 << 20))
            assert out.written - out._waited <= 2 * out.window
        out.finish()
        assert out._waited == out.written == 64 << 20
    finally:
        os.close(fd)
