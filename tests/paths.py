"""Where the tests find the repository, its tools and fixtures, and the shared corpora (one place,
so a test file works from any sub-folder of ``tests/``)."""
import pathlib

TESTS = pathlib.Path(__file__).resolve().parent
REPO = TESTS.parent
TOOLS = REPO / "tools"
FIXTURES = TESTS / "fixtures"
#: ``../shared/corpora`` beside the checkout (developer machines, CI); a user's clone has none.
CORPORA = REPO.parent / "shared" / "corpora"
