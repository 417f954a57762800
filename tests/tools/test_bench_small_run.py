"""``benchmarks/bench_train.py --small-run``: the max RSS it reports is the measured process's own (not the
benchmark's, which a forked child would inherit in ``ru_maxrss``), and a bad ``--against`` is one
line, exit 2."""
import subprocess
import sys

from paths import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))
import bench_train  # noqa: E402


def test_max_rss_is_the_command_s_own_not_the_benchmark_s():
    held = bytearray(300 << 20)         # this process holds 300 MB: a child it forks would report them
    held[::4096] = b"x" * len(held[::4096])
    wall, rss, code, err, cpu = bench_train.run_process([sys.executable, "-c", "pass"], {})
    assert code == 0 and 0 < rss < 100 << 20, (rss, err)
    wall, rss, code, err, cpu = bench_train.run_process(
        [sys.executable, "-c", "b = bytearray(120 << 20); b[::4096] = b'x' * len(b[::4096])"], {})
    assert code == 0 and rss >= 120 << 20 and wall > 0 and cpu > 0, (rss, err)
    del held


def test_a_bad_against_folder_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, str(BENCHMARKS / "bench_train.py"), "--small-run", "--against", str(tmp_path)],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and "no tools/train_bpe.py there" in r.stderr and "Traceback" not in r.stderr
