"""Sharded ids at a URL (``encode_corpus.encode_to_parts``): the part names, the manifest that lists
them (written last, so its presence means complete), and reading them back (:func:`load_sharded_ids`).

fsspec is imported only when a URL is opened (:func:`fs_of`); a run without fsspec gets one line
naming the package to install.
"""
from __future__ import annotations

import io
import json

import numpy as np

from ..errors import CorpusError, MissingDependency


#: The manifest of sharded ids (``encode_to_parts``): written last, so its presence means complete.
MANIFEST = "manifest.json"
MANIFEST_FORMAT = "bpe_core.sharded_ids/1"


def part_name(index: int) -> str:
    return f"part-{index:06d}.npy"


def fix_lead(fs, path: str, lead: bool, sep_id, dtype: np.dtype) -> None:
    """Add or drop the separator id at the start of a part (``encode_to_parts``, rare)."""
    with fs.open(path, "rb") as f:
        ids = np.load(f, allow_pickle=False)
    ids = np.concatenate([np.array([sep_id], dtype), ids]) if lead else ids[1:]
    out = io.BytesIO()
    np.save(out, ids)
    fs.pipe_file(path, out.getvalue())


def fs_of(url: str):
    try:
        import fsspec
    except ImportError:
        raise MissingDependency(f"{url}: writing to a URL needs fsspec: pip install fsspec") from None
    fs, root = fsspec.core.url_to_fs(url)
    return fs, root.rstrip("/")


def npy_length(fs, path: str) -> int:
    with fs.open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        shape, _, _ = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                       else np.lib.format.read_array_header_2_0(f))
    return int(shape[0])


def load_sharded_ids(url: str) -> np.ndarray:
    """The ids that ``encode_to_parts`` wrote at ``url``, concatenated in manifest order.

    Raises:
        CorpusError: no manifest (the run did not finish), or a part that is not what it lists.
    """
    fs, root = fs_of(url)
    try:
        manifest = json.loads(fs.cat_file(f"{root}/{MANIFEST}"))
    except FileNotFoundError:
        raise CorpusError(url, f"no {MANIFEST}: not a finished sharded output") from None
    if manifest.get("format") != MANIFEST_FORMAT:
        raise CorpusError(url, f"{MANIFEST}: not a {MANIFEST_FORMAT} manifest")
    arrays = []
    for part in manifest["parts"]:
        with fs.open(f"{root}/{part['path']}", "rb") as f:
            arr = np.load(f, allow_pickle=False)
        if arr.shape != (part["n_tokens"],) or arr.dtype != np.dtype(manifest["dtype"]):
            raise CorpusError(url, f"{part['path']}: {arr.shape[0]:,} {arr.dtype} ids, the manifest says "
                                   f"{part['n_tokens']:,} {manifest['dtype']}")
        arrays.append(arr)
    return np.concatenate(arrays) if arrays else np.zeros(0, np.dtype(manifest["dtype"]))
