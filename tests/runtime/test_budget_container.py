"""The budget at the edges: the default sees the memory cgroup (v1, v2, nested, none), one size
parser, a budget above the machine and a measured peak above the budget each say so in one line,
and a folder link that loops is one short line. The cgroup test runs where a memory cgroup can be
made (root with cgroup v1, as on the bench machines; ``/work/shared/bench/in_cgroup.sh``)."""
import os
import subprocess
import sys
import tempfile
import warnings

import pytest

from bpe_core.errors import BudgetError, BudgetWarning, CorpusError
from bpe_core.runtime import budget, cgroup, memmon
from bpe_core.runtime.budget import parse_size, plan_encoding, plan_training
from bpe_core.runtime.cgroup import CgroupMemory, parse_cgroup_memory
from paths import REPO, package_parent

ROOT = str(REPO)
MiB = 1 << 20
GiB = 1 << 30


def _own_rss() -> int:
    """This process's RSS, which the planners count as the parent's overhead: a budget written as
    ``_own_rss() + X`` means the same in a fresh process and at the end of a long pytest run."""
    import psutil

    return psutil.Process().memory_info().rss

V1_MOUNTS = ("31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
             "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
             "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n")
V2_MOUNT = "30 1 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


# ==== the cgroup reader (fake /proc and /sys files) ==========================================


def test_v1_limit_usage_and_page_cache():
    files = {"/sys/fs/cgroup/memory/job/memory.limit_in_bytes": "157286400\n",
             "/sys/fs/cgroup/memory/job/memory.usage_in_bytes": str(60 * MiB),
             "/sys/fs/cgroup/memory/job/memory.stat": f"cache 1\ntotal_inactive_file {20 * MiB}\n"
                                                       f"total_active_file {10 * MiB}\n"}
    cg = parse_cgroup_memory("4:memory:/job\n0::/\n", V1_MOUNTS, files.get)
    assert (cg.limit, cg.usage, cg.file_bytes, cg.version) == (150 * MiB, 60 * MiB, 30 * MiB, 1)
    assert cg.path == "/sys/fs/cgroup/memory/job"
    assert cg.room(own_bytes=10 * MiB) == 130 * MiB        # others hold 60 - 30 - 10 = 20 MiB
    assert cg.room(own_bytes=100 * MiB) == 150 * MiB       # never more than the limit


def test_v2_max_means_no_limit_and_huge_v1_value_too():
    assert parse_cgroup_memory("0::/job\n", V2_MOUNT, {"/sys/fs/cgroup/job/memory.max": "max\n"}.get) is None
    assert parse_cgroup_memory("4:memory:/\n", V1_MOUNTS,
                               {"/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712"}.get) is None
    assert parse_cgroup_memory("", "", {}.get) is None                    # not Linux, no cgroups
    assert parse_cgroup_memory("0::/job\n", V2_MOUNT, {}.get) is None       # files unreadable


def test_nested_the_tightest_ancestor_binds():
    files = {"/sys/fs/cgroup/slice/memory.max": str(100 * MiB),
             "/sys/fs/cgroup/slice/memory.current": str(40 * MiB),
             "/sys/fs/cgroup/slice/job/memory.max": str(1 * GiB),
             "/sys/fs/cgroup/slice/job/memory.current": str(5 * MiB),
             "/sys/fs/cgroup/slice/job/step/memory.max": "max"}
    cg = parse_cgroup_memory("0::/slice/job/step\n", V2_MOUNT, files.get)
    assert (cg.limit, cg.path, cg.version) == (100 * MiB, "/sys/fs/cgroup/slice", 2)
    assert cg.room() == 60 * MiB


def test_v1_and_v2_together_the_smaller_room_wins():
    files = {"/sys/fs/cgroup/memory/a/memory.limit_in_bytes": str(300 * MiB),
             "/sys/fs/cgroup/unified/b/memory.max": str(200 * MiB)}
    cg = parse_cgroup_memory("4:memory:/a\n0::/b\n", V1_MOUNTS, files.get)
    assert (cg.limit, cg.version) == (200 * MiB, 2)


def test_namespaced_mount_root_and_escaped_mount_point():
    # a container: the mount's root is the container's group; /proc/self/cgroup shows it (or "/")
    mi = "50 40 0:40 /docker/abc /sys/fs/cgroup/my\\040mem rw - cgroup cgroup rw,memory\n"
    files = {"/sys/fs/cgroup/my mem/memory.limit_in_bytes": str(512 * MiB)}
    for line in ("4:memory:/docker/abc\n", "4:memory:/\n"):
        cg = parse_cgroup_memory(line, mi, files.get)
        assert (cg.limit, cg.path) == (512 * MiB, "/sys/fs/cgroup/my mem")


def test_real_reader_never_fails():
    cg = cgroup.cgroup_memory()
    assert cg is None or (cg.limit > 0 and cg.limit < cgroup.UNLIMITED)


# ==== the default budget =====================================================================


def fake_cgroup(monkeypatch, limit, usage=0, file_bytes=0):
    cg = CgroupMemory(limit, usage, file_bytes, "/sys/fs/cgroup/job", 2)
    monkeypatch.setattr(cgroup, "cgroup_memory", lambda own_bytes=0: cg)
    return cg


def test_default_is_the_smallest_of_ram_cgroup_and_8g(monkeypatch):
    cg = CgroupMemory(150 * MiB, 0, 0, "/sys/fs/cgroup/job", 1)
    assert budget.default_budget(64 * GiB, cg, 0)[:2] == (120 * MiB, "cgroup")
    assert budget.default_budget(100 * MiB, cg, 0)[:2] == (80 * MiB, "RAM")
    assert budget.default_budget(64 * GiB, None, 0)[:2] == (8 * GiB, "default")
    # others in the group hold 50 MiB (usage less page cache less this process)
    busy = CgroupMemory(150 * MiB, 90 * MiB, 20 * MiB, "/sys/fs/cgroup/job", 1)
    assert budget.default_budget(64 * GiB, busy, 20 * MiB)[0] == int(0.8 * 100 * MiB)
    fake_cgroup(monkeypatch, 150 * MiB)
    assert budget.default_memory_limit(64 * GiB) == 120 * MiB


def test_plans_name_the_source_and_a_refusal_names_the_cgroup(monkeypatch):
    fake_cgroup(monkeypatch, 1 * GiB)
    p = plan_training(100 * MiB, None, 2, 64 * GiB, per_worker_overhead=8 * MiB, parent_overhead=60 * MiB,
                      vocab_size=8000)
    assert (p.memory_limit, p.budget_source) == (int(0.8 * GiB), "cgroup")
    assert "memory cgroup /sys/fs/cgroup/job" in p.describe().splitlines()[0]
    assert p.to_dict()["budget_source"] == "cgroup"
    # the plan made again with the real count keeps the source
    assert p.with_count(100_000).budget_source == "cgroup"
    e = plan_encoding(10 * MiB, 8000, None, 2, 64 * GiB, per_worker_overhead=8 * MiB, parent_overhead=60 * MiB)
    assert e.budget_source == "cgroup"
    assert plan_training(100 * MiB, 1 * GiB, 2, 64 * GiB, per_worker_overhead=8 * MiB,
                         parent_overhead=60 * MiB).budget_source == "flag"
    fake_cgroup(monkeypatch, 100 * MiB)
    with pytest.raises(BudgetError) as exc:
        plan_training(200 * MiB, None, 2, 64 * GiB, per_worker_overhead=8 * MiB, parent_overhead=60 * MiB,
                      vocab_size=32000)
    msg = str(exc.value)
    assert "\n" not in msg and "memory cgroup" in msg and "--memory-limit" in msg
    assert exc.value.min_budget > 80 * MiB
    assert msg.endswith("above the 100.0 MiB limit of memory cgroup /sys/fs/cgroup/job: give the job more memory")


# ==== one size parser ========================================================================


@pytest.mark.parametrize("text,value", [("8G", 8 * GiB), ("500M", 500 * MiB), ("1.5GB", 3 * GiB // 2),
                                        ("2GiB", 2 * GiB), ("4096", 4096), ("1P", 1 << 50), ("8E", 1 << 63),
                                        (" 3 m ", 3 * MiB), ("0", 0)])
def test_parse_size_accepts(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text,words", [("-1G", "must be positive"), ("٣G", "ASCII digits"),
                                        ("１G", "ASCII digits"), ("9999999999999999999999G", "too large"),
                                        ("9E", "too large"), ("1Z", "cannot parse"), ("1e3", "cannot parse"),
                                        ("", "cannot parse")])
def test_parse_size_refuses_in_one_line(text, words):
    with pytest.raises(ValueError) as exc:
        parse_size(text)
    assert words in str(exc.value) and "\n" not in str(exc.value)


def run_tool(*args, env=None, timeout=120):
    """``python ARGS`` (``tools/...`` paths made absolute) from a folder outside the checkout, with the
    package this test imported: never the unbuilt source folder of a clean clone."""
    args = [os.path.join(ROOT, a) if isinstance(a, str) and a.startswith("tools/") else a for a in args]
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=tempfile.gettempdir(),
                          env=dict(os.environ, PYTHONPATH=package_parent(), **(env or {})), timeout=timeout)


@pytest.mark.parametrize("value,words", [("-1G", "must be positive"), ("٣G", "ASCII digits"),
                                         ("9999999999999999999999G", "too large"), ("0", "must be positive")])
def test_tool_memory_limit_refusals_are_one_line(tmp_path, value, words):
    corpus = tmp_path / "c.txt"
    corpus.write_text("hello world " * 50)
    for tool in ("tools/train_bpe.py", "tools/encode_corpus.py"):
        extra = ["--vocab-size", "300", "--out", str(tmp_path / "o")] if "train" in tool else \
            ["--tokenizer", str(tmp_path / "none"), "--out", str(tmp_path / "ids.npy")]
        r = run_tool(tool, str(corpus), *extra, "--memory-limit", value)
        assert r.returncode == 2, (tool, r.stderr)
        assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1, (tool, r.stderr)
        assert "expected one argument" not in r.stderr


# ==== a budget above the machine: one warning line on every run ===============================


def test_over_machine_words():
    assert budget.over_machine(1 << 40, None, 23 * GiB).startswith("--memory-limit 1.0 TiB is above this "
                                                                   "machine's 23.0 GiB of RAM")
    assert "memory cgroup /sys/fs/cgroup/job" in budget.over_machine(
        2 * GiB, CgroupMemory(1 * GiB, 0, 0, "/sys/fs/cgroup/job", 2), 23 * GiB)
    assert budget.over_machine(1 * GiB, None, 23 * GiB) is None


def test_train_run_warns_when_budget_above_machine(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("hello world, the low lower lowest " * 200)
    r = run_tool("tools/train_bpe.py", str(corpus), "--vocab-size", "300", "--out", str(tmp_path / "o"),
                 "--memory-limit", "1E", "--no-progress")
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if "above" in line]
    assert len(lines) == 1 and lines[0].startswith("train_bpe.py: warning: --memory-limit "), r.stderr
    assert "of RAM" in lines[0] or "memory cgroup" in lines[0]


# ==== a measured peak above the budget: one warning line and a report field ===================


def test_monitor_summary_says_budget_exceeded(monkeypatch):
    monkeypatch.setattr(memmon, "tree_memory", lambda pid=None: {"rss": 300 * MiB, "anon": 250 * MiB,
                                                                 "file": 50 * MiB})
    mon = memmon.MemoryMonitor(budget=200 * MiB)
    mon.sample()
    s = mon.summary()
    assert s["budget_exceeded"] is True and s["budget_excess_bytes"] == 50 * MiB
    under = memmon.MemoryMonitor(budget=400 * MiB)
    under.sample()
    assert under.summary()["budget_exceeded"] is False
    assert memmon.MemoryMonitor().summary()["budget_exceeded"] is False       # no budget


def test_training_over_its_budget_warns_and_reports(tmp_path, monkeypatch):
    from bpe_core.config import TrainConfig
    from bpe_core.training import train

    corpus = tmp_path / "c.txt"
    corpus.write_text("hello world, the low lower lowest " * 200)
    real = memmon.tree_memory

    def inflated(pid=None):                      # every sample reads 1 GiB more anonymous memory
        m = dict(real(pid))
        m["anon"] += GiB
        m["rss"] += GiB
        return m

    monkeypatch.setattr(memmon, "tree_memory", inflated)
    limit = _own_rss() + 512 * MiB                  # the plan counts this process (pytest's RSS grows)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = train(TrainConfig(input_path=str(corpus), vocab_size=300, memory_limit=limit,
                                   progress=False))
    mem = result.report["memory"]
    assert mem["budget_exceeded"] is True and mem["peak_anon_bytes"] > mem["budget_bytes"] == limit
    over = [w for w in seen if issubclass(w.category, BudgetWarning)]
    assert len(over) == 1 and "budget was exceeded" in str(over[0].message)
    peak_phase = max(mem["peak_anon_by_phase"].items(), key=lambda kv: kv[1])[0]
    assert f"at its peak ({peak_phase})" in str(over[0].message) and len(peak_phase) > 1
    assert "\n" not in str(over[0].message)


def test_training_within_its_budget_is_silent(tmp_path):
    from bpe_core.config import TrainConfig
    from bpe_core.training import train

    corpus = tmp_path / "c.txt"
    corpus.write_text("hello world, the low lower lowest " * 200)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = train(TrainConfig(input_path=str(corpus), vocab_size=300, memory_limit=4 * GiB, progress=False))
    assert result.report["memory"]["budget_exceeded"] is False
    assert not [w for w in seen if issubclass(w.category, BudgetWarning)]


# ==== a symbolic link loop: one short line ===================================================


def test_folder_link_loop_is_one_short_line(tmp_path):
    from bpe_core.corpus.inputs import expand_inputs

    d = tmp_path / "d"
    d.mkdir()
    (d / "a.txt").write_text("hello")
    os.symlink("../d", d / "self")
    with pytest.raises(CorpusError) as exc:
        expand_inputs(str(d))
    assert str(exc.value) == f"{d / 'self'}: a symbolic link loop (it leads back to a folder above it)"
    # a link to a folder beside it is no loop
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "b.txt").write_text("world")
    os.unlink(d / "self")
    os.symlink("../e", d / "other")
    assert len(expand_inputs(str(d))) == 2


# ==== in a real memory cgroup (root, cgroup v1) ==============================================

CGROUP_V1 = "/sys/fs/cgroup/memory"


def _can_make_cgroup() -> str:
    if not sys.platform.startswith("linux"):
        return "not Linux"
    if not os.path.isdir(CGROUP_V1) or not os.access(CGROUP_V1, os.W_OK):
        return "no writable cgroup v1 memory hierarchy (needs root and cgroup v1)"
    return ""


@pytest.mark.skipif(bool(_can_make_cgroup()), reason=_can_make_cgroup() or "ok")
def test_in_a_real_cgroup_the_default_budget_is_the_cgroups(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("hello world, the low lower lowest " * 200)
    cg = os.path.join(CGROUP_V1, f"bpe_test_{os.getpid()}")
    os.mkdir(cg)
    try:
        with open(os.path.join(cg, "memory.limit_in_bytes"), "w") as f:
            f.write(str(400 * MiB))
        code = ("import os, sys; open(sys.argv[1] + '/cgroup.procs', 'w').write(str(os.getpid())); "
                "os.execv(sys.executable, [sys.executable] + sys.argv[2:])")
        r = run_tool("-c", code, cg, "tools/train_bpe.py", str(corpus), "--vocab-size", "300", "--plan")
        assert r.returncode == 0, r.stderr
        first = r.stdout.splitlines()[0]
        assert f"memory cgroup {cg}" in first and "limit 400.0 MiB" in first, first
    finally:
        os.rmdir(cg)


# ==== counting gives the worker threads' freed tables back after each chunk ==================


def test_counting_returns_freed_memory_after_each_chunk(tmp_path, monkeypatch):
    """The tables folded while counting were made on worker threads, in their heap arenas; without a
    trim after each chunk their pages stayed resident and the anonymous peak of a 1 GB synthetic
    corpus at a 300M budget was 335 MiB (224 MiB with it; docs/memory.md)."""
    from bpe_core.pretok import counting

    corpus = tmp_path / "c.txt"
    corpus.write_bytes(b"".join(b"word%d and more words %d\n" % (i, i % 97) for i in range(20000)))
    calls = []
    monkeypatch.setattr(counting, "release_free_memory", lambda: calls.append(1))
    rep = {"seconds": {}}
    table = counting.count_corpus(str(corpus), [], "gpt2", 2, 64 << 10, report=rep)
    assert table.n_words > 20000 and rep["n_chunks"] > 4
    assert len(calls) >= rep["n_chunks"]


def test_profile_report_compares_the_anonymous_peak(tmp_path):
    from bpe_core.runtime.profile import profile_command

    cmd = [sys.executable, "-c", "x = bytearray(48 << 20); x[::4096] = b'1' * len(x[::4096]); "
                                 "import time; time.sleep(0.3)"]
    over = profile_command(cmd, str(tmp_path / "over"), interval=0.02, budget=16 * MiB, plot=False, quiet=True)
    assert over.data["budget_exceeded"] is True and over.data["peak_anon_bytes"] > 16 * MiB
    under = profile_command(cmd, str(tmp_path / "under"), interval=0.02, budget=4 * GiB, plot=False, quiet=True)
    assert under.data["budget_exceeded"] is False


def test_encoding_over_its_budget_warns_and_reports(tmp_path, monkeypatch):
    from bpe_core.encode.encode_corpus import encode_corpus
    from bpe_core.encode.tokenizer import Tokenizer
    from encode_helpers import EOT, small_model

    corpus = tmp_path / "c.txt"
    corpus.write_text("hello world, the low lower lowest " * 200)
    tok = Tokenizer(*small_model()[:2], [EOT])
    real = memmon.tree_memory
    monkeypatch.setattr(memmon, "tree_memory", lambda pid=None: dict(real(pid), anon=real(pid)["anon"] + GiB))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = encode_corpus(str(corpus), tok, str(tmp_path / "ids.npy"), memory_limit=_own_rss() + 512 * MiB,
                               progress=False)
    assert result.memory["budget_exceeded"] is True
    over = [w for w in seen if issubclass(w.category, BudgetWarning)]
    assert len(over) == 1 and str(over[0].message).startswith("encoding held ")
