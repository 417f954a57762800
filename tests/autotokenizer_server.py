"""A child process that loads tokenizer folders with ``transformers.AutoTokenizer`` and answers
with their ids, one JSON line per request (what ``tests/formats/test_loaders.py`` compares with
bpe_core's own encoder; the test process drives it with hypothesis).

Run as ``python autotokenizer_server.py`` with ``HF_HOME`` in a temporary folder (the module cache
``transformers`` writes for remote code stays out of the user's home) and from a working folder
that is not the model folders' (they are loaded by absolute or relative path).

Requests (one JSON object a line on stdin):

- ``{"load": {name: [folder, trust_remote_code]}}`` -> ``{name: class name}``;
- ``{"texts": [...]}`` -> ``{name: [{"ids", "encode", "decode", "decode_skip"} per text]}``;
- ``{"decode": [ids, ...]}`` -> ``{name: [decoded text per list of ids]}``.

The first line written is ``{"version": transformers.__version__}``; an error is
``{"error": traceback}``.
"""
import json
import sys
import traceback


def main() -> None:
    import transformers
    from transformers import AutoTokenizer

    tokenizers = {}
    print(json.dumps({"version": transformers.__version__}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            if "load" in request:
                reply = {}
                for name, (folder, remote) in request["load"].items():
                    tokenizers[name] = AutoTokenizer.from_pretrained(folder, trust_remote_code=remote)
                    reply[name] = type(tokenizers[name]).__name__
            elif "decode" in request:
                reply = {name: [tok.decode(ids) for ids in request["decode"]] for name, tok in tokenizers.items()}
            else:
                reply = {}
                for name, tok in tokenizers.items():
                    rows = []
                    for text in request["texts"]:
                        ids = tok(text)["input_ids"]
                        rows.append({"ids": ids, "encode": tok.encode(text), "decode": tok.decode(ids),
                                     "decode_skip": tok.decode(ids, skip_special_tokens=True)})
                    reply[name] = rows
        except Exception:
            reply = {"error": traceback.format_exc()}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
