#!/usr/bin/env python3
"""SupraTok's open choices, measured: a grid of SupraTok settings next to BPE and SuperBPE.

    python benchmarks/bench_supratok.py --train en20.txt --vocab-size 32000 --grid full \\
        --heldout en_heldout.txt --code ood_code.txt --multi ../shared/corpora/multi/parallel \\
        --out runs/ --jsonl grid.jsonl
    python benchmarks/bench_supratok.py --train en60.txt --vocab-size 100000 --rows bpe,superbpe,paper,best ...
    python benchmarks/bench_supratok.py --table grid.jsonl            # the markdown table of what is done
    python benchmarks/bench_supratok.py --list                        # the rows and their settings

Each row trains one model on ``--train`` (``bpe_core.train``, in this process, ``--workers``
pre-tokenization processes), writes it under ``--out/<vocab>/<row>`` and scores it with its own
``Tokenizer`` (the method's stage-aware encoder): characters per token (C/T: Unicode characters of
the text over tokens, special tokens not counted) on the first ``--heldout-bytes`` of ``--heldout``
(cut at a document edge), the first ``--code-bytes`` of ``--code`` and every ``*.txt`` of
``--multi`` (one language each). Rows are appended to ``--jsonl`` as they finish; a row already there
(same row, vocabulary and training file) is skipped, so an interrupted grid resumes where it stopped.

Rows (``ROWS``): ``bpe``, ``superbpe`` (defaults) and SupraTok settings named by what differs from
``paper`` (the paper's values: seed PMI 2.0, count 100, 6 words, transition 0.4, spans PMI 5.0,
count 5, 2 rounds of leaf surgery on 5% held-out documents, script-aware); ``default`` is
``TrainConfig``'s current default. ``--grid ablation`` is one row per paper component, ``--grid full``
adds the candidate rules, the schedule and the thresholds (docs/supratok.md, "The grid").
"""
from __future__ import annotations

import _signal  # noqa: I001  (first: a Ctrl-C or SIGTERM from here on is one line, exit 130 / 143)
import os
import sys

if hasattr(_signal, "pthread_sigmask"):   # held until _start's handler is in
    _signal.pthread_sigmask(_signal.SIG_BLOCK, (_signal.SIGINT, _signal.SIGTERM))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bpe_core", "cli"))
import _start as _tool_start  # (by path, not as bpe_core.cli._start: this checkout's bpe_core is put first below)
del sys.path[0]

_tool_start.begin(__name__)

import argparse
import json
import time

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import bpe_core  # noqa: F401
except ImportError:  # a checkout built in place, not installed
    sys.path.insert(0, os.path.join(HERE, ".."))

import bpe_core  # noqa: E402

EOT = b"<|endoftext|>"

# The paper's values, spelled out (so "paper" stays the paper when the defaults change).
PAPER = dict(method="supratok", pass2_cross="seeds", seed_pmi=2.0, seed_min_count=100, seed_max_n=6,
             transition=0.4, max_words=4, span_pmi=5.0, span_min_count=5, span_max_n=5,
             heldout_fraction=0.05, supratok_rounds=2, script_aware=True)


#: the best setting of the grid (docs/supratok.md, "The grid")
BEST = dict(PAPER, pass2_cross="all", supratok_rounds=0, heldout_fraction=0.0)


def _paper(**kw) -> dict:
    return dict(PAPER, **kw)


#: row name -> TrainConfig fields (vocab_size and input_path come from the command line)
ROWS: dict[str, dict] = {
    "bpe": dict(method="bpe"),
    "superbpe": dict(method="superbpe"),
    "superbpe-t0.78": dict(method="superbpe", transition=0.78125),   # the paper's SuperBPE baseline
    # SuperBPE with the stage-2 choices SupraTok's pass 2 makes (units split, no digit cap, duplicates)
    "superbpe-units": dict(method="superbpe", stage2_split="units", max_digits=None, stage2_duplicates=True),
    "default": dict(method="supratok"),
    "paper": _paper(),
    # -- ablation: one paper component at a time
    "paper-no-pass3": _paper(supratok_rounds=0),
    "paper-no-pass2": _paper(pass2_cross="none"),
    "paper-no-pass2-no-pass3": _paper(pass2_cross="none", supratok_rounds=0),
    "paper-no-script": _paper(script_aware=False),
    "paper-entropy": _paper(entropy_filter=True),
    "paper-no-heldout": _paper(heldout_fraction=0.0),
    # -- pass 2: which boundaries may be crossed
    "words": _paper(pass2_cross="words"),
    "all": _paper(pass2_cross="all"),
    "all-no-pass3": _paper(pass2_cross="all", supratok_rounds=0),
    "all-no-pass3-no-heldout": _paper(pass2_cross="all", supratok_rounds=0, heldout_fraction=0.0),
    "words-no-pass3": _paper(pass2_cross="words", supratok_rounds=0),
    # -- pass 2: seed thresholds
    "seeds-pmi1-c20": _paper(seed_pmi=1.0, seed_min_count=20),
    "seeds-pmi0-c20": _paper(seed_pmi=0.0, seed_min_count=20),
    "seeds-pmi3-c100": _paper(seed_pmi=3.0),
    "seeds-n3": _paper(seed_max_n=3),
    # -- max words per token
    "all-w2": _paper(pass2_cross="all", max_words=2),
    "all-w3": _paper(pass2_cross="all", max_words=3),
    "all-w6": _paper(pass2_cross="all", max_words=6),
    # -- schedule: the pass-1 share (transition)
    "paper-t0.2": _paper(transition=0.2),
    "paper-t0.6": _paper(transition=0.6),
    "all-t0.2": _paper(pass2_cross="all", transition=0.2),
    "all-t0.6": _paper(pass2_cross="all", transition=0.6),
    "all-t0.8": _paper(pass2_cross="all", transition=0.8),
    # -- pass 3 thresholds and schedule
    "all-span-pmi3": _paper(pass2_cross="all", span_pmi=3.0),
    "all-span-c20": _paper(pass2_cross="all", span_min_count=20),
    "all-rounds1": _paper(pass2_cross="all", supratok_rounds=1),
    "all-rounds4": _paper(pass2_cross="all", supratok_rounds=4),
    "all-heldout0.1": _paper(pass2_cross="all", heldout_fraction=0.1),
    "all-no-script": _paper(pass2_cross="all", script_aware=False),
    "all-entropy": _paper(pass2_cross="all", entropy_filter=True),
    # -- around the best: pass 2 across every boundary, no pass 3, no held-out documents
    "best": dict(BEST),
    "best-no-curriculum": dict(BEST, transition=0.01),   # pass 1 stops at the base vocabulary (+ 63 merges at 32k)
    "best-t0.2": dict(BEST, transition=0.2),
    "best-t0.3": dict(BEST, transition=0.3),
    "best-t0.5": dict(BEST, transition=0.5),
    "best-t0.6": dict(BEST, transition=0.6),
    "best-t0.7": dict(BEST, transition=0.7),
    "best-t0.8": dict(BEST, transition=0.8),
    "best-w3": dict(BEST, max_words=3),
    "best-w5": dict(BEST, max_words=5),
    "best-w6": dict(BEST, max_words=6),
    "best-words": dict(BEST, pass2_cross="words"),
    "best-seeds": dict(BEST, pass2_cross="seeds"),
    "best-seeds-pmi0-c20": dict(BEST, pass2_cross="seeds", seed_pmi=0.0, seed_min_count=20),
    "best-seeds-pmi1-c20": dict(BEST, pass2_cross="seeds", seed_pmi=1.0, seed_min_count=20),
    "best-no-script": dict(BEST, script_aware=False),
    "best-entropy": dict(BEST, entropy_filter=True),
    "best-colon": dict(BEST, forbidden=()),
    "best-pass3": dict(BEST, supratok_rounds=2, heldout_fraction=0.05),      # = "all"
    "best-pass3-r1": dict(BEST, supratok_rounds=1, heldout_fraction=0.05),
    "best-pass3-c20": dict(BEST, supratok_rounds=2, heldout_fraction=0.05, span_min_count=20),
    "best-pass3-h0.1": dict(BEST, supratok_rounds=2, heldout_fraction=0.1),
}

GRIDS = {
    "ablation": ["bpe", "superbpe", "paper", "paper-no-pass3", "paper-no-pass2", "paper-no-pass2-no-pass3",
                 "paper-no-script", "paper-entropy", "paper-no-heldout"],
    "full": ["bpe", "superbpe", "paper", "all", "all-no-pass3", "paper-no-pass3", "paper-no-pass2",
             "words", "all-no-pass3-no-heldout", "paper-no-script", "paper-entropy",
             "seeds-pmi1-c20", "seeds-pmi0-c20", "seeds-pmi3-c100", "seeds-n3",
             "all-w2", "all-w3", "all-w6", "paper-t0.2", "paper-t0.6", "all-t0.2", "all-t0.6", "all-t0.8",
             "all-span-pmi3", "all-span-c20", "all-rounds1", "all-rounds4", "all-heldout0.1",
             "all-no-script", "all-entropy", "paper-no-pass2-no-pass3", "paper-no-heldout", "words-no-pass3"],
}


#: (component, row with it, row without it): the "What each component contributes" table
ABLATION = [
    ("cross-boundary merges (passes 2-3 as a whole)", "best", "bpe"),
    ("curriculum (pass 1 before any cross-boundary merge)", "best", "best-no-curriculum"),
    ("PMI seeds, on top of BPE (pass 2 = seeds vs no cross merge)", "paper-no-pass3", "bpe"),
    ("PMI seed rule instead of crossing every boundary", "best-seeds", "best"),
    ("pass 3 (spans, leaf surgery) after the paper's pass 2", "paper", "paper-no-pass3"),
    ("pass 3 after pass 2 = all", "all", "best"),
    ("pass 3 alone, on top of BPE", "paper-no-pass2", "bpe"),
    ("5% held-out documents left out of passes 1-2", "all-no-pass3", "best"),
    ("script-aware processing (paper settings)", "paper", "paper-no-script"),
    ("script-aware processing (default)", "best", "best-no-script"),
    ("entropy curation (paper settings)", "paper-entropy", "paper"),
    ("entropy curation (default)", "best-entropy", "best"),
]


def ablation_table(path: str) -> str:
    """One row per paper component: C/T with and without it, per (vocabulary, training file)."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    out = ["| component | vocab, data | with | without | en_heldout | ood_code | langs (mean) |",
           "|---|---|---|---|---|---|---|"]
    for key in sorted({(r["vocab_size"], r["train"]) for r in rows}):
        by = {r["row"]: r for r in rows if (r["vocab_size"], r["train"]) == key}
        for label, a, b in ABLATION:
            if a not in by or b not in by:
                continue
            sa, sb = by[a]["scores"], by[b]["scores"]
            langs = [k for k in sa if k not in ("en_heldout", "ood_code")]
            code = _gain(sa["ood_code"]["cpt"], sb["ood_code"]["cpt"]) if "ood_code" in sa else ""
            mean = (f"{100 * (sum(sa[k]['cpt'] / sb[k]['cpt'] for k in langs) / len(langs) - 1):+.1f}%"
                    if langs else "")
            out.append(f"| {label} | {key[0] // 1000}k, {key[1]} | `{a}` {sa['en_heldout']['cpt']:.3f} "
                       f"| `{b}` {sb['en_heldout']['cpt']:.3f} | {_gain(sa['en_heldout']['cpt'], sb['en_heldout']['cpt'])} "
                       f"| {code} | {mean} |")
    return "\n".join(out)


def cut_documents(path: str, limit: int) -> bytes:
    """The first ``limit`` bytes of ``path``, cut back to the last document edge (or all of it)."""
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) <= limit:
        return data
    k = data.rfind(EOT, 0, limit)
    return data[:k] if k > 0 else data[:limit]


def eval_texts(args) -> dict[str, str]:
    """name -> text: en_heldout, ood_code and one entry per language."""
    texts = {}
    if args.heldout:
        texts["en_heldout"] = cut_documents(args.heldout, args.heldout_bytes).decode("utf-8", "replace")
    if args.code:
        texts["ood_code"] = cut_documents(args.code, args.code_bytes).decode("utf-8", "replace")
    if args.multi:
        for name in sorted(os.listdir(args.multi)):
            if name.endswith(".txt"):
                with open(os.path.join(args.multi, name), encoding="utf-8", errors="replace") as f:
                    texts[name[:-4]] = f.read()
    return texts


def score(folder: str, texts: dict[str, str]) -> dict[str, dict]:
    """C/T and bytes per token of each text with the model's own Tokenizer (stage-aware)."""
    tok = bpe_core.Tokenizer.load(folder)
    out = {}
    for name, text in texts.items():
        ids = tok.encode_to_numpy(text, specials=True)
        n = int(ids.size) - text.count(EOT.decode())
        out[name] = {"tokens": n, "chars": len(text), "bytes": len(text.encode("utf-8")),
                     "cpt": round(len(text) / max(n, 1), 4)}
    return out


def done_keys(path: str) -> set:
    keys = set()
    if path and os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    keys.add((r["row"], r["vocab_size"], r["train"]))
    return keys


def run_row(name: str, args, texts) -> dict:
    settings = dict(ROWS[name])
    method = settings.pop("method")
    folder = os.path.join(args.out, str(args.vocab_size), name)
    config = bpe_core.TrainConfig(args.train, args.vocab_size, method=method, num_workers=args.workers, **settings)
    t0 = time.perf_counter()
    result = bpe_core.train(config)
    wall = time.perf_counter() - t0
    result.save(folder)
    info = result.report.get("supratok", {})
    row = {"row": name, "vocab_size": args.vocab_size, "train": os.path.basename(args.train),
           "train_bytes": os.path.getsize(args.train), "method": method, "settings": settings,
           "train_s": round(wall, 1), "seconds": result.report.get("seconds", {}),
           "supratok": {k: info[k] for k in ("seeds", "pass1_merges", "pass2_merges", "pass2_cross_merges",
                                             "pass3_spans", "pass3_removed_leaves", "pass3_candidates",
                                             "transition", "heldout_documents") if k in info},
           "scores": score(folder, texts)}
    return row


def _gain(a: float, b: float) -> str:
    return f"{100 * (a / b - 1):+.1f}%"


def table(path: str) -> str:
    """A markdown table per (vocabulary, training file) of the rows in ``path``."""
    rows = [json.loads(line) for line in open(path) if line.strip()]
    out = []
    for key in sorted({(r["vocab_size"], r["train"]) for r in rows}):
        group = [r for r in rows if (r["vocab_size"], r["train"]) == key]
        by = {r["row"]: r for r in group}
        langs = [k for k in group[0]["scores"] if k not in ("en_heldout", "ood_code")]
        out.append(f"\n### {key[0] // 1000}k on {key[1]}\n")
        out.append("| row | en_heldout | vs SuperBPE | vs BPE | ood_code | vs BPE | langs: mean vs BPE "
                   "| langs behind BPE | train s | seeds | cross merges p2 | p3 spans |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
        sb, bp = by.get("superbpe"), by.get("bpe")
        order = sorted(group, key=lambda r: -r["scores"]["en_heldout"]["cpt"])
        for r in order:
            s = r["scores"]
            en, code = s["en_heldout"]["cpt"], s.get("ood_code", {}).get("cpt", 0)
            vs_sb = _gain(en, sb["scores"]["en_heldout"]["cpt"]) if sb else ""
            vs_bp = _gain(en, bp["scores"]["en_heldout"]["cpt"]) if bp else ""
            code_bp = _gain(code, bp["scores"]["ood_code"]["cpt"]) if bp and code else ""
            if bp and langs:
                ratios = [s[k]["cpt"] / bp["scores"][k]["cpt"] for k in langs]
                mean = f"{100 * (sum(ratios) / len(ratios) - 1):+.1f}%"
                behind = ",".join(k for k, x in zip(langs, ratios) if x < 0.9995) or "none"
            else:
                mean = behind = ""
            st = r.get("supratok", {})
            out.append(f"| {r['row']} | {en:.3f} | {vs_sb} | {vs_bp} | {code:.3f} | {code_bp} | {mean} | {behind} "
                       f"| {r['train_s']:.0f} | {st.get('seeds', '')} | {st.get('pass2_cross_merges', '')} "
                       f"| {st.get('pass3_spans', '')} |")
        if langs:
            out.append("\n| row | " + " | ".join(langs) + " |")
            out.append("|---|" + "---|" * len(langs))
            for r in order:
                out.append(f"| {r['row']} | " + " | ".join(f"{r['scores'][k]['cpt']:.3f}" for k in langs) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", metavar="FILE", help="training text")
    p.add_argument("--vocab-size", type=int, default=32000)
    p.add_argument("--grid", choices=sorted(GRIDS), default=None, help="a named set of rows")
    p.add_argument("--rows", default=None, help="comma-separated row names (after --grid's)")
    p.add_argument("--out", default="bench_supratok_runs", metavar="DIR", help="where the models go")
    p.add_argument("--jsonl", default="bench_supratok.jsonl", metavar="FILE", help="results, one row a line")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--heldout", metavar="FILE", help="en_heldout.txt (decompressed)")
    p.add_argument("--heldout-bytes", type=int, default=2_000_000)
    p.add_argument("--code", metavar="FILE", help="ood_code.txt (decompressed)")
    p.add_argument("--code-bytes", type=int, default=1_000_000)
    p.add_argument("--multi", metavar="DIR", help="a folder of <lang>.txt (e.g. corpora/multi/parallel)")
    p.add_argument("--table", metavar="JSONL", help="print the markdown table of a results file and stop")
    p.add_argument("--list", action="store_true", help="print the rows and their settings and stop")
    args = p.parse_args(argv)
    if args.list:
        for name, s in ROWS.items():
            print(f"{name:28s} {json.dumps(s)}")
        return 0
    if args.table:
        print(table(args.table))
        print("\n" + ablation_table(args.table))
        return 0
    if not args.train or not os.path.isfile(args.train):
        print(f"bench_supratok.py: {args.train}: not a file (give --train FILE)", file=sys.stderr)
        return 2
    names = list(GRIDS[args.grid]) if args.grid else []
    names += [n for n in (args.rows.split(",") if args.rows else []) if n not in names]
    unknown = [n for n in names if n not in ROWS]
    if unknown or not names:
        print(f"bench_supratok.py: unknown rows {unknown} (see --list)" if unknown
              else "bench_supratok.py: no rows (give --grid or --rows)", file=sys.stderr)
        return 2
    texts = eval_texts(args)
    done = done_keys(args.jsonl)
    for name in names:
        if (name, args.vocab_size, os.path.basename(args.train)) in done:
            continue
        try:
            row = run_row(name, args, texts)
        except (ValueError, OSError) as exc:
            print(f"bench_supratok.py: row {name}: {exc}", file=sys.stderr)
            return 2
        with open(args.jsonl, "a") as f:
            f.write(json.dumps(row) + "\n")
        s = row["scores"]
        print(f"{name:28s} {args.vocab_size}: en {s.get('en_heldout', {}).get('cpt', 0):.3f} "
              f"code {s.get('ood_code', {}).get('cpt', 0):.3f}  train {row['train_s']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_tool_start.run_bench(main))
