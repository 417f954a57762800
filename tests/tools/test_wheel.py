"""A wheel built from the checkout installs the ``bpe-core`` command (slow: it compiles the
extensions, a few CPU-minutes; ``pytest --slow``). The fast checks of the command line are in
``test_command_line.py`` (the console script's metadata, ``python -m bpe_core``).

The wheel is built without build isolation (setuptools and Cython of this environment) and
installed without its dependencies into a fresh virtual environment that sees this one's packages
(numpy, regex, psutil, tqdm), so no network is needed; then ``bpe-core`` runs from another folder.
"""
import os
import subprocess
import sys
import venv

import pytest

from paths import REPO


def _run(*cmd, cwd=None, timeout=1200):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd, timeout=timeout,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert r.returncode == 0, f"{cmd}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.mark.slow
def test_the_wheel_installs_bpe_core_and_it_trains_encodes_exports_profiles(tmp_path):
    pytest.importorskip("Cython")
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "pip", "wheel", REPO, "-w", dist, "--no-deps", "--no-build-isolation", "-q")
    wheels = list(dist.glob("bpe_core-*.whl"))
    assert len(wheels) == 1, wheels
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=True)
    bindir = env_dir / ("Scripts" if os.name == "nt" else "bin")
    _run(bindir / "python", "-m", "pip", "install", "--no-deps", "-q", wheels[0])
    work = tmp_path / "work"
    work.mkdir()
    cli = bindir / "bpe-core"
    assert _run(cli, "--version", cwd=work).stdout.startswith("bpe-core ")
    _run(cli, "train", "--vocab-size", "300", "--out", "tok", "--no-progress", cwd=work)      # the packaged sample
    assert (work / "tok" / "merges.txt").is_file()
    sample = _run(bindir / "python", "-c", "import bpe_core, os; print(os.path.join(os.path.dirname("
                  "bpe_core.__file__), 'data', 'sample.txt'))", cwd=work).stdout.strip()
    assert not sample.startswith(str(REPO))                 # the installed package, not the checkout
    _run(cli, "encode", sample, "--tokenizer", "tok", "--out", "ids.npy", "--no-progress", cwd=work)
    _run(cli, "export", "tok", "--format", "hf", "--out", "tokenizer.json", cwd=work)
    _run(cli, "profile", "--out", "prof", "--no-plot", "--", cli, "train", "--vocab-size", "280", "--out", "t2",
         "--no-progress", cwd=work)
    assert (work / "ids.npy").is_file() and (work / "tokenizer.json").is_file() and (work / "prof.json").is_file()
    _run(bindir / "python", "-m", "bpe_core", "--help", cwd=work)
