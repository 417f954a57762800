"""``benchmarks/bench_superbpe.py --corpus``: each model encodes the corpus file to ``.npy`` in a process of
its own, and the tokens it reports are the tokens of the file (the same as ``Tokenizer.encode`` of it)."""
import json
import subprocess
import sys

import pytest

from paths import BENCHMARKS, FIXTURES, package_parent

import bpe_core
from bpe_core.formats.model import dump_folder


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A small BPE and SuperBPE model trained on the TinyStories sample."""
    out = tmp_path_factory.mktemp("models")
    corpus = str(FIXTURES / "tinystories_sample.txt")
    folders = {}
    for method in ("bpe", "superbpe"):
        result = bpe_core.train(bpe_core.TrainConfig(corpus, 400, method=method, num_workers=1))
        folders[method] = out / method
        folders[method].mkdir()
        dump_folder(result.model, str(folders[method]))
    return folders


def test_corpus_mode_reports_each_model_s_tokens_of_the_file(models, tmp_path):
    text = "Once upon a time, a cat sat on the mat. It was happy.\n" * 40
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text, encoding="utf-8")
    out = tmp_path / "res.json"
    env = {"PYTHONPATH": package_parent()}
    r = subprocess.run([sys.executable, str(BENCHMARKS / "bench_superbpe.py"), "--bpe", str(models["bpe"]),
                        "--superbpe", str(models["superbpe"]), "--corpus", str(corpus), "--runs", "2",
                        "--corpus-workers", "1", "--json", str(out)],
                       capture_output=True, text=True, cwd=tmp_path, env={**__import__("os").environ, **env})
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())["corpus"]
    for method in ("bpe", "superbpe"):
        want = len(bpe_core.Tokenizer.load(str(models[method])).encode(text))
        assert res[method]["tokens"] == want, (method, res[method]["tokens"], want)
        assert len(res[method]["cpu_s"]) == 2 and all(c > 0 for c in res[method]["cpu_s"])
    assert res["bpe"]["ratio_cpu"] == 1.0 and res["superbpe"]["ratio_cpu"] > 0
    assert res["superbpe"]["tokens"] < res["bpe"]["tokens"]      # superwords: fewer tokens
    assert "| superbpe |" in r.stdout


def test_corpus_mode_without_models_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, str(BENCHMARKS / "bench_superbpe.py"), "--corpus", str(tmp_path / "x.txt")],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and "--corpus needs models" in r.stderr and "Traceback" not in r.stderr
