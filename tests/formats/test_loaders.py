"""Every method's training folder loads the usual way with bpe_core's exact ids:
``AutoTokenizer.from_pretrained(folder, trust_remote_code=True)`` for BPE, SuperBPE and SupraTok
(plain BPE also without remote code, through its ``tokenizer.json``), from another working folder,
on fixture text and on adversarial generated text (hypothesis), special tokens and decoding too.

``transformers`` runs in a child process (``tests/autotokenizer_server.py``) with ``HF_HOME`` in a
temporary folder, so its module cache for remote code stays out of the user's home; hypothesis
runs here and sends each example there. The child is this interpreter (whatever major of
``transformers`` is installed) and, when ``BPE_CORE_TRANSFORMERS_PYTHON`` names another Python
(e.g. a venv with ``transformers<5`` beside an installed 5.x), that one too.
"""
import json
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bpe_core import TrainConfig
from bpe_core.encode.tokenizer import Tokenizer
from bpe_core.formats.model import load_model
from bpe_core.formats.remote import CODE_FILE, dump_remote, remote_code
from bpe_core.training import train
from paths import FIXTURES, TESTS, package_parent
from strategies import ALPHABET, SPECIAL

pytest.importorskip("transformers")

PAD = "<|pad|>"
METHODS = ("bpe", "superbpe", "supratok")
#: The folders the child loads: (folder, trust_remote_code); ``*-export``: ``--format transformers``.
LOADS = {"bpe": ("bpe", False), "bpe-remote": ("bpe", True), "superbpe": ("superbpe", True),
         "supratok": ("supratok", True), "bpe-export": ("bpe-export", True),
         "superbpe-export": ("superbpe-export", True)}
PYTHONS = [pytest.param(sys.executable, id="this-python")]
if os.environ.get("BPE_CORE_TRANSFORMERS_PYTHON"):
    PYTHONS.append(pytest.param(os.environ["BPE_CORE_TRANSFORMERS_PYTHON"], id="other-python"))

FIXTURE_TEXTS = [
    (FIXTURES / "german.txt").read_text(encoding="utf-8"),
    (FIXTURES / "address.txt").read_text(encoding="utf-8"),
    (FIXTURES / "tinystories_sample.txt").read_text(encoding="utf-8"),
    "In 1993 it cost 12,345,678 dollars.\n\n  Indented<|endoftext|>next  document<|pad|><|endoftext|>",
    "", "x", " ", "\n\n\n", "<|endoftext|>", "<|endoftext|", "<|endof<|endoftext|>text|>",
]

# adversarial text: the strategies' alphabet, digit runs of every length, whitespace runs, 4-byte
# characters, control characters, both special tokens and pieces of them
PIECES = st.one_of(
    ALPHABET,
    st.integers(1, 12).map(lambda n: "1234567890123"[:n]),
    st.sampled_from([" ", "  ", "\t", "\n", "\r\n", "\u3000", "\u2028", " \n ", "   \n\n"]),
    st.sampled_from(["😀", "𝔘", "\x00", "\x7f", "\ufeff", "ı", "İ", "ǅ", "Ⅻ", "½", "'re", "'VE", "’s", "a_b", "--"]),
    st.sampled_from([SPECIAL, PAD, "<|", "|>", "<|endoftext", "endoftext|>", "<|pad"]),
    st.text(max_size=6),
)
adversarial_text = st.lists(PIECES, max_size=30).map("".join)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """One training folder per method (a small vocabulary on the fixture corpus, two specials), and
    the ``--format transformers`` export of two of them."""
    root = tmp_path_factory.mktemp("loaders")
    corpus = root / "c.txt"
    data = (FIXTURES / "corpus.en").read_text(encoding="utf-8")
    corpus.write_text(data[:50000] + SPECIAL + data[50000:100000] + PAD + data[100000:], encoding="utf-8")
    out = {}
    for method in METHODS:
        result = train(TrainConfig(input_path=str(corpus), vocab_size=700, method=method,
                                   special_tokens=(SPECIAL, PAD), num_workers=1, progress=False))
        result.save(root / method / "tok")
        out[method] = root / method / "tok"
    for method in ("bpe", "superbpe"):
        dump_remote(load_model(out[method]), root / method / "export")     # (export_transformers)
        out[method + "-export"] = root / method / "export"
    return out


@pytest.fixture(scope="module", params=PYTHONS)
def child(request, folders, tmp_path_factory):
    """The AutoTokenizer child process, every folder loaded, in a working folder of its own
    (the folders are given relative to it: any working folder works)."""
    home = tmp_path_factory.mktemp("hf_home")
    cwd = tmp_path_factory.mktemp("elsewhere")
    env = dict(os.environ, HF_HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([package_parent(), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([request.param, str(TESTS / "autotokenizer_server.py")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, encoding="utf-8",
                            env=env, cwd=cwd)

    def ask(req):
        proc.stdin.write(json.dumps(req) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line, f"the AutoTokenizer process ended (exit {proc.poll()})"
        reply = json.loads(line)
        assert "error" not in reply, reply["error"]
        return reply

    try:
        version = json.loads(proc.stdout.readline())["version"]
        loads = {name: [os.path.relpath(folders[method], cwd), remote] for name, (method, remote) in LOADS.items()}
        classes = ask({"load": loads})
        yield ask, version, classes
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


@pytest.fixture(scope="module")
def ours(folders):
    return {name: Tokenizer.load(folders[method]) for name, (method, _) in LOADS.items()}


def check_texts(child, ours, texts):
    ask, version, _ = child
    reply = ask({"texts": texts})
    for name, rows in reply.items():
        tok = ours[name]
        specials = set(tok.encode(SPECIAL + PAD))
        for text, row in zip(texts, rows):
            want = tok.encode(text)
            where = f"{name} on transformers {version}, text {text[:60]!r}"
            assert row["ids"] == want, where
            assert row["encode"] == want, where
            assert row["decode"] == text, where
            skipped = tok.decode_bytes([i for i in want if i not in specials]).decode("utf-8", "replace")
            assert row["decode_skip"] == skipped, where


def test_each_folder_loads_with_the_expected_class(child, folders):
    _, version, classes = child
    fast = "TokenizersBackend" if int(version.split(".")[0]) >= 5 else "PreTrainedTokenizerFast"
    assert classes == {"bpe": fast, "bpe-remote": fast, "superbpe": "BpeCoreTokenizer",
                       "supratok": "BpeCoreTokenizer", "bpe-export": "BpeCoreTokenizer",
                       "superbpe-export": "BpeCoreTokenizer"}
    for method in ("superbpe", "supratok", "superbpe-export"):   # the remote module, as bpe_core has it
        assert (folders[method] / CODE_FILE).read_text(encoding="utf-8") == remote_code()
        config = json.loads((folders[method] / "tokenizer_config.json").read_text(encoding="utf-8"))
        assert "model_file" not in config and config["auto_map"]["AutoTokenizer"][0].endswith(".BpeCoreTokenizer")
    assert not (folders["bpe"] / CODE_FILE).exists()


def test_fixture_texts_give_our_ids(child, ours):
    check_texts(child, ours, FIXTURE_TEXTS)


def test_special_tokens_are_ours(child, ours):
    check_texts(child, ours, [SPECIAL, PAD, SPECIAL + PAD + SPECIAL, "a" + PAD + "b", " " + SPECIAL + " "])
    for tok in ours.values():
        assert tok.encode(SPECIAL + PAD) == [256, 257]


@settings(deadline=None)
@given(st.lists(adversarial_text, min_size=1, max_size=8))
def test_adversarial_text_gives_our_ids(child, ours, texts):
    check_texts(child, ours, texts)


@settings(deadline=None)
@given(st.lists(st.lists(st.one_of(st.integers(0, 257), st.integers(258, 699)), max_size=12), min_size=1, max_size=6))
def test_any_ids_decode_as_ours(child, ours, batch):
    """Ids that no encoding gave (special tokens inside a character, cut characters): the text of
    their bytes, as bpe_core decodes it."""
    ask, version, _ = child
    reply = ask({"decode": batch})
    for name, texts in reply.items():
        assert texts == [ours[name].decode_bytes(ids).decode("utf-8", "replace") for ids in batch], name


def test_stage_aware_folder_of_older_runs_is_replaced_whole(folders, tmp_path):
    """Retraining a SuperBPE folder as plain BPE takes the remote module away with the old model
    (it is one of the folder's own files)."""
    import shutil

    target = tmp_path / "tok"
    shutil.copytree(folders["superbpe"], target)
    result = train(TrainConfig(input_path=str(FIXTURES / "german.txt"), vocab_size=270, num_workers=1,
                               progress=False))
    result.save(target)
    assert not (target / CODE_FILE).exists() and (target / "tokenizer.json").is_file()
    assert load_model(target).method == "bpe"
