"""``benchmarks/bench_peers.py``: the wiring of a trained model folder into every row, cold and warm,
one process per library and work (no timing is asserted: speed belongs to the benchmark), the ids
check and the reference ids."""
import importlib.util
import json
import random
import signal
import subprocess
import sys

import pytest

from paths import BENCHMARKS, TOOLS, package_parent

sys.path.insert(0, str(TOOLS))
sys.path.insert(0, str(BENCHMARKS))
import bench_peers  # noqa: E402
import train_bpe  # noqa: E402

from bpe_core.formats import load_model  # noqa: E402
from bpe_core import reference  # noqa: E402

EOT = "<|endoftext|>"
TEXT = EOT.join([
    "The cat sat on the mat.  It's 2024, isn't it?\n\n",
    "def f(x):\n    return x ** 2  # squares\n\tdone\x0c\n",
    "Ünïcödé wörds, 日本語のテキスト, and  spaces   here.\n",
    "numbers 1234567 and 12 and 3.14159; the end\n",
] * 20)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(a trained model folder, a corpora folder holding ``tiny.txt``)."""
    root = tmp_path_factory.mktemp("bench_peers")
    corpora = root / "corpora"
    corpora.mkdir()
    (corpora / "tiny.txt").write_text(TEXT, encoding="utf-8")
    model = root / "model"
    assert train_bpe.main([str(corpora / "tiny.txt"), "--vocab-size", "400", "--out", str(model),
                           "--no-progress"]) == 0
    return model, corpora


def test_reference_ids_equal_the_reference_encoder(folders):
    """The memoized, merge-filtered twin equals ``reference.encode`` (the model's text, random bytes)."""
    model = load_model(folders[0])
    ref = bench_peers.ReferenceIds(model, max_substrings=8)      # long pretokens take the whole list
    rng = random.Random(28)
    alphabet = "ab c\n\t1é日" + EOT
    texts = [TEXT[:3000], "".join(rng.choice(alphabet) for _ in range(2000)),
             bytes(rng.randrange(256) for _ in range(500)).decode("utf-8", "surrogateescape")]
    for text in texts:
        want = reference.encode(text, model.vocab, model.merges, model.special_tokens, model.pattern)
        assert ref.encode(text) == want
        assert ref.encode_batch([text, text[:100]]) == [want, ref.encode(text[:100])]


def test_trained_vocab_runs_every_row_with_ids_checked(folders, tmp_path, capsys):
    model, corpora = folders
    out = tmp_path / "res.json"
    peers = ["tiktoken", "tokenizers", "bpe_openai", "no_such_peer"]
    assert bench_peers.main(["--vocab", f"trained:{model}", "--corpus", "tiny", "--corpora", str(corpora),
                             "--mb", "1", "--runs", "1", "--warm", "1", "--peers", *peers, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "bpe_openai skipped (ships cl100k/o200k only" in printed
    assert "no_such_peer skipped (not installed)" in printed
    assert "no_such_peer (not installed)" in printed.splitlines()[1]     # the versions line
    assert printed.splitlines()[1].startswith("# versions: bpe_core ")
    assert "ids identical to bpe_core.reference on every document: bpe_core yes" in printed
    [res] = json.loads(out.read_text())
    assert res["vocab"] == f"trained:{model}" and res["corpus"] == "tiny"
    ours = {k.split(" / ")[0]: v for k, v in res["same"].items() if k.endswith(" / bpe_core")}
    assert set(ours) == set(bench_peers.WORKS) and all(ours.values()), ours
    for work in bench_peers.WORKS:                # every row of ours, cold and warm, in both tables
        for phase in bench_peers.PHASES:
            assert f"| {work}, {phase} | " in printed
            assert res["cpu"][f"{work} / bpe_core / {phase}"] > 0 and res["wall"][f"{work} / bpe_core / {phase}"] > 0
    for peer in ("tiktoken", "tokenizers"):      # loaded from our exports, and exact on this text
        if importlib.util.find_spec(peer):
            theirs = [v for k, v in res["same"].items() if k.endswith(" / " + peer)]
            assert theirs and all(theirs), res["same"]


def test_the_ids_check_catches_any_difference():
    """``check``: the reference ids of the whole text and of every document, in each work's shape;
    one id changed, one document moved across a boundary or one missing is a difference."""
    import numpy as np

    docs = [[1, 2, 3], [], [4, 5]]
    want = {"text": np.array([1, 2, 3, 9, 4, 5]), "docs": np.array([1, 2, 3, 4, 5]),
            "offsets": np.array([0, 3, 3, 5]), "decoded": "abc"}
    assert bench_peers.check("list", [1, 2, 3, 9, 4, 5], want) and bench_peers.check("array", np.array([1, 2, 3, 9, 4, 5], np.uint32), want)
    assert not bench_peers.check("list", [1, 2, 3, 9, 4, 6], want) and not bench_peers.check("list", [1, 2, 3, 9, 4], want)
    assert bench_peers.check("batch", docs, want)
    assert not bench_peers.check("batch", [[1, 2], [3], [4, 5]], want) and not bench_peers.check("batch", docs[:2], want)
    assert bench_peers.check("flat", (np.array([1, 2, 3, 4, 5], np.uint32), np.array([0, 3, 3, 5], np.uint64)), want)
    assert not bench_peers.check("flat", (np.array([1, 2, 3, 4, 5], np.uint32), np.array([0, 2, 3, 5])), want)
    assert bench_peers.check("decode", "abc", want) and not bench_peers.check("decode", "abd", want)


def test_trained_vocab_needs_a_model_folder(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        bench_peers.main(["--vocab", f"trained:{tmp_path}"])
    assert exc.value.code == 2 and "not a model folder" in capsys.readouterr().err


def test_ctrl_c_is_one_line_and_exit_130(folders):
    """A Ctrl-C while the benchmark runs: one line on stderr, exit 130, no traceback (every bench_*
    script ends with ``_start.run_bench``). Run by path with the package this test imported
    (the script puts its own checkout first, which a clean clone has not built)."""
    model, corpora = folders
    script = str(BENCHMARKS / "bench_peers.py")
    argv = [script, "--vocab", f"trained:{model}", "--corpus", "tiny", "--corpora", str(corpora),
            "--runs", "1000000", "--peers", "none"]
    code = (f"import sys, runpy; sys.path.insert(0, {package_parent()!r}); import bpe_core; "
            f"sys.argv = {argv!r}; runpy.run_path({script!r}, run_name='__main__')")
    proc = subprocess.Popen([sys.executable, "-u", "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()              # printed by main(): the run is under way
        assert first.startswith("# bench_peers:"), (first, proc.stderr.read())
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130 and err == "bench_peers.py: interrupted\n", (proc.returncode, err)


def test_importing_it_leaves_sys_path_alone():
    """Imported (as here), the script must not put its checkout first on ``sys.path``: Dask's spawned
    workers take the parent's path, and in a fresh clone that checkout is unbuilt source (a later
    cluster test in the same pytest worker then waited for ever on tasks that never came back)."""
    before = list(sys.path)
    importlib.reload(bench_peers)
    assert sys.path == before


def test_the_byte_level_forms_of_the_hf_json(folders, tmp_path):
    """A GPT-2-pattern model's tokenizer.json is given to the HF peers with ByteLevel's own regex (the
    same pretokens, the form fastokens scans natively); another pattern keeps its file. The byte
    alphabet of the cl100k file is GPT-2's (the one HF's ByteLevel reads)."""
    src = folders[0] / "tokenizer.json"
    got = bench_peers.byte_level_form(str(src), load_model(folders[0]).pattern, str(tmp_path / "b.json"))
    doc = json.loads(open(got, encoding="utf-8").read())
    assert doc["pre_tokenizer"] == {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                    "use_regex": True}
    assert doc["model"] == json.loads(src.read_text(encoding="utf-8"))["model"]
    assert bench_peers.byte_level_form(str(src), "cl100k", str(tmp_path / "c.json")) == str(src)
    assert len(set(bench_peers.BYTE_CHARS)) == 256
    if importlib.util.find_spec("tokenizers"):
        from tokenizers import pre_tokenizers

        assert set(bench_peers.BYTE_CHARS) == set(pre_tokenizers.ByteLevel.alphabet())
