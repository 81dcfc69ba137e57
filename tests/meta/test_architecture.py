"""The package's shape, read with ``ast``: no import cycle (imports by name included), and
the folder rule: the core imports no subpackage; ``kinds`` only the core; ``integrations`` and
``storage`` the core and kinds; ``trainer`` those and storage; only ``tools`` and
``__main__`` import ``tools``."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(importlib.util.find_spec("latecast").submodule_search_locations[0])  # not imported
# folder -> the folders its modules may import ("" is the core)
ALLOWED = {
    "": {""},
    "integrations": {"", "integrations", "kinds"},
    "kinds": {"", "kinds"},
    "storage": {"", "kinds", "storage"},
    "trainer": {"", "kinds", "storage", "trainer"},
    "tools": {"", "integrations", "kinds", "storage", "trainer", "tools"},
}
ALIASES = {"lightning"}  # old names kept for programs that import them: they import the new


def module_name(package_dir: Path, path: Path) -> str:
    """``store`` for ``pkg/store.py``, ``storage.store`` for ``pkg/storage/store.py``;
    a subpackage's ``__init__.py`` is the subpackage itself."""
    parts = path.relative_to(package_dir).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def module_imports(path: Path, name: str, package: str, modules: set[str]) -> set[str]:
    """The package's modules ``name`` imports anywhere (``__init__`` for ``from . import X``),
    and by name: a string naming one given to a call (``import_module``, the CLI's
    ``_options("trainer.loop", ...)``)."""
    here = name.split(".")[:-1] if path.name != "__init__.py" else name.split(".")
    if name == "__init__":
        here = []
    found = set()

    def add(dotted: list[str], names: list[str]) -> None:
        base = ".".join(dotted)
        for n in names:
            if f"{base}.{n}".lstrip(".") in modules:  # from . import transforms
                found.add(f"{base}.{n}".lstrip("."))
            else:
                found.add(base or "__init__")

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] == package:
                    found.add(".".join(parts[1:]) or "__init__")
        elif isinstance(node, ast.ImportFrom):
            parts = (node.module or "").split(".") if node.module else []
            if node.level == 0:
                if not parts or parts[0] != package:
                    continue  # another library's module
                dotted = parts[1:]
            else:
                dotted = here[: len(here) - (node.level - 1)] + parts
            add(dotted, [a.name for a in node.names])
        elif isinstance(node, ast.Call):
            for arg in node.args:
                value = arg.value if isinstance(arg, ast.Constant) else None
                named = value.removeprefix(f"{package}.") if isinstance(value, str) else ""
                if named in modules and ("." in named or named != value):
                    found.add(named)
    return found


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module name (dotted, from the package) -> the package modules it imports."""
    paths = {module_name(package_dir, p): p for p in package_dir.rglob("*.py")}
    names = set(paths)
    return {
        m: module_imports(p, m, package_dir.name, names) - {m} for m, p in sorted(paths.items())
    }


def folder(module: str) -> str:
    return module.split(".")[0] if "." in module or module in ALLOWED else ""


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


def folder_breaches(graph: dict[str, set[str]]) -> list[str]:
    """``a imports b`` for each import the folder rule forbids; ``__main__`` (``python -m``)
    may start the command line, and ``__init__``'s lazy exports are no imports."""
    return [
        f"{m} imports {t}"
        for m in sorted(graph)
        if m != "__main__" and m not in ALIASES
        for t in sorted(graph[m])
        if t != "__init__" and folder(t) not in ALLOWED[folder(m)]
    ]


def test_no_import_cycle():
    cycle = find_cycle(import_graph(PACKAGE))
    assert not cycle, f"import cycle in {PACKAGE}: {' -> '.join(cycle)}"


def test_the_folder_rule():
    graph = import_graph(PACKAGE)
    assert {folder(m) for m in graph} == set(ALLOWED)  # the check sees every folder
    bad = folder_breaches(graph)
    assert not bad, f"imports against the folder rule: {'; '.join(bad)}"


def test_storage_and_the_data_types_load_without_torch():
    """``convert``'s workers and ``--help`` start without torch (about 2 s): the data types
    name torch only for type checkers, ``--help`` imports no command's module."""
    code = (
        "import sys, latecast.data, latecast.storage.convert\n"
        "from latecast.tools.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
        "assert 'torch' not in sys.modules and 'latecast.tools.doctor' not in sys.modules"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert "doctor" in out.stdout  # every command is listed all the same


def test_the_checks_see_every_kind_of_import(tmp_path):
    pkg = tmp_path / "pkg"
    for sub in ("storage", "tools"):
        (pkg / sub).mkdir(parents=True)
    files = {
        "__init__": "from .a import run\n",
        "a": "from . import b\n",
        "b": "def late():\n    from pkg.c import thing\n",  # inside a function
        "c": "import pkg.a\nimport numpy\nf('data', 'other.x')\n",  # no module named
        "d": "from pkg import run\n",  # a name from the package: __init__
        "e": "from .tools.cli import x\n",  # the core importing a tool
        "storage/__init__": "",
        "storage/store": "from ..a import run\nfrom . import fileio\n",
        "storage/fileio": "from ..tools import cli\n",  # storage importing a tool
        "tools/__init__": "",
        "tools/cli": "from ..storage.store import y\nfrom .. import e\n",
        "tools/late": "import importlib\nimportlib.import_module('pkg.tools.cli')\n",
        "tools/options": "def f():\n    return g('tools.late', 'Config')\n",  # by name
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
        "e": {"tools.cli"},
        "storage": set(),
        "storage.store": {"a", "storage.fileio"},
        "storage.fileio": {"tools.cli"},
        "tools": set(),
        "tools.cli": {"storage.store", "e"},
        "tools.late": {"tools.cli"},
        "tools.options": {"tools.late"},
    }
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    by_name = {m: graph[m] for m in ("tools.late", "tools.options")}  # cli imports options:
    assert find_cycle({**by_name, "tools.cli": {"tools.options"}}) == [
        "tools.cli",
        "tools.options",
        "tools.late",
        "tools.cli",
    ]
    assert folder_breaches(graph) == ["e imports tools.cli", "storage.fileio imports tools.cli"]
    assert find_cycle({"x": {"y"}, "y": set()}) == []


def private_names(path: Path) -> list[str]:
    """The private latecast names a script uses: imported, or an attribute of a latecast
    module it imported (``latecast.transforms._scale_shift``)."""
    tree = ast.parse(path.read_text(), str(path))
    found, modules = [], set()

    def private(dotted: str) -> bool:
        return any(p.startswith("_") and not p.startswith("__") for p in dotted.split("."))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "latecast":
                    found += [a.name] if private(a.name) else []
                    modules.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "latecast":
            for a in node.names:
                found += [f"{node.module}.{a.name}"] if private(f"{node.module}.{a.name}") else []
                modules.add(a.asname or a.name)  # a module or a function: both hold attributes
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in modules:
                found.append(ast.unparse(node))
    return found


def test_the_benchmark_scripts_use_only_public_names():
    scripts = sorted((Path(__file__).parents[2] / "benchmarks").glob("*.py"))
    assert len(scripts) > 5  # the check sees the scripts
    bad = {p.name: names for p in scripts if (names := private_names(p))}
    assert not bad, f"benchmarks/ reaching into latecast's private names: {bad}"


def test_the_private_name_check_sees_each_way_in(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(
        "import latecast\nimport latecast._x\nimport latecast.tools as t\n"
        "from latecast.tools.bench import _rates, recipe\nfrom latecast import transforms as T\n"
        "latecast.__version__, latecast.wrap, T._scale_shift, t.bench._y, recipe._z, other._w\n"
    )
    assert private_names(script) == [
        "latecast._x",
        "latecast.tools.bench._rates",
        "T._scale_shift",
        "t.bench._y",
        "recipe._z",
    ]
