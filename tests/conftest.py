"""Shared test setup: paths, the hypothesis budget, the opt-in ``--slow`` marker, and both cores.

Property tests: the default run tries at most ``DEFAULT_MAX_EXAMPLES`` examples per test (fewer
where a test asks for fewer; derandomized under CI=true), which keeps the whole suite under five
minutes on two cores. The long profile -- ``pytest --slow`` or ``HYPOTHESIS_PROFILE=ci-long`` --
tries the counts written in the tests (60 where a test names none). ``BPE_CORE_MAX_EXAMPLES=N``
sets that count and lifts the cap (as tiktoken's ``TIKTOKEN_MAX_EXAMPLES``).

The whole suite (a plain ``pytest``, as the README and CI run it) runs on every core when
pytest-xdist is installed (the ``test`` extra has it): one worker per core, each test module on one
worker (``--dist loadfile``: a module's fixtures -- trained models, a Dask cluster -- are made once).
A run of chosen files or tests stays in one process; ``-n 0`` runs the whole suite in one process,
``-n N`` picks the count.

Temporary files: the run gets a folder of its own (``TMPDIR`` for the test processes and every
process they start, and pytest's ``tmp_path`` folders inside it), removed at the end. What a test
leaves there outside ``tmp_path`` -- a ``mkdtemp()`` never removed, a stale ``.tmp-`` file -- is
named at the end and fails the run: a full ``pytest`` leaves nothing in ``$TMPDIR``.
"""
import os
import pathlib
import shutil
import signal
import tempfile

import pytest
from hypothesis import HealthCheck, settings

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
SHARED = pathlib.Path(__file__).resolve().parents[2] / "shared"
CORPORA = SHARED / "corpora"

MAX_EXAMPLES = int(os.environ.get("BPE_CORE_MAX_EXAMPLES", "60"))
#: The most examples a property test tries in the default run (see the module docstring).
DEFAULT_MAX_EXAMPLES = 25
for _name in ("bpe_core", "ci-long"):
    settings.register_profile(
        _name,
        max_examples=MAX_EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        derandomize=os.environ.get("CI") == "true",
    )
settings.load_profile("bpe_core")


def _long_property_runs(config) -> bool:
    return (config.getoption("--slow") or os.environ.get("HYPOTHESIS_PROFILE") == "ci-long"
            or "BPE_CORE_MAX_EXAMPLES" in os.environ)


def _cap_examples(items) -> None:
    """Each property test of ``items`` tries at most ``DEFAULT_MAX_EXAMPLES`` examples (its own
    ``@settings`` are kept otherwise)."""
    done = set()
    for item in items:
        test = getattr(item, "obj", None)
        if not getattr(test, "is_hypothesis_test", False) or id(test) in done:
            continue
        done.add(id(test))
        current = getattr(test, "_hypothesis_internal_use_settings", None) or settings.default
        if current.max_examples > DEFAULT_MAX_EXAMPLES:
            test._hypothesis_internal_use_settings = settings(current, max_examples=DEFAULT_MAX_EXAMPLES)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """A plain ``pytest`` (the test paths of pyproject.toml, no ``-n``) runs on every core."""
    if (config.pluginmanager.hasplugin("xdist") and os.environ.get("PYTEST_XDIST_WORKER") is None
            and getattr(config.option, "numprocesses", 0) is None
            and getattr(getattr(config, "args_source", None), "name", None) == "TESTPATHS"
            and not config.getoption("collectonly") and not config.getoption("usepdb", False)):
        config.option.numprocesses = "auto"
        if config.option.dist == "no":
            config.option.dist = "loadfile"


#: The run's own temporary folder and the ``TMPDIR`` it replaced (the main process only).
_TMP: dict = {}
#: pytest's ``tmp_path`` folders, inside the run's folder (removed with it, never litter).
_BASETEMP = "pytest"
#: Caches the libraries keep in the temporary folder on purpose, across runs (Dask's scratch root,
#: tiktoken's download cache): removed with the run's folder, not litter of a test.
_CACHES = {"dask-scratch-space", "data-gym-cache"}
#: Where every test process notes the folders ``tempfile.mkdtemp`` made directly in ``TMPDIR``
#: (folder, test), so litter is named with the test that made it.
_MADE = ".mkdtemp-by-test"


def _note_mkdtemp(own: str) -> None:
    """``tempfile.mkdtemp`` (and ``TemporaryDirectory``) of this process note their folder and the
    running test in ``own/_MADE`` when the folder is made directly in ``own``."""
    made = tempfile.mkdtemp

    def mkdtemp(*args, **kwargs):
        path = made(*args, **kwargs)
        if os.path.dirname(os.path.abspath(path)) == own:
            test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
            with open(os.path.join(own, _MADE), "a", encoding="utf-8") as f:
                f.write(f"{os.path.basename(path)}\t{test}\n")
        return path
    tempfile.mkdtemp = mkdtemp


@pytest.hookimpl(tryfirst=True)             # before pytest's tmp_path factory reads --basetemp
def pytest_configure(config):
    """SIGINT deliverable in every test process and the tools it starts: a shell that starts the
    suite as a background job (``cmd &`` in a script) hands it SIGINT ignored, which Python and the
    tools keep (bpe_core/cli/_start.py) -- and the tests that send a Ctrl-C would see it vanish.
    And the run's own temporary folder (the module docstring)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if hasattr(config, "workerinput"):         # an xdist worker: its TMPDIR is the main process's
        _note_mkdtemp(os.environ["TMPDIR"])
        return
    if _TMP:
        return
    own = tempfile.mkdtemp(prefix="bpe_core-tests-")
    _TMP.update(own=own, outer=os.environ.get("TMPDIR"))
    os.environ["TMPDIR"] = own
    tempfile.tempdir = None                     # (gettempdir() reads TMPDIR again)
    if config.option.basetemp is None:
        config.option.basetemp = os.path.join(own, _BASETEMP)
    _note_mkdtemp(own)


def pytest_sessionfinish(session, exitstatus):
    """What the run left in its temporary folder outside ``tmp_path``: named, and the run fails."""
    own = _TMP.get("own")
    if own is None or hasattr(session.config, "workerinput"):
        return
    left = sorted(set(os.listdir(own)) - {_BASETEMP, _MADE} - _CACHES) if os.path.isdir(own) else []
    if left:
        made = {}
        if os.path.exists(os.path.join(own, _MADE)):
            with open(os.path.join(own, _MADE), encoding="utf-8") as f:
                made = dict(line.rstrip("\n").split("\t", 1) for line in f if "\t" in line)
        left = [f"{name} ({made[name]})" if name in made else name for name in left]
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        line = (f"the tests left {len(left)} temporary file(s) or folder(s) in TMPDIR (a mkdtemp() never "
                f"removed, a stale temp file; use tmp_path): {', '.join(left[:10])}")
        if reporter is not None:
            reporter.write_sep("-", "temporary files left behind", red=True)
            reporter.write_line(line, red=True)
        if session.exitstatus == 0:
            session.exitstatus = 1


def pytest_unconfigure(config):
    own = _TMP.pop("own", None)
    if own is None:
        return
    shutil.rmtree(own, ignore_errors=True)
    outer = _TMP.pop("outer", None)
    if outer is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = outer
    tempfile.tempdir = None


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", default=False, help="run slow tests too")


def pytest_collection_modifyitems(config, items):
    if not _long_property_runs(config):
        _cap_examples(items)
    if config.getoption("--slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def fixtures_dir():
    return FIXTURES


@pytest.fixture(scope="session")
def corpora_dir():
    """``../shared/corpora`` when present (developer machines, CI); a user's clone skips."""
    if not CORPORA.is_dir():
        pytest.skip("../shared/corpora is not present")
    return CORPORA
