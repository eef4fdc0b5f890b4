"""The code's shape, as ARCHITECTURE.md states it: the import graph of workbench/ (every import,
inside functions and under TYPE_CHECKING too) runs one way down the layers of pyproject.toml,
with no circle. (Code is sized by what it does: the file and function length bounds of an earlier
issue are retired.)"""

from __future__ import annotations

import ast
from pathlib import Path

import tomllib

PACKAGE = Path(__file__).resolve().parents[1] / "workbench"


def modules() -> dict[str, Path]:
    out = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        parts = f.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = f
    return out


def imports() -> set[tuple[str, str, int]]:
    """(importer, imported, line) for every import of one workbench module by another."""
    mods, edges = modules(), set()
    for name, f in mods.items():
        package = name if f.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names
                ]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            edges |= {(name, t, node.lineno) for t in targets if t in mods and t != name}
    return edges


def layer_of(module: str, layers: list[str]) -> tuple[int, str] | None:
    for i, row in enumerate(layers):
        for member in (m.strip() for m in row.split("|")):
            if module == member or module.startswith(member + "."):
                return i, member
    return None


def test_every_import_runs_down_the_layers():
    pyproject = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    layers = pyproject["tool"]["importlinter"]["contracts"][0]["layers"]
    top = {n.split(".")[1] for n in modules() if n.count(".") >= 1}
    unplaced = sorted(t for t in top if layer_of(f"workbench.{t}", layers) is None)
    assert unplaced == [], f"modules in no layer of pyproject.toml: {unplaced}"
    upward = []
    for a, b, line in sorted(imports()):
        if a == "workbench":  # the package's own __init__: the public API, above every layer
            continue
        (la, ma), (lb, mb) = layer_of(a, layers), layer_of(b, layers)
        if ma != mb and (lb < la or lb == la):  # up a layer, or across one row's siblings
            upward.append(f"{a} -> {b} (line {line})")
    assert upward == []


def test_no_module_imports_itself_round_a_circle():
    graph: dict[str, set[str]] = {}
    for a, b, _ in imports():
        graph.setdefault(a, set()).add(b)
    seen, on_path, circles = set(), [], []

    def walk(node: str) -> None:
        seen.add(node)
        on_path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in on_path:
                circles.append(on_path[on_path.index(nxt) :] + [nxt])
            elif nxt not in seen:
                walk(nxt)
        on_path.pop()

    for node in sorted(graph):
        if node not in seen:
            walk(node)
    assert circles == []
