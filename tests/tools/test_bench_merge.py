"""``benchmarks/bench_merge.py``: the merge phase of a table counted as training counts it, run in a
fresh process, gives training's merges (no timing is asserted: speed belongs to the benchmark), and a
missing corpus is one line, exit 2."""
import json
import subprocess
import sys

from paths import BENCHMARKS, FIXTURES

from bpe_core import train_bpe


def test_the_merges_are_training_s(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_bytes((FIXTURES / "corpus.en").read_bytes()[:200_000])
    work = tmp_path / "work"
    r = subprocess.run([sys.executable, str(BENCHMARKS / "bench_merge.py"), str(corpus), "--work", str(work),
                        "--vocab-size", "400"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "merges identical: yes" in r.stdout and "| 1 |" in r.stdout
    settings = json.loads((work / "settings.json").read_text())
    assert settings["vocab_size"] == 400
    child = subprocess.run([sys.executable, str(BENCHMARKS / "bench_merge.py"), str(corpus), "--work", str(work),
                            "--child"], capture_output=True, text=True)
    merges = json.loads(child.stdout.strip().splitlines()[-1])["merges"]
    assert merges == len(train_bpe(str(corpus), 400, ["<|endoftext|>"])[1])


def test_a_missing_corpus_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, str(BENCHMARKS / "bench_merge.py"), str(tmp_path / "none.txt"), "--work",
                        str(tmp_path / "w")], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "none.txt" in r.stderr
