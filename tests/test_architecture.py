"""The layer rule of the package, checked from the source (``ast``, no third-party tool).

Every import in ``bpe_core`` (at module level or inside a function) goes to the same or a lower
layer; the import graph has no cycle; no module imports a ``_private`` name from another module,
nor a compiled ``_kernel`` module of another sub-package; only the reference twins and the tests
import ``bpe_core.reference``. ``docs/architecture.md`` draws the layers.
"""
import ast
import pathlib

import pytest

PKG = pathlib.Path(__file__).resolve().parents[1] / "bpe_core"

#: Lowest first. A module may import from its own layer (within its sub-package) or any lower one.
LAYERS = [
    ("errors",),
    ("runtime",),
    ("corpus",),
    ("pretok",),
    ("engine",),
    ("formats",),
    ("encode",),
    ("config",),
    ("methods",),
    ("training", "export", "transformers_tokenizer"),
    ("evaluate",),
    ("__init__",),
    ("cli",),           # the command line: any part of the package, through its public names
    ("__main__",),
]
LAYER_OF = {part: i for i, parts in enumerate(LAYERS) for part in parts}
#: The plain twins: they may use only these parts of the package (the definitions of the semantics).
REFERENCE_MAY_IMPORT = {"errors", "corpus", "pretok", "reference"}
#: ``corpus/`` flows one way (find the inputs -> cut shards -> open a reader per format -> read
#: ranges, then the low-level helpers): a module imports only modules after it in this list.
CORPUS_ORDER = ["inputs", "shards", "readers", "ranges", "chunks", "files", "specials"]


def module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def kernels() -> set[str]:
    """The compiled modules (``_*.pyx``), by dotted name."""
    return {module_name(p) for p in PKG.rglob("_*.pyx")}


def is_package(path: pathlib.Path) -> bool:
    return path.name == "__init__.py"


def imports_of(name: str, path: pathlib.Path, typing_too: bool = False) -> list[tuple[str, list[str], int]]:
    """(imported module, imported names, line) for every import in the file, relative ones resolved
    (with ``typing_too``, those under ``if TYPE_CHECKING:`` too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if is_package(path) else name.rsplit(".", 1)[0]
    out = []
    for node in (ast.walk(tree) if typing_too else _walk_runtime(tree)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "bpe_core":
                    out.append((alias.name, [], node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level > 1:
                    base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "bpe_core":
                continue
            out.append((target, [a.name for a in node.names], node.lineno))
    return out


def _walk_runtime(tree):
    """``ast.walk``, minus the bodies of ``if TYPE_CHECKING:`` (imports for annotations only)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
                todo.extend(child.orelse)
                continue
            todo.append(child)


def resolve(target: str, names: list[str], known) -> list[str]:
    """The bpe_core modules an import statement loads: ``from pkg import mod`` names the module
    ``pkg.mod``; ``from mod import name`` names ``mod``."""
    mods = [f"{target}.{n}" for n in names if f"{target}.{n}" in known]
    if not names or len(mods) < len(names):
        mods.append(target)
    return mods


def top_part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def graph(typing_too: bool = False) -> dict[str, set[str]]:
    known = modules()
    edges: dict[str, set[str]] = {m: set() for m in known}
    for name, path in known.items():
        for target, names, _ in imports_of(name, path, typing_too):
            for mod in resolve(target, names, known):
                if mod in known and mod != name:
                    edges[name].add(mod)
    return edges


def test_every_module_has_a_layer():
    unknown = sorted({top_part(m) for m in modules()} - set(LAYER_OF) - {"reference", "data"})
    assert not unknown, f"sub-packages or modules with no layer in LAYERS: {unknown}"


def test_imports_only_go_down():
    known = modules()
    bad = []
    for name, path in known.items():
        src = top_part(name)
        for target, names, line in imports_of(name, path):
            for mod in resolve(target, names, known):
                dst = top_part(mod)
                if src == "reference":
                    if dst not in REFERENCE_MAY_IMPORT:
                        bad.append(f"{name}:{line} (reference) imports {mod}")
                    continue
                if dst == "reference":
                    bad.append(f"{name}:{line} imports the reference twin {mod}: the fast path never does")
                    continue
                if dst == "data" or src == dst:
                    continue
                if LAYER_OF[dst] > LAYER_OF[src] or (LAYER_OF[dst] == LAYER_OF[src] and src != dst):
                    bad.append(f"{name}:{line} ({src}) imports {mod} ({dst}): a higher or sibling layer")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("typing_too", [False, True], ids=["runtime", "with-type-checking-imports"])
def test_no_import_cycles(typing_too):
    """No cycle in the import graph, not even through imports made for type checkers only
    (``if TYPE_CHECKING:``): a cycle there still ties two layers together for a reader."""
    edges = graph(typing_too)
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                cycles.append(" -> ".join(stack[stack.index(n):] + [n]))
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    # A package's __init__ re-exports its own modules: the edge pkg -> pkg.mod is not a cycle with
    # pkg.mod -> pkg.other (Python imports the package first); only report cycles between modules.
    real = [c for c in cycles if not all(part.count(".") == 0 for part in c.split(" -> "))]
    real = [c for c in real if not _only_package_init(c)]
    assert not real, "import cycles:\n" + "\n".join(real)


def _only_package_init(cycle: str) -> bool:
    """A 'cycle' through a package's own ``__init__`` and its submodule (pkg -> pkg.mod -> pkg)."""
    nodes = cycle.split(" -> ")
    return any(all(n == p or n.startswith(p + ".") for n in nodes) and p in nodes for p in nodes)


def test_corpus_flows_one_way():
    """Within ``bpe_core.corpus`` a module imports only modules after it in ``CORPUS_ORDER`` (never
    one before it, never the package ``__init__``, which re-exports the helpers), and every module
    of ``corpus/`` has its place in the list."""
    known = modules()
    rank = {f"bpe_core.corpus.{m}": i for i, m in enumerate(CORPUS_ORDER)}
    inside = {m for m in known if m.startswith("bpe_core.corpus.")}
    bad = [f"{m} has no place in CORPUS_ORDER" for m in sorted(inside - set(rank))]
    for name in sorted(inside & set(rank)):
        for target, names, line in imports_of(name, known[name]):
            for mod in resolve(target, names, known):
                if mod == "bpe_core.corpus":
                    bad.append(f"{name}:{line} imports the package bpe_core.corpus (import its modules)")
                elif mod in rank and mod != name and rank[mod] < rank[name]:
                    bad.append(f"{name}:{line} imports {mod}, which comes before it in CORPUS_ORDER "
                               f"(corpus/ flows one way)")
    assert not bad, "\n".join(bad)


def test_no_private_names_across_modules():
    known = modules()
    compiled = kernels()
    bad = []
    for name, path in known.items():
        package = name if is_package(path) else name.rsplit(".", 1)[0]
        for target, names, line in imports_of(name, path):
            for n in names:
                if n.startswith("_") and not n.startswith("__") and f"{target}.{n}" not in known \
                        and f"{target}.{n}" not in compiled:
                    # a private name (not a module) from another module
                    if target != name:
                        bad.append(f"{name}:{line} imports the private name {n} from {target}")
            for mod in resolve(target, names, set(known) | compiled):
                last = mod.rsplit(".", 1)[-1]
                if last.startswith("_") and not last.startswith("__"):
                    owner = mod.rsplit(".", 1)[0]
                    if owner != package:
                        bad.append(f"{name}:{line} imports the kernel {mod} of another sub-package "
                                   f"(use its public wrapper)")
    # compiled kernels are not .py files: check the names of the imported modules themselves
    assert not bad, "\n".join(sorted(set(bad)))


@pytest.mark.parametrize("snippet,expected", [
    ("from .x import _y", "private name"),
    ("from ..engine._engine import MergeEngine", "kernel"),
])
def test_the_checks_can_fail(tmp_path, snippet, expected):
    """The checks above catch what they are for (a planted bad import in a copy of a module)."""
    global PKG
    fake = tmp_path / "bpe_core"
    (fake / "methods").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "methods" / "__init__.py").write_text("")
    (fake / "methods" / "x.py").write_text("_y = 1\n")
    (fake / "methods" / "bad.py").write_text(snippet + "\n")
    (fake / "engine").mkdir()
    (fake / "engine" / "__init__.py").write_text("")
    old = PKG
    PKG = fake
    try:
        with pytest.raises(AssertionError, match=expected):
            test_no_private_names_across_modules()
    finally:
        PKG = old


def test_a_planted_upward_import_and_cycle_are_caught(tmp_path):
    global PKG
    fake = tmp_path / "bpe_core"
    (fake / "corpus").mkdir(parents=True)
    (fake / "methods").mkdir()
    for d in ("", "corpus", "methods"):
        (fake / d / "__init__.py").write_text("")
    (fake / "corpus" / "a.py").write_text("from ..methods import b\n")
    (fake / "methods" / "b.py").write_text("from ..corpus import a\n")
    old = PKG
    PKG = fake
    try:
        with pytest.raises(AssertionError, match="higher or sibling layer"):
            test_imports_only_go_down()
        with pytest.raises(AssertionError, match="import cycles"):
            test_no_import_cycles(False)
    finally:
        PKG = old


# ---- method decisions live behind the method interface ---------------------------------------------

TOOLS = PKG.parent / "tools"


def method_names() -> set[str]:
    from bpe_core.formats import registry

    return set(registry.names()) | {"bpe", "superbpe", "supratok"}


def method_comparisons(path: pathlib.Path, names: set[str]) -> list[str]:
    """Places that compare something called ``method`` (``config.method``, ``args.method``,
    ``method``) with a method's name: ``x.method == "bpe"``, ``method in ("superbpe", ...)``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))

    def is_method(node) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "method") or \
            (isinstance(node, ast.Name) and node.id == "method")

    def names_a_method(node) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(names_a_method(e) for e in node.elts)
        return False

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(is_method(x) for x in sides) and any(names_a_method(x) for x in sides):
                out.append(f"{path.name}:{node.lineno}")
    return out


def test_no_method_name_comparisons_outside_methods():
    """What differs between methods is a member of ``formats.registry.Method``: no stage, tool or
    format asks which method it runs (``docs/architecture.md``, "How a method plugs in")."""
    names = method_names()
    bad = []
    for path in sorted(PKG.rglob("*.py")) + sorted(TOOLS.glob("*.py")):
        rel = path.relative_to(PKG.parent)
        if rel.parts[:2] in (("bpe_core", "methods"), ("bpe_core", "reference")):
            continue
        bad += [f"{rel.parent}/{place}" for place in method_comparisons(path, names)]
    assert not bad, "method-name comparisons outside bpe_core/methods/:\n" + "\n".join(bad)


@pytest.mark.parametrize("snippet", [
    'if config.method == "bpe":\n    pass\n',
    'x = args.method in ("superbpe", "supratok")\n',
    'drop = method != "superbpe"\n',
])
def test_a_planted_method_comparison_is_caught(tmp_path, snippet):
    path = tmp_path / "stage.py"
    path.write_text(snippet)
    assert method_comparisons(path, method_names()) == ["stage.py:1"]


@pytest.mark.parametrize("snippet", ["from .inputs import expand_inputs", "from . import shards",
                                     "from ..corpus import inputs", "from ..corpus import check_input",
                                     "import bpe_core.corpus.inputs"])
def test_a_planted_backward_import_in_corpus_is_caught(tmp_path, snippet):
    """``ranges`` importing ``inputs`` (or ``shards``, or the package) breaks the one-way flow;
    the same imports the other way round are fine."""
    global PKG
    fake = tmp_path / "bpe_core"
    (fake / "corpus").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "corpus" / "__init__.py").write_text("from .files import check_input\n")
    for m in CORPUS_ORDER:
        (fake / "corpus" / f"{m}.py").write_text("")
    (fake / "corpus" / "inputs.py").write_text("from .ranges import x\nfrom . import shards, files\n")
    old = PKG
    PKG = fake
    try:
        test_corpus_flows_one_way()
        (fake / "corpus" / "ranges.py").write_text(snippet + "\n")
        with pytest.raises(AssertionError, match="bpe_core.corpus.ranges:1 imports"):
            test_corpus_flows_one_way()
        (fake / "corpus" / "ranges.py").write_text("")
        (fake / "corpus" / "extra.py").write_text("")
        with pytest.raises(AssertionError, match="extra has no place"):
            test_corpus_flows_one_way()
    finally:
        PKG = old
