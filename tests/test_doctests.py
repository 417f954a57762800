"""Every docstring example in the package runs and prints what it says (``doctest`` over each module).

Examples that read the repository's own fixtures find them beside the package (``tests/fixtures``),
so this runs from a checkout, as the rest of the suite does. The examples make their temporary
folders as a user would (``tempfile.mkdtemp()``); here they go into the test's ``tmp_path``.
"""
import doctest
import importlib
import pathlib
import pkgutil
import tempfile

import pytest

import bpe_core

MODULES = sorted(m.name for m in pkgutil.walk_packages(bpe_core.__path__, "bpe_core.")
                 if not m.name.rsplit(".", 1)[-1].startswith("__"))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, tmp_path, monkeypatch):
    # the examples' tempfile.mkdtemp() folders go into this test's own folder, removed with it
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    try:
        module = importlib.import_module(name)
    except ImportError as exc:          # an optional extra (transformers, dask) not installed
        pytest.skip(f"{name}: {exc}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed (run: " \
                               f"python -m pytest --doctest-modules {pathlib.Path(module.__file__).name})"
