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
"""
import os
import pathlib
import signal

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


def pytest_configure(config):
    """SIGINT deliverable in every test process and the tools it starts: a shell that starts the
    suite as a background job (``cmd &`` in a script) hands it SIGINT ignored, which Python and the
    tools keep (bpe_core/cli/_start.py) -- and the tests that send a Ctrl-C would see it vanish."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


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
