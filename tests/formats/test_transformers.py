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

pytest.importorskip("transformers")

ROOT = REPO

SCRIPT = r'''
import json, sys
from transformers import AutoTokenizer
import bpe_core
folder, model_dir, out2 = sys.argv[1:4]
tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
ours = bpe_core.Tokenizer.load(model_dir)
texts = [open(p, encoding="utf-8").read() for p in sys.argv[4:]]
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
print(json.dumps(res))
'''


@pytest.mark.parametrize("method", ["superbpe", "bpe"])
def test_autotokenizer_gives_the_exact_ids(tmp_path, fixtures_dir, method):
    corpus = tmp_path / "c.txt"
    data = (fixtures_dir / "corpus.en").read_text(encoding="utf-8")
    corpus.write_text(data[:60000] + "<|endoftext|>" + data[60000:120000], encoding="utf-8")
    heldout = tmp_path / "h.txt"
    heldout.write_text(data[120000:], encoding="utf-8")
    run = [sys.executable, str(ROOT / "tools" / "train_bpe.py"), str(corpus), "--vocab-size", "800",
           "--method", method, "--out", str(tmp_path / "tok"), "--no-progress"]
    r = subprocess.run(run, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "export_tokenizer.py"), str(tmp_path / "tok"),
                        "--format", "transformers", "--out", str(tmp_path / "hf")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf_home"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    # (run outside the checkout: from the repository root, its unbuilt bpe_core/ would shadow the
    # installed package, as for any script a user runs there)
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "hf"), str(tmp_path / "tok"),
                        str(tmp_path / "saved"), str(heldout)], capture_output=True, text=True, env=env,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    res = __import__("json").loads(r.stdout.strip().splitlines()[-1])
    assert res == {"encode": True, "encode_method": True, "decode": True, "batch": True, "special": True,
                   "save_pretrained": True, "class": "BpeCoreTokenizer"}
