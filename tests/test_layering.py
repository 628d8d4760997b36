"""Data flows one way: source archive -> compactor -> compacted archive -> reader -> consumer.
`keygroups` (model, formats, storage, packing) is what both sides share, so it imports
neither; `reader` never imports `compactor`, nor `compactor` the `reader`. Checked on the
source text, so a lazy import inside a function counts too."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "keygroups": {"compactor", "reader", "keyfill", "jobs", "bench", "tests"},
    "reader": {"compactor", "keyfill", "jobs", "bench", "tests"},
    "compactor": {"reader", "keyfill", "jobs", "bench", "tests"},
}


def imported_packages(path: Path) -> set[tuple[str, int]]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {(alias.name.split(".")[0], node.lineno) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add((node.module.split(".")[0], node.lineno))
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_downstream(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    bad = [
        f"{f.relative_to(ROOT)}:{line} imports {name}"
        for f in files
        for name, line in imported_packages(f)
        if name in FORBIDDEN[package]
    ]
    assert not bad, "layering broken:\n" + "\n".join(bad)


def test_keygroups_modules_do_not_import_the_compacted_facade() -> None:
    """`keygroups.compacted` re-exports the format's modules for code outside the package;
    a module of the package going through it would make the facade a layer the format
    depends on (and a cycle as soon as a defining module did)."""
    bad = [
        f"{f.relative_to(ROOT)}:{node.lineno}"
        for f in sorted((ROOT / "keygroups").rglob("*.py"))
        if f.name != "compacted.py"
        for node in ast.walk(ast.parse(f.read_text(), filename=str(f)))
        if (isinstance(node, ast.ImportFrom) and node.module == "keygroups.compacted")
        or (
            isinstance(node, ast.ImportFrom)
            and node.module == "keygroups"
            and any(a.name == "compacted" for a in node.names)
        )
        or (isinstance(node, ast.Import) and any(a.name == "keygroups.compacted" for a in node.names))
    ]
    assert not bad, "import from the defining module instead:\n" + "\n".join(bad)


def test_the_check_sees_lazy_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from compactor.job import compact\n    import reader.spark\n")
    assert {name for name, _ in imported_packages(module)} == {"compactor", "reader"}


def module_graph(package: str, root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (lazy imports included). A
    package is its `__init__`'s node. `from P import x` is an edge to P (its `__init__` runs
    and is where x is looked up first), and to P.x too when x is a module; so a module that
    imports its own package (`from compactor.sources import FORMATS` in a module the
    registry imports) closes a loop through the `__init__`. `import P.m` is an edge to P.m:
    the packages a dotted name passes through are not edges, as Python initialises them on
    the way to any of their modules (every module would otherwise depend on its package)."""
    modules = {}
    for f in sorted((root / package).rglob("*.py")):
        parts = f.relative_to(root).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    graph: dict[str, set[str]] = {}
    for name, f in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(f.read_text(), filename=str(f))):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                edges |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        graph[name] = {e for e in edges if e in modules and e != name}
    return graph


# Imports that close a loop through a package's `__init__` only by naming the package to
# reach one of its modules, left out of the cycle check with why they loop. Importing the
# module by its own name (`from keygroups._numba_seed import ...`) removes the edge, and then
# its entry: `test_every_allowed_edge_is_still_there` fails on an entry whose import is gone.
ALLOWED_EDGES: dict[tuple[str, str], str] = {}


def checked_graph(package: str) -> dict[str, set[str]]:
    graph = module_graph(package)
    return {m: {e for e in edges if (m, e) not in ALLOWED_EDGES} for m, edges in graph.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


PRODUCT = (*sorted(FORBIDDEN), "keyfill", "jobs")  # what a user installs


@pytest.mark.parametrize("package", PRODUCT)
def test_no_import_cycle_inside_a_package(package: str) -> None:
    """Each module builds on others without going round: a cycle would force lazy imports to
    break it and makes the modules one unit in fact."""
    found = cycles(checked_graph(package))
    assert not found, "modules that import each other round a loop:\n" + "\n".join(", ".join(c) for c in found)


def test_the_cycle_check_finds_one() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_cycle_check_goes_through_a_package_init(tmp_path: Path) -> None:
    """A registry in an `__init__` and a module it imports that reads the registry back (even
    lazily, inside a function) are one loop; a module reached through its package
    (`from pkg.sub import m`) depends on that package's `__init__` too."""
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("from pkg.fmt import Fmt\nREGISTRY = [Fmt]\n")
    (tmp_path / "pkg" / "fmt.py").write_text("class Fmt:\n    def f(self):\n        from pkg import REGISTRY\n")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("from pkg.sub.a import A\n")
    (tmp_path / "pkg" / "sub" / "a.py").write_text("from pkg.sub import b\nA = b\n")
    (tmp_path / "pkg" / "sub" / "b.py").write_text("import pkg.sub.a\n")
    graph = module_graph("pkg", tmp_path)
    assert graph["pkg.fmt"] == {"pkg"}
    assert graph["pkg.sub.a"] == {"pkg.sub", "pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"pkg.sub.a"}
    assert cycles(graph) == [["pkg", "pkg.fmt"], ["pkg.sub", "pkg.sub.a", "pkg.sub.b"]]


def test_every_allowed_edge_is_still_there() -> None:
    """An allowed edge whose import was changed is an entry to delete, not one to keep."""
    graphs = {package: module_graph(package) for package in PRODUCT}
    gone = [f"{m} -> {e}" for m, e in ALLOWED_EDGES if e not in graphs[m.split(".")[0]].get(m, set())]
    assert not gone, "delete these from ALLOWED_EDGES:\n" + "\n".join(gone)


@pytest.mark.parametrize("package", PRODUCT)
def test_a_long_module_says_why_in_its_docstring(package: str) -> None:
    """A module over 400 lines is usually two concepts: split it, or say in its docstring
    why it is one ("Over 400 lines ...")."""
    long = []
    for f in sorted((ROOT / package).rglob("*.py")):
        text = f.read_text()
        if text.count("\n") > 400 and "Over 400 lines" not in " ".join(
            (ast.get_docstring(ast.parse(text)) or "").split()
        ):
            long.append(f"{f.relative_to(ROOT)}: {text.count(chr(10))} lines")
    assert not long, "split these modules or say why they are one:\n" + "\n".join(long)


DOC_REF = re.compile(r"\b(?:docs/)?([A-Za-z0-9_-]+\.md)\b")
CODE_DIRS = ("keygroups", "compactor", "reader", "keyfill", "jobs", "bench", "tests")


def test_every_document_cited_is_in_the_repository() -> None:
    """Code and docs cite docs/*.md (or the README, CONTRIBUTING.md); a citation of a file the repository
    lacks (a design document kept elsewhere) points readers nowhere."""
    have = {p.name for p in (ROOT / "docs").glob("*.md")} | {p.name for p in ROOT.glob("*.md")}
    files = [p for d in CODE_DIRS for p in (ROOT / d).rglob("*.py")] + sorted((ROOT / "docs").glob("*.md"))
    files.append(ROOT / "README.md")
    missing = sorted(
        {
            f"{f.relative_to(ROOT)} cites {name}"
            for f in files
            for name in DOC_REF.findall(f.read_text())
            if name not in have and not name.startswith("test_")
        }
    )
    assert not missing, "\n".join(missing)


MAPPED = ("keygroups", "compactor", "reader", "keyfill", "jobs")


def has_code(init: Path) -> bool:
    """Whether a package's `__init__.py` holds more than a docstring, imports and `__all__`
    (a registry, a lazy `__getattr__`, functions...): then it is a module of its own."""
    for node in ast.parse(init.read_text(), filename=str(init)).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            continue
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if targets and all(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            continue
        return True
    return False


def unmapped_modules(doc: str, root: Path = ROOT, packages: tuple[str, ...] = MAPPED) -> list[str]:
    """Modules of each package that its section of the package map never names by their path
    in the package (`lease.py`, `storage/base.py`): a row of `sources/iceberg/source.py`
    does not describe `sources/kafka_connect/source.py`, nor does a row of
    `storage/__init__.py` describe `packing/__init__.py`. An `__init__.py` with only a
    docstring, imports and `__all__` needs no row; one with code of its own does
    (`__init__.py` for the section's package)."""
    sections = {s.split("`", 2)[1].rstrip("/"): s for s in re.split(r"^### ", doc, flags=re.M)[1:]}
    missing = []
    for package in packages:
        section = sections.get(package, "")
        for f in sorted((root / package).rglob("*.py")):
            rel = f.relative_to(root / package).as_posix()
            if f.name == "__init__.py" and not has_code(f):
                continue
            if f"`{rel}`" not in section:
                missing.append(f"{package}/{rel}")
    return missing


def test_the_package_map_names_every_module() -> None:
    """docs/architecture.md is where a newcomer finds which module owns what; a module added
    without a row there is one the map silently lacks."""
    missing = unmapped_modules((ROOT / "docs" / "architecture.md").read_text())
    assert not missing, "add these to the package map of docs/architecture.md:\n" + "\n".join(missing)


def test_the_map_check_finds_a_missing_module() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text().replace("`pacing.py`", "`pacing`")
    assert unmapped_modules(doc) == ["reader/pacing.py"]


def test_the_map_check_wants_an_init_with_code_by_its_path(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "other").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text('"""pkg."""\nfrom pkg.sub import x\n__all__ = ["x"]\n')
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("def x():\n    pass\n")
    (tmp_path / "pkg" / "other" / "__init__.py").write_text("REGISTRY = {}\n")
    doc = "### `pkg/`\n\n| module | owns |\n|---|---|\n| `other/__init__.py` | the registry |\n"
    assert unmapped_modules(doc, tmp_path, ("pkg",)) == ["pkg/sub/__init__.py"]
    assert unmapped_modules(doc + "| `sub/__init__.py` | x |\n", tmp_path, ("pkg",)) == []


def test_the_map_check_wants_a_nested_module_by_its_path(tmp_path: Path) -> None:
    for folder in ("a", "b"):
        (tmp_path / "pkg" / folder).mkdir(parents=True)
        (tmp_path / "pkg" / folder / "source.py").write_text("")
    doc = "### `pkg/`\n\n| module | owns |\n|---|---|\n| `a/source.py` | a |\n| `source.py` | nothing |\n"
    assert unmapped_modules(doc, tmp_path, ("pkg",)) == ["pkg/b/source.py"]


def test_the_public_entry_points_say_what_each_argument_is_for() -> None:
    """The functions a user calls first (docs/replay.md, docs/spark-source.md, docs/testing.md)
    carry an `Args:` section naming every parameter they take."""
    import inspect

    import reader
    import reader.spark
    from keyfill.testing import check_job, check_spark_query

    for fn in (reader.replay, reader.spark.register, check_job, check_spark_query):
        doc = inspect.getdoc(fn) or ""
        assert "\nArgs:\n" in doc, f"{fn.__qualname__}: no Args: section"
        args = doc.split("\nArgs:\n", 1)[1]
        for name in inspect.signature(fn).parameters:
            assert f"{name}:" in args or f"{name}," in args, f"{fn.__qualname__}: Args: does not name {name}"
