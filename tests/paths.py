"""Where the tests find the repository, its tools and fixtures, and the shared corpora (one place,
so a test file works from any sub-folder of ``tests/``)."""
import pathlib

TESTS = pathlib.Path(__file__).resolve().parent
REPO = TESTS.parent
TOOLS = REPO / "tools"
BENCHMARKS = REPO / "benchmarks"
SCRIPTS = REPO / "scripts"
FIXTURES = TESTS / "fixtures"
#: ``../shared/corpora`` beside the checkout (developer machines, CI); a user's clone has none.
CORPORA = REPO.parent / "shared" / "corpora"


def package_parent() -> str:
    """The folder holding the ``bpe_core`` this test process imported: a child process given it as
    ``PYTHONPATH`` imports the same package (the installed one in CI, the in-place build on a
    developer's checkout), never the unbuilt source folder of a clean clone."""
    import bpe_core

    return str(pathlib.Path(bpe_core.__file__).resolve().parents[1])
