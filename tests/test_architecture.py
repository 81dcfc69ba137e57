"""The package's shape, read from its source with ``ast``: no import cycle, and the library
never imports the tools (``bench``, ``profiling``, ``cli``) built on top of it."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

PACKAGE = Path(importlib.util.find_spec("latecast").submodule_search_locations[0])  # not imported
TOOLS = {"bench", "profiling", "cli", "__main__"}


def module_imports(path: Path, package: str, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` imports, at the top or inside functions;
    ``__init__`` for a name taken from the package itself (``from . import Loader``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {
                (a.name.split(".") + ["__init__"])[1]
                for a in node.names  # pkg.x -> x,
                if a.name.split(".")[0] == package
            }  # pkg alone -> __init__
        elif isinstance(node, ast.ImportFrom):
            parts = (node.module or "").split(".")
            if node.level == 0 and parts[0] == package:
                parts = parts[1:]
            elif node.level != 1:
                continue  # another library's module
            if parts and parts[0]:
                found.add(parts[0])  # from .store import x, from latecast.store import x
            else:  # from . import transforms, from latecast import Loader
                found |= {a.name if a.name in modules else "__init__" for a in node.names}
    return found


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module name -> the package modules it imports."""
    modules = {p.stem for p in package_dir.glob("*.py")}
    return {
        m: module_imports(package_dir / f"{m}.py", package_dir.name, modules) - {m} for m in modules
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle as ``[a, b, ..., a]``, or ``[]`` when there is none (depth-first)."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str]:
        if node in path:
            return path[path.index(node) :] + [node]
        if node in done:
            return []
        for after in sorted(graph.get(node, ())):
            if cycle := visit(after, path + [node]):
                return cycle
        done.add(node)
        return []

    return next((c for c in (visit(m, []) for m in sorted(graph)) if c), [])


def tool_imports(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{m} imports {t}" for m in sorted(set(graph) - TOOLS) for t in sorted(graph[m] & TOOLS)
    ]


def test_no_import_cycle():
    cycle = find_cycle(import_graph(PACKAGE))
    assert not cycle, f"import cycle in {PACKAGE}: {' -> '.join(cycle)}"


def test_the_library_never_imports_the_tools():
    bad = tool_imports(import_graph(PACKAGE))
    assert not bad, f"library modules import tool modules: {'; '.join(bad)}"


def test_the_checks_see_every_kind_of_import(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    files = {
        "__init__": "from .a import run\n",
        "a": "from . import b\n",
        "b": "def late():\n    from pkg.c import thing\n",  # inside a function
        "c": "import pkg.a\nimport numpy\n",
        "d": "from pkg import run\n",  # a name from the package: __init__
        "e": "from .profiling import x\n",
        "profiling": "",
        "cli": "from .a import run\n",
    }
    for name, text in files.items():
        (pkg / f"{name}.py").write_text(text)
    graph = import_graph(pkg)
    assert graph == {
        "__init__": {"a"},
        "a": {"b"},
        "b": {"c"},
        "c": {"a"},
        "d": {"__init__"},
        "e": {"profiling"},
        "profiling": set(),
        "cli": {"a"},
    }
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert tool_imports(graph) == ["e imports profiling"]
    assert find_cycle({"x": {"y"}, "y": set()}) == []
