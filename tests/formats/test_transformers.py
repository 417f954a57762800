"""The transformers integration: AutoTokenizer(trust_remote_code) gives bpe_core's exact ids.

Runs in a subprocess with HF_HOME in a temporary folder and HF_HUB_OFFLINE=1: nothing is
downloaded, and the dynamic-module cache transformers writes stays out of the user's home.
"""
from paths import REPO
import os
import subprocess
import sys
import pathlib

import pytest

from tool_runner import run_tool

pytest.importorskip("transformers")

ROOT = REPO

SCRIPT = r'''
import json, sys
from transformers import AutoTokenizer
import bpe_core
heldout, runs = sys.argv[1], sys.argv[2:]
out = {}
for folder, model_dir, out2 in zip(runs[0::3], runs[1::3], runs[2::3]):
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    ours = bpe_core.Tokenizer.load(model_dir)
    texts = [open(heldout, encoding="utf-8").read()]
    texts += ["In 1993 it cost 12,345 dollars.\n\n  Indented line<|endoftext|>next document  here", "", "x"]
    res = {}
    res["encode"] = all(tok(t)["input_ids"] == ours.encode(t) for t in texts)
    res["encode_method"] = all(tok.encode(t) == ours.encode(t) for t in texts)
    res["decode"] = all(tok.decode(tok(t)["input_ids"]) == t for t in texts)
    batch = tok(texts, padding=True)
    res["batch"] = all(ids[:len(ours.encode(t))] == ours.encode(t) and sum(m) == len(ours.encode(t))
                       for ids, m, t in zip(batch["input_ids"], batch["attention_mask"], texts))
    res["special"] = (tok.eos_token == "<|endoftext|>" and tok.eos_token_id == 256
                      and tok("a<|endoftext|>b")["input_ids"].count(256) == 1
                      and tok.decode(tok("a<|endoftext|>b")["input_ids"], skip_special_tokens=True) == "ab")
    tok.save_pretrained(out2)
    tok2 = AutoTokenizer.from_pretrained(out2, trust_remote_code=True)
    res["save_pretrained"] = all(tok2(t)["input_ids"] == ours.encode(t) for t in texts)
    res["class"] = type(tok2).__name__
    out[folder] = res
print(json.dumps(out))
'''
METHODS = ["superbpe", "bpe"]
#: This interpreter, and another one (e.g. a venv with the other major of transformers) when
#: BPE_CORE_TRANSFORMERS_PYTHON names it (tests/formats/test_loaders.py).
PYTHONS = [pytest.param(sys.executable, id="this-python")]
if os.environ.get("BPE_CORE_TRANSFORMERS_PYTHON"):
    PYTHONS.append(pytest.param(os.environ["BPE_CORE_TRANSFORMERS_PYTHON"], id="other-python"))


@pytest.fixture(scope="module", params=PYTHONS)
def loaded(request, tmp_path_factory, fixtures_dir):
    # Both methods' folders are trained and exported by the tools (forked by tool_runner), then
    # loaded by transformers in one fresh interpreter (one import of transformers for both).
    tmp_path = tmp_path_factory.mktemp("transformers")
    corpus = tmp_path / "c.txt"
    data = (fixtures_dir / "corpus.en").read_text(encoding="utf-8")
    corpus.write_text(data[:60000] + "<|endoftext|>" + data[60000:120000], encoding="utf-8")
    heldout = tmp_path / "h.txt"
    heldout.write_text(data[120000:], encoding="utf-8")
    runs = []
    for method in METHODS:
        tok = tmp_path / method / "tok"
        tok.parent.mkdir()                  # (the folder above an output must exist)
        r = run_tool(ROOT / "tools" / "train_bpe.py", corpus, "--vocab-size", "800", "--method", method,
                     "--out", tok, "--no-progress", timeout=300)
        assert r.returncode == 0, r.stderr
        r = run_tool(ROOT / "tools" / "export_tokenizer.py", tok, "--format", "transformers",
                     "--out", tmp_path / method / "hf", timeout=300)
        assert r.returncode == 0, r.stderr
        runs += [str(tmp_path / method / "hf"), str(tok), str(tmp_path / method / "saved")]
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    # (run outside the checkout: from the repository root, its unbuilt bpe_core/ would shadow the
    # installed package, as for any script a user runs there)
    r = subprocess.run([request.param, "-c", SCRIPT, str(heldout), *runs], capture_output=True, text=True,
                       env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    res = __import__("json").loads(r.stdout.strip().splitlines()[-1])
    return {method: res[str(tmp_path / method / "hf")] for method in METHODS}


@pytest.mark.parametrize("method", METHODS)
def test_autotokenizer_gives_the_exact_ids(loaded, method):
    assert loaded[method] == {"encode": True, "encode_method": True, "decode": True, "batch": True,
                              "special": True, "save_pretrained": True, "class": "BpeCoreTokenizer"}
