"""Memory monitor, phase labels and the profiler, with real (small, short) processes.

No timing asserts: each check waits for a child to say it is ready, or samples explicitly.
"""
from paths import REPO
import doctest
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time

import pytest

import bpe_core
from bpe_core.runtime import memmon, profile
from bpe_core.runtime import budget as scheduler
from bpe_core.runtime.memmon import PHASE_FILE_ENV, MemoryMonitor, phase, read_phase_file, tree_rss

ROOT = REPO
sys.path.insert(0, str(ROOT / "tools"))
import profile_memory as cli  # noqa: E402

MiB = 1 << 20
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
# Children import the same bpe_core as the tests (installed, or this checkout).
PKG_PARENT = str(pathlib.Path(bpe_core.__file__).resolve().parents[1])

HOLD_50MB = ("import sys, time; b = bytearray(50 << 20); b[::4096] = b'x' * len(b[::4096]); "
             "print('ready', flush=True); sys.stdin.read()")


def child_env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = PKG_PARENT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


@pytest.fixture
def holder():
    """A child process holding 50 MiB until its stdin closes."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD_50MB], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "ready"
    yield proc
    proc.stdin.close()
    proc.wait(timeout=30)


# ==== tree_rss ==============================================================================


def test_tree_rss_counts_a_child(holder):
    assert tree_rss(holder.pid) >= 50 * MiB
    alone = psutil_rss(os.getpid())
    assert tree_rss() - alone >= 50 * MiB      # the child is in this process's tree


def psutil_rss(pid):
    import psutil

    return psutil.Process(pid).memory_info().rss


def test_tree_rss_of_a_missing_process_is_zero():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert tree_rss(proc.pid) == 0


def test_tree_rss_survives_children_exiting_while_sampled():
    procs = [subprocess.Popen([sys.executable, "-c", "pass"]) for _ in range(4)]
    values = []
    while any(p.poll() is None for p in procs):
        values.append(tree_rss())
    for p in procs:
        p.wait()
    values.append(tree_rss())
    assert all(v > 0 for v in values)


# ==== Phases ================================================================================


def test_phase_lines_in_order(tmp_path, monkeypatch):
    path = tmp_path / "phases.txt"
    monkeypatch.setenv(PHASE_FILE_ENV, str(path))
    phase("plan")
    phase("merge\nloop")          # one line per phase, whatever the name holds
    lines = path.read_text().splitlines()
    assert [line.split(" ", 1)[1].split("\t")[0] for line in lines] == ["plan", "merge loop"]
    times = [float(line.split(" ", 1)[0]) for line in lines]
    assert times == sorted(times)
    assert [name for _, name in read_phase_file(str(path))] == ["plan", "merge loop"]


def test_phase_from_another_process_lands_in_the_same_file(tmp_path):
    path = tmp_path / "phases.txt"
    code = "from bpe_core.runtime.memmon import phase; phase('pretokenize'); phase('write')"
    # cwd: not the checkout, whose unbuilt bpe_core/ would shadow the installed package for "-c"
    subprocess.run([sys.executable, "-c", code], env=child_env(**{PHASE_FILE_ENV: str(path)}), check=True,
                   cwd=tmp_path)
    assert [name for _, name in read_phase_file(str(path))] == ["pretokenize", "write"]


def test_phase_without_the_env_var_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(PHASE_FILE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    phase("plan")
    assert list(tmp_path.iterdir()) == []


# ==== MemoryMonitor =========================================================================


def test_monitor_records_peak_phases_and_guards_the_budget(holder, monkeypatch):
    monkeypatch.delenv(PHASE_FILE_ENV, raising=False)
    budget = tree_rss() + 200 * MiB
    with MemoryMonitor(interval=0.01, budget=budget) as mon:
        phase("hold")
        rss = mon.sample()
        assert rss >= 50 * MiB
        assert mon.headroom() <= budget - 50 * MiB
        assert mon.wait_below(rss + 100 * MiB, timeout=0)
        assert not mon.wait_below(1, timeout=0.05)
    assert not mon.running
    assert mon.peak >= rss and mon.samples
    assert mon.phase_name == "hold" and [n for _, n in mon.phases] == ["hold"]
    summary = mon.summary()
    assert summary["peak_by_phase"]["hold"] >= 50 * MiB
    json.dumps(summary)
    phase("after")                 # a stopped monitor no longer listens
    assert mon.phase_name == "hold"


def test_monitor_without_budget_has_no_headroom():
    with pytest.raises(ValueError):
        MemoryMonitor().headroom()
    with pytest.raises(ValueError):
        MemoryMonitor(interval=0)


def test_monitor_keeps_its_record_bounded():
    mon = MemoryMonitor(max_samples=10)
    for _ in range(25):
        mon.sample()
    assert len(mon.samples) <= 10 and mon.peak > 0


# ==== Profiler ==============================================================================

PHASED = ("import sys; from bpe_core.runtime.memmon import phase; phase('plan'); "
          "b = bytearray(20 << 20); phase('merge loop'); sys.exit(3)")


def test_profile_memory_cli_writes_json_and_png(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PYTHONPATH", child_env()["PYTHONPATH"])
    monkeypatch.chdir(tmp_path)          # the child's "-c" must not see the checkout's bpe_core/
    prefix = tmp_path / "run"
    code = cli.main(["--interval", "0.02", "--budget", "1G", "--out", str(prefix), "--",
                     sys.executable, "-c", PHASED])
    assert code == 3                              # the command's exit code
    data = json.loads((tmp_path / "run.json").read_text())
    assert data["exit_code"] == 3
    assert data["command"][-1] == PHASED
    assert data["budget_bytes"] == 1 << 30 and data["over_budget"] is False
    # the peak is the largest sample or phase mark (a mark carries the RSS the child read itself)
    assert data["samples"] and data["peak_rss_bytes"] == max([r for _, r in data["samples"]] +
                                                             [p["peak_rss_bytes"] for p in data["phases"]])
    assert [p["name"] for p in data["phases"]] == ["plan", "merge loop"]
    for p in data["phases"]:
        assert 0 <= p["start"] <= p["end"] <= data["wall_seconds"]
    assert data["phases"][0]["end"] == data["phases"][1]["start"]
    names = sorted(p.name for p in tmp_path.iterdir())     # no temp files left behind
    if HAS_MATPLOTLIB:
        assert names == ["run.json", "run.png"]
        assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert names == ["run.json"]
        assert "pip install matplotlib" in capsys.readouterr().err


def test_without_matplotlib_the_json_is_written_and_stderr_says_how(tmp_path, monkeypatch, capsys):
    def no_matplotlib(*args, **kwargs):
        raise ImportError("No module named 'matplotlib'")

    monkeypatch.setattr(profile, "write_plot", no_matplotlib)
    r = profile.profile_command([sys.executable, "-c", "pass"], str(tmp_path / "p"), interval=0.05)
    assert r.exit_code == 0 and r.png_path is None
    assert (tmp_path / "p.json").exists() and not (tmp_path / "p.png").exists()
    assert "pip install matplotlib" in capsys.readouterr().err


def test_budget_defaults_to_the_commands_memory_limit(tmp_path):
    cmd = [sys.executable, "-c", "import sys", "--memory-limit", "300M"]
    r = profile.profile_command(cmd, str(tmp_path / "p"), plot=False, quiet=True)
    assert r.data["budget_bytes"] == 300 * MiB


@pytest.mark.parametrize("argv", [
    [],                                            # nothing at all
    ["--out", "x"],                                # no command
    ["--", sys.executable, "-c", "pass"],          # no --out
    ["--interval", "0", "--out", "x", "--", "true"],
    ["--interval", "fast", "--out", "x", "--", "true"],
    ["--budget", "lots", "--out", "x", "--", "true"],
    ["--out", "/no/such/folder/run", "--", "true"],
])
def test_bad_usage_is_one_line_and_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "error" in err


def test_a_command_that_cannot_start(tmp_path, capsys):
    code = cli.main(["--no-plot", "--out", str(tmp_path / "p"), "--", str(tmp_path / "no-such-program")])
    assert code == 127
    assert "cannot run" in capsys.readouterr().err


def test_split_flag_for_the_tools():
    assert profile.split_flag(["a", "--profile-memory", "out/p", "--x"]) == ("out/p", ["a", "--x"])
    assert profile.split_flag(["a", "--", "--profile-memory", "p"]) == (None, ["a", "--", "--profile-memory", "p"])


def test_docstring_examples(monkeypatch, tmp_path):
    monkeypatch.delenv(PHASE_FILE_ENV, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))       # the examples' mkdtemp() folders
    runner = doctest.DocTestRunner()
    for module in (memmon, profile):
        for test in doctest.DocTestFinder().find(module):
            runner.run(test)
    assert runner.failures == 0


# ---- huge pages: the rule on the kernel's texts, around its thresholds ------------------------

def _buddy(blocks_by_order):
    counts = [0] * 11
    for order, n in blocks_by_order.items():
        counts[order] = n
    return "Node 0, zone   Normal " + " ".join(map(str, counts)) + "\n"


@pytest.mark.parametrize("free_blocks, nbytes, expected", [
    (4, 4 << 20, True),              # 8 MiB free in 2 MiB blocks: twice 4 MiB
    (4, (4 << 20) + 1, False),       # one byte more than half the free blocks
    (3, 4 << 20, False),
    (0, 0, True),                    # nothing to place
])
def test_huge_pages_need_twice_the_bytes_in_free_2mib_blocks(free_blocks, nbytes, expected):
    from bpe_core.runtime.memmon import huge_pages_state
    info = _buddy({9: free_blocks}) + "Node 0, zone    DMA32 50 50 50 50 50 50 50 50 50 0 0\n"
    assert huge_pages_state("always [madvise] never", "always defer defer+madvise [madvise] never",
                            info, 2 << 20, nbytes, 4096) is expected


def test_huge_pages_count_larger_blocks_and_ignore_smaller_ones():
    from bpe_core.runtime.memmon import free_block_bytes
    info = _buddy({8: 1000, 9: 1, 10: 2})           # order 8 (1 MiB) blocks are too small
    assert free_block_bytes(info, 9, 4096) == (1 * 512 + 2 * 1024) * 4096


@pytest.mark.parametrize("enabled, defrag, expected", [
    ("always madvise [never]", "[madvise]", False),          # THP off: never
    ("always [madvise] never", "always defer defer+madvise madvise [never]", True),   # never compacts
    ("[always] madvise never", "always [defer] defer+madvise madvise never", True),
    ("always [madvise] never", "[always] defer defer+madvise madvise never", False),  # compacts, no blocks
    ("always [madvise] never", "always defer [defer+madvise] madvise never", False),
    ("", "", False),                                         # unreadable or unknown
])
def test_huge_pages_follow_the_thp_settings(enabled, defrag, expected):
    from bpe_core.runtime.memmon import huge_pages_state
    assert huge_pages_state(enabled, defrag, _buddy({}), 2 << 20, 1 << 20, 4096) is expected


def test_huge_pages_ready_is_false_where_the_files_cannot_be_read(monkeypatch):
    import bpe_core.runtime.memmon as memmon
    monkeypatch.setattr(memmon, "THP_DIR", "/nonexistent/thp")
    assert memmon.huge_pages_ready(1) is False


@pytest.mark.parametrize("reported, expected", [
    (None, True),       # nothing given back to a hypervisor: the 2 MiB and 4 MiB blocks count
    (9, False),         # every free 2 MiB block was given back: none counts, whatever defrag says
    (10, False),        # only the 2 MiB blocks count (1 of them: 2 MiB for 2 MiB asked, not twice)
    (11, True),         # the 2 and 4 MiB blocks count
])
def test_huge_pages_do_not_count_blocks_given_back_to_a_hypervisor(reported, expected):
    from bpe_core.runtime.memmon import huge_pages_state
    info = _buddy({9: 1, 10: 1})                    # 2 MiB + 4 MiB free
    assert huge_pages_state("always [madvise] never", "[madvise]", info, 2 << 20, 2 << 20, 4096,
                            reported=reported) is expected
    if reported == 9:
        assert huge_pages_state("always [madvise] never", "[defer]", info, 2 << 20, 1, 4096,
                                reported=reported) is False


def test_free_page_reporting_reads_the_balloon_features(tmp_path, monkeypatch):
    import bpe_core.runtime.memmon as memmon
    order = tmp_path / "page_reporting_order"
    balloon = tmp_path / "virtio_balloon"
    (balloon / "virtio0").mkdir(parents=True)
    (balloon / "bind").write_text("")                 # not a device: ignored
    features = balloon / "virtio0" / "features"
    monkeypatch.setattr(memmon, "PAGE_REPORTING_ORDER", str(order))
    monkeypatch.setattr(memmon, "BALLOON_DIR", str(balloon))
    assert memmon.free_page_reporting() is None       # no page reporting in the kernel
    order.write_text("9\n")
    features.write_text("0110000100000000\n")         # no bit 5: the balloon does not report
    assert memmon.free_page_reporting() is None
    features.write_text("0110010100000000\n")
    assert memmon.free_page_reporting() == 9
    monkeypatch.setattr(memmon, "BALLOON_DIR", str(tmp_path / "none"))
    assert memmon.free_page_reporting() is None       # no balloon driver


def test_a_monitor_without_its_thread_samples_at_start_stop_and_when_asked(monkeypatch):
    """``start(thread=False)`` (``encode_corpus`` on a small input): no sampling thread, the samples
    are the first, the caller's and the last; phases are still heard; stop ends it as with the thread."""
    monkeypatch.delenv(PHASE_FILE_ENV, raising=False)
    before = {t.name for t in threading.enumerate()}
    mon = MemoryMonitor(interval=0.001).start(thread=False)
    assert mon.running and {t.name for t in threading.enumerate()} == before
    time.sleep(0.03)                        # a thread would have taken ~30 samples by now
    phase("work")
    assert mon.sample() > 0
    mon.stop()
    assert not mon.running and len(mon.samples) == 3 and mon.phase_name == "work"
    assert mon.summary()["peak_by_phase"]["work"] > 0
    mon.stop()                              # a second stop is a no-op
    assert len(mon.samples) == 3
    again = MemoryMonitor().start(thread=False)
    with pytest.raises(RuntimeError):
        again.start()
    again.stop()


def test_stop_after_a_signal_ended_start_before_its_thread_ran(monkeypatch):
    """A SIGTERM inside ``Thread.start`` (seen: encode_corpus killed at 0.2 s on a loaded machine)
    leaves a thread object that never started; ``stop`` in the caller's cleanup must not raise
    "cannot join thread before it is started" over the run's one-line exit."""
    import threading

    from bpe_core.errors import Terminated
    from bpe_core.runtime import memmon

    def interrupted(self):
        raise Terminated()

    monkeypatch.setattr(threading.Thread, "start", interrupted)
    mon = memmon.MemoryMonitor()
    with pytest.raises(Terminated):
        mon.start()
    monkeypatch.undo()
    mon.stop()                                   # no RuntimeError
    assert mon._thread is None and mon.samples
