"""Shared test setup: paths, the hypothesis budget, and the opt-in ``--slow`` marker.

``BPE_CORE_MAX_EXAMPLES`` sets how many examples each property test tries (as tiktoken's
``TIKTOKEN_MAX_EXAMPLES``); the default keeps the whole suite under five minutes on two cores.
"""
import os
import pathlib

import pytest
from hypothesis import HealthCheck, settings

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
SHARED = pathlib.Path(__file__).resolve().parents[2] / "shared"
CORPORA = SHARED / "corpora"

MAX_EXAMPLES = int(os.environ.get("BPE_CORE_MAX_EXAMPLES", "60"))
settings.register_profile(
    "bpe_core",
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=os.environ.get("CI") == "true",
)
settings.load_profile("bpe_core")


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", default=False, help="run slow tests too")


def pytest_collection_modifyitems(config, items):
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
