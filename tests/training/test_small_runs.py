"""Fixed costs are paid only when needed: ``import bpe_core`` imports neither the trainer, the encoder
nor any heavy optional module, and a small plain-BPE run (API or CLI) imports only what it uses
(no SuperBPE/SupraTok modules, no encoder, no psutil, regex, OpenSSL, thread pool, Dask, Arrow,
tqdm...). Each check runs in a fresh child process outside the checkout with this test process's
package (``paths.package_parent``). The registry still names every method, and imports one when it
is first asked for."""
import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from bpe_core import TrainConfig
from bpe_core.formats import registry
from bpe_core.training import train
from paths import FIXTURES, TOOLS, package_parent
from strategies import corpus_bytes

#: never imported by ``import bpe_core`` (top-level names of third-party and heavy stdlib modules)
HEAVY = {"psutil", "regex", "tqdm", "transformers", "tokenizers", "tiktoken", "dask", "distributed", "pyarrow",
         "pandas", "datasets", "fsspec", "zstandard", "_hashlib", "concurrent", "logging", "socket", "uuid",
         "subprocess", "multiprocessing"}
#: bpe_core modules a plain BPE run does not use
NOT_FOR_BPE = {"bpe_core.encode", "bpe_core.methods.superbpe", "bpe_core.methods.supratok", "bpe_core.methods.curate",
               "bpe_core.methods.init_from", "bpe_core.reference", "bpe_core.export", "bpe_core.evaluate",
               "bpe_core.runtime.profile", "bpe_core.engine.units"}


def _modules_after(code: str, tmp_path) -> set[str]:
    """The modules loaded once ``code`` ran in a fresh interpreter (outside the checkout)."""
    script = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env=dict(os.environ, PYTHONPATH=package_parent()))
    assert r.returncode == 0, r.stderr[-2000:]
    return set(json.loads(r.stdout.strip().splitlines()[-1]))


def _loaded(modules: set[str], names: set[str]) -> list[str]:
    return sorted(m for m in modules if m in names or m.split(".")[0] in names
                  or any(m == n or m.startswith(n + ".") for n in names))


def test_import_bpe_core_loads_no_heavy_module(tmp_path):
    mods = _modules_after("import bpe_core", tmp_path)
    assert not _loaded(mods, HEAVY | NOT_FOR_BPE | {"bpe_core.training", "bpe_core.engine.merge",
                                                     "bpe_core.methods.bpe", "numpy.random"}), mods
    # the public names are still there, imported when first used
    mods = _modules_after("import bpe_core\nassert callable(bpe_core.train) and bpe_core.Tokenizer.load\n"
                          "from bpe_core import *\nassert TrainConfig and encode_corpus\n"
                          "assert bpe_core.training.train is train and bpe_core.engine.merge.train_words", tmp_path)
    assert "bpe_core.training" in mods and "bpe_core.encode.tokenizer" in mods


def test_a_small_plain_bpe_run_loads_only_what_it_uses(tmp_path):
    """Through the API (train + save) and through the CLI (runpy, as ``python tools/train_bpe.py``)."""
    corpus = FIXTURES / "corpus.en"
    api = _modules_after(f"import bpe_core\nr = bpe_core.train(bpe_core.TrainConfig(input_path={str(corpus)!r}, "
                         f"vocab_size=400, special_tokens=('<|endoftext|>',)))\nr.save({str(tmp_path / 'a')!r})",
                         tmp_path)
    cli = _modules_after(f"import runpy, sys\nsys.argv = [{str(TOOLS / 'train_bpe.py')!r}, {str(corpus)!r}, "
                         f"'--vocab-size', '400', '--out', {str(tmp_path / 'c')!r}, '--progress', 'none']\n"
                         "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
                         "except SystemExit as e:\n    assert not e.code, e.code", tmp_path)
    # Writing the folder checks its tokenizer.json on text (formats.exactness): HF tokenizers loads it
    # and bpe_core's encoder (numpy with it) gives the ids to compare with. Training itself, up to
    # the write, loads neither (test_the_training_of_a_small_run_loads_no_encoder).
    check = {"tokenizers", "bpe_core.encode", "numpy", "regex"}
    for mods in (api, cli):
        assert "bpe_core.training" in mods and "bpe_core.methods.bpe" in mods
        assert check <= {m.split(".")[0] if m.split(".")[0] != "bpe_core" else ".".join(m.split(".")[:2])
                         for m in mods}
        unexpected = _loaded(mods, (HEAVY | NOT_FOR_BPE | {"numpy"}) - check)
        assert not [m for m in unexpected if not any(m == c or m.startswith(c + ".") for c in check)], unexpected
    assert (tmp_path / "a" / "merges.txt").read_bytes() == (tmp_path / "c" / "merges.txt").read_bytes()


def test_the_training_of_a_small_run_loads_no_encoder(tmp_path):
    """numpy (~14 MB and ~0.1 s of a 0.3 s run), the encoder and HF tokenizers wait for the
    folder's check: training a small run uses array.array tables only."""
    corpus = FIXTURES / "corpus.en"
    mods = _modules_after(f"import bpe_core\nr = bpe_core.train(bpe_core.TrainConfig(input_path={str(corpus)!r}, "
                          f"vocab_size=400, special_tokens=('<|endoftext|>',)))", tmp_path)
    assert "bpe_core.training" in mods
    assert not _loaded(mods, HEAVY | NOT_FOR_BPE | {"numpy"}), _loaded(mods, HEAVY | NOT_FOR_BPE | {"numpy"})


def test_the_registry_names_every_method_and_imports_each_when_asked(tmp_path, monkeypatch):
    assert {"bpe", "superbpe", "supratok"} <= set(registry.names())
    assert registry.get("superbpe").name == "superbpe" and registry.get("supratok").stage_aware
    # a declared method's module is imported on the first get; one that does not register is an ImportError
    (tmp_path / "tiny_declared_method.py").write_text(
        "from bpe_core.formats import registry\n"
        "class Tiny(registry.Method):\n    name = 'tiny-declared'\n"
        "registry.register(Tiny())\n")
    (tmp_path / "not_a_method.py").write_text("x = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        registry.declare("tiny-declared", "tiny_declared_method")
        registry.declare("broken-declared", "not_a_method")
        assert "tiny-declared" in registry.names() and "tiny_declared_method" not in sys.modules
        assert registry.get("tiny-declared").name == "tiny-declared"
        with pytest.raises(ImportError, match="did not register"):
            registry.get("broken-declared")
        bpe = registry.get("bpe")                           # registered now ...
        registry.declare("bpe", "not_a_method")             # ... so it stays
        assert registry.get("bpe") is bpe
    finally:
        registry.unregister("tiny-declared")
        registry.unregister("broken-declared")
        sys.modules.pop("tiny_declared_method", None)
        sys.modules.pop("not_a_method", None)


def test_superbpe_still_trains_when_only_declared(tmp_path):
    """A run of a method whose modules were not imported yet (a fresh process) imports them and trains."""
    mods = _modules_after(f"import bpe_core\nr = bpe_core.train(bpe_core.TrainConfig(input_path="
                          f"{str(FIXTURES / 'corpus.en')!r}, vocab_size=300, method='superbpe', "
                          f"special_tokens=('<|endoftext|>',)))\nassert r.model.method == 'superbpe'", tmp_path)
    assert "bpe_core.methods.superbpe" in mods


def test_small_runs_are_the_same_as_runs_with_workers_and_small_chunks(tmp_path):
    """A small input is counted in this thread in one chunk; workers and many chunks give the same merges."""
    corpus = tmp_path / "c.txt"
    corpus.write_bytes((FIXTURES / "corpus.en").read_bytes() * 3)
    one = train(TrainConfig(input_path=str(corpus), vocab_size=600, special_tokens=("<|endoftext|>",)))
    assert one.report["num_workers"] == 1 and one.report["n_chunks"] == 1
    many = train(TrainConfig(input_path=str(corpus), vocab_size=600, special_tokens=("<|endoftext|>",),
                             num_workers=2, chunk_bytes=4096))
    assert many.report["n_chunks"] > 2
    assert one.merges == many.merges and one.vocab == many.vocab


# ==== The small run without numpy gives the files of the numpy path ================================

#: report entries that are measurements of this run (seconds, memory, the plan made from them)
#: (hf_files: the check of tokenizer.json, its cost and the text it ran on -- the API's save checks
#: on the built-in text, the command on the training input)
MEASURED = {"seconds", "cpu_seconds", "fold_cpu_seconds", "final_merge_seconds", "memory", "peak_rss_bytes", "plan", "merge_plan", "hf_files"}


def _folder(config: TrainConfig, folder, plain: bool, monkeypatch) -> dict:
    """The files of the folder a run saves (``train_report.json`` without its measurements); asserts
    which kind of table the run counted into."""
    from bpe_core.pretok import counting

    kinds = []
    real = counting._count_plain

    def spy(*args):
        out = real(*args)
        kinds.append(type(out.table[2]).__module__)
        return out

    monkeypatch.setattr(counting, "PLAIN_SMALL_RUNS", plain)
    monkeypatch.setattr(counting, "_count_plain", spy)
    result = train(config)
    result.save(folder)
    monkeypatch.undo()
    if config.method == "bpe":
        assert kinds == (["array"] if plain else []), kinds
    files = {p.name: p.read_bytes() for p in sorted(folder.iterdir())}
    report = json.loads(files.pop("train_report.json"))
    files["train_report.json"] = {k: v for k, v in report.items() if k not in MEASURED}
    return files


SMALL_CONFIGS = {
    "bpe": dict(vocab_size=700, special_tokens=("<|endoftext|>",)),
    "bpe-hf": dict(vocab_size=700, special_tokens=("<|endoftext|>",), tie_break="hf"),
    "bpe-no-specials": dict(vocab_size=600),
    "bpe-two-specials-o200k": dict(vocab_size=600, special_tokens=("<|endoftext|>", "<|pad|>"), pattern="o200k"),
    "bpe-min-count": dict(vocab_size=600, special_tokens=("<|endoftext|>",), min_pretoken_count=2),
    "superbpe": dict(vocab_size=700, special_tokens=("<|endoftext|>",), method="superbpe"),
    "supratok": dict(vocab_size=700, special_tokens=("<|endoftext|>",), method="supratok"),
}


@pytest.mark.parametrize("name", list(SMALL_CONFIGS))
def test_a_small_run_without_numpy_writes_the_files_of_the_numpy_path(name, tmp_path, monkeypatch):
    """Every file of the folder (vocab.json, merges.txt, model.json, tokenizer.json, ...) and the
    report's figures are byte-identical whether the one range of the plain file is counted into
    array.array tables (no numpy) or numpy arrays."""
    corpus = tmp_path / "c.txt"
    corpus.write_bytes((FIXTURES / "corpus.en").read_bytes() + "\nnaïve café ½ 𝔘 \x00\x7f ab\r\n".encode())
    config = TrainConfig(input_path=str(corpus), **SMALL_CONFIGS[name])
    plain = _folder(config, tmp_path / "plain", True, monkeypatch)
    numpy = _folder(config, tmp_path / "numpy", False, monkeypatch)
    assert plain.keys() == numpy.keys()
    for key in plain:
        assert plain[key] == numpy[key], key


def test_a_small_cli_run_writes_the_files_of_the_numpy_path_on_a_larger_corpus(tmp_path, monkeypatch):
    """The CLI in a fresh process (numpy never imported there) and the numpy path in this one, on
    ~100 KB of mixed text at a vocabulary the corpus cannot fill."""
    text = (FIXTURES / "tinystories_sample.txt").read_bytes() + (FIXTURES / "german.txt").read_bytes()
    corpus = tmp_path / "c.txt"
    corpus.write_bytes(text[:100_000])
    out = tmp_path / "cli"
    code = (f"import runpy, sys\nsys.argv = [{str(TOOLS / 'train_bpe.py')!r}, {str(corpus)!r}, '--vocab-size', "
            f"'32000', '--out', {str(out)!r}, '--progress', 'none']\n"
            "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
            "except SystemExit as e:\n    assert not e.code, e.code\nassert seen == [False], seen")
    # numpy is not imported up to the check of tokenizer.json (which loads the encoder)
    code = ("import sys, bpe_core.cli.train, bpe_core.formats.exactness as x\nassert 'numpy' not in sys.modules\n"
            "seen = []\nreal = x.documents_for\n"
            "def spy(*a, **k):\n    seen.append('numpy' in sys.modules)\n    return real(*a, **k)\n"
            "x.documents_for = spy\n") + code
    _modules_after(code, tmp_path)
    numpy = _folder(TrainConfig(input_path=str(corpus), vocab_size=32000, special_tokens=("<|endoftext|>",)),
                    tmp_path / "numpy", False, monkeypatch)
    cli = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    report = json.loads(cli.pop("train_report.json"))
    assert cli.keys() | {"train_report.json"} == numpy.keys()
    for key in cli:
        assert cli[key] == numpy[key], key
    assert {k: v for k, v in report.items() if k not in MEASURED} == numpy["train_report.json"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=corpus_bytes, specials=st.sampled_from([(), ("<|endoftext|>",)]), tie_break=st.sampled_from(["bytes", "hf"]),
       vocab_size=st.integers(256, 330))
def test_plain_and_numpy_counting_train_the_same_on_any_corpus(data, specials, tie_break, vocab_size, tmp_path,
                                                              monkeypatch):
    """Random, tie-heavy and invalid-UTF-8 corpora (only special tokens, one byte, empty spans
    included): the run counted into array.array tables equals the numpy path's (merges, vocab, the
    report's figures), or both refuse the corpus with the same error."""
    from bpe_core.pretok import counting

    corpus = tmp_path / "c.txt"
    corpus.write_bytes(data)
    out, calls = [], []
    real = counting._count_plain
    monkeypatch.setattr(counting, "_count_plain", lambda task: calls.append(1) or real(task))
    for plain in (True, False):
        monkeypatch.setattr(counting, "PLAIN_SMALL_RUNS", plain)
        try:
            r = train(TrainConfig(input_path=str(corpus), vocab_size=max(vocab_size, 256 + len(specials)),
                                  special_tokens=specials, tie_break=tie_break))
            out.append((r.merges, r.vocab, {k: v for k, v in r.report.items() if k not in MEASURED}))
        except Exception as exc:        # (an empty corpus is an error: the same one on both paths)
            out.append(f"{type(exc).__name__}: {exc}")
    assert out[0] == out[1]
    assert len(calls) == (1 if data else 0)          # the first run counted without numpy
