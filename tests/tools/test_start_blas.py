"""Every command starts numpy with one OpenBLAS thread unless the user chose otherwise
(``bpe_core/cli/_start.py``, ``begin``): bpe_core calls no BLAS routine, and numpy's OpenBLAS
starts a thread per core at import that spins before it sleeps."""
import os
import subprocess
import sys

import pytest

from paths import package_parent

#: what a command does first (``_start.begin``), then numpy's import; prints the variable and how
#: many threads the process has (Linux: /proc/self/task)
PROBE = r'''
import os, sys
from bpe_core.cli import _start
_start.begin(sys.argv[1])
import numpy
tasks = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else -1
print(os.environ.get("OPENBLAS_NUM_THREADS"), tasks)
'''


def _probe(name: str, tmp_path, blas: "str | None") -> tuple:
    env = dict(os.environ, PYTHONPATH=package_parent())
    env.pop("OPENBLAS_NUM_THREADS", None)
    if blas is not None:
        env["OPENBLAS_NUM_THREADS"] = blas
    r = subprocess.run([sys.executable, "-c", PROBE, name], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    value, tasks = r.stdout.split()
    return value, int(tasks)


@pytest.mark.parametrize("name", ["__main__", "__mp_main__"])
def test_a_command_starts_numpy_with_one_blas_thread(tmp_path, name):
    value, tasks = _probe(name, tmp_path, None)
    assert value == "1"
    if tasks >= 0:
        assert tasks == 1, f"{tasks} threads after numpy's import"


def test_the_users_setting_stays(tmp_path):
    value, tasks = _probe("__main__", tmp_path, "2")
    assert value == "2"
    if tasks < 0 or (os.cpu_count() or 1) < 2:
        pytest.skip("no thread count here, or one core")
    if tasks == 1:
        pytest.skip("this numpy's BLAS starts no threads")
    assert tasks >= 2


def test_an_import_leaves_the_environment_alone(tmp_path):
    """``begin`` from a module imported by a user's script (or a test) changes nothing."""
    value, _ = _probe("some_module", tmp_path, None)
    assert value == "None"
