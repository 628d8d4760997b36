"""Data flows one way: source archive -> compactor -> compacted archive -> reader -> consumer.
`keygroups` (model, formats, storage, packing) is what both sides share, so it imports
neither; `reader` never imports `compactor`, nor `compactor` the `reader`. Checked on the
source text, so a lazy import inside a function counts too."""

from __future__ import annotations

import ast
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


def test_the_check_sees_lazy_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from compactor.job import compact\n    import reader.spark\n")
    assert {name for name, _ in imported_packages(module)} == {"compactor", "reader"}
