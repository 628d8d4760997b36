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


def module_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (lazy imports included). A
    package's `__init__` is the package's own node: `from keygroups import envelope` is an
    edge to `keygroups.envelope`, whichever file defines it."""
    modules = {}
    for f in sorted((ROOT / package).rglob("*.py")):
        parts = f.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    graph: dict[str, set[str]] = {}
    for name, f in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(f.read_text(), filename=str(f))):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                edges |= {
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                    for a in node.names
                }
        graph[name] = {e for e in edges if e in modules and e != name and not name.startswith(e + ".")}
    return graph


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


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_import_cycle_inside_a_package(package: str) -> None:
    """Each module builds on others without going round: a cycle would force lazy imports to
    break it and makes the modules one unit in fact."""
    assert not cycles(module_graph(package))


def test_the_cycle_check_finds_one() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
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
    """Code and docs cite docs/*.md (or the README); a citation of a file the repository
    lacks (a design document kept elsewhere) points readers nowhere."""
    have = {p.name for p in (ROOT / "docs").glob("*.md")} | {"README.md", "CHANGELOG.md"}
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


def unmapped_modules(doc: str) -> list[str]:
    """Modules of each package that its section of the package map never names (by its path
    in the package, or its file name)."""
    sections = {s.split("`", 2)[1].rstrip("/"): s for s in re.split(r"^### ", doc, flags=re.M)[1:]}
    missing = []
    for package in MAPPED:
        section = sections.get(package, "")
        for f in sorted((ROOT / package).rglob("*.py")):
            rel = f.relative_to(ROOT / package).as_posix()
            if f.name == "__init__.py" and rel.count("/") == 0:
                continue  # the package itself: its heading
            if f"`{rel}`" not in section and f"`{f.name}`" not in section and f"{f.name}`" not in section:
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
