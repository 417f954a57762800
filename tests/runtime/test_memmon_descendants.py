"""``memmon._descendants`` (the process tree a memory sample sums, read from
``/proc/<pid>/task/<tid>/children``) finds what ``psutil``'s ``children(recursive=True)`` finds, and
falls back to it where the files cannot be read."""
import subprocess
import sys
import time

import psutil
import pytest

from bpe_core.runtime import memmon

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")


@pytest.fixture
def tree():
    """Two children of this process, each with a grandchild."""
    procs = [subprocess.Popen(["sh", "-c", "sleep 30 & wait"]) for _ in range(2)]
    me = psutil.Process()
    deadline = time.monotonic() + 10
    while len(me.children(recursive=True)) < 4 and time.monotonic() < deadline:
        time.sleep(0.02)
    yield me
    for p in procs:
        for kid in psutil.Process(p.pid).children(recursive=True):
            kid.kill()
        p.kill()
        p.wait()


def test_descendants_equal_psutil(tree):
    want = sorted(p.pid for p in tree.children(recursive=True))
    assert len(want) >= 4
    assert sorted(p.pid for p in memmon._descendants(tree)) == want
    assert memmon.tree_rss() >= psutil.Process().memory_info().rss


def test_descendants_fall_back_to_psutil(tree, monkeypatch):
    def refuse(path, *args, **kwargs):
        raise PermissionError(path)

    monkeypatch.setattr(memmon, "open", refuse, raising=False)        # the children files cannot be read
    assert sorted(p.pid for p in memmon._descendants(tree)) == sorted(p.pid for p in tree.children(recursive=True))


def test_a_process_that_is_gone_has_no_memory():
    p = subprocess.Popen(["true"])
    p.wait()
    assert memmon.tree_rss(p.pid) == 0
    assert memmon.tree_memory(p.pid) == {"rss": 0, "anon": 0, "file": 0}
