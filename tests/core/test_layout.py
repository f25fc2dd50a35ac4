"""The package's folders are the data flow, and no module imports one that imports it back."""

from __future__ import annotations

import ast
from pathlib import Path

import semviz

ROOT = Path(semviz.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every semviz module ``name`` imports, at module level or inside a function
    (``TYPE_CHECKING`` blocks included): a lazy import still ties the two together."""
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names
            ]
        else:
            continue
        out.update(t for t in targets if t in modules and t != name)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_one_that_imports_it_back():
    modules = _modules()
    # a package's __init__ re-exports its children; a child that reads a sibling through the
    # package would close a loop through the __init__, so those edges count too
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _cycles(graph) == []


def test_the_top_level_holds_stages_not_modules():
    """A newcomer sees the data flow as folders: the model and its forward, sampling, gravity,
    eviction, the decoder, analysis, the frontier, output and the CLI."""
    stages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    stages |= {p.stem for p in ROOT.glob("*.py")} - {"__init__", "__main__"}
    assert stages == {
        "analysis",
        "cli",
        "decoding",
        "eviction",
        "frontier",
        "gravity",
        "model",
        "output",
        "processors",
        "sampling",
        "tasks",
    }
