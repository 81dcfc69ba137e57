"""The docs: the site builds with warnings as errors, the API reference names every public
name and option, every Python snippet is cut verbatim from an example the tests run."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import latecast

ROOT = Path(__file__).resolve().parents[2]
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
SECTION = re.compile(
    r"^[ \t]*# --8<-- \[start:(\w+)\]\n(.*?)^[ \t]*# --8<-- \[end:\1\]$", re.S | re.M
)
TESTS = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))


def run_by_a_test(example: Path) -> bool:
    """An example a test runs: its file name appears in a test module (all of them launch
    examples by name)."""
    return example.parent.name == "examples" and f'"{example.name}' in TESTS


def sections(text: str) -> list[str]:
    """An example's marked sections, each the lines between ``# --8<-- [start:NAME]`` and
    ``# --8<-- [end:NAME]``, dedented and stripped: what a docs block copies."""
    return [textwrap.dedent(body).strip() for _, body in SECTION.findall(text)]


def wrap_options() -> list[str]:
    """``wrap``'s keyword options, as its own error for an unknown one lists them."""
    with pytest.raises(latecast.LatecastError, match="the options: ") as err:
        latecast.wrap([], nonsense=1)
    return str(err.value).split("the options: ")[1].split(", ")


def build_site(out: Path) -> None:
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings_handlers.python")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,  # mkdocs.yml's paths (docs/, src/) are the repository's
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # the theme's banner, not a warning
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


def options_table(api: str, name: str) -> list[list[str]]:
    """The cells of each row of the hook's options table for ``latecast.NAME``."""
    after = api.split(f'id="latecast.{name}"')[1]  # the hook's table, after its docstring's
    table = after[after.index("<th>option</th>") :].split("</table>")[0]
    return [re.findall(r"<td>(.*?)</td>", row, re.S) for row in table.split("<tr>")[1:]]


def test_the_site_builds_strict_with_every_public_name_and_option_in_the_api_reference(tmp_path):
    """One build (about 10 s): no warning; every name of ``latecast.__all__`` has its entry;
    every option of the main entry points is a row with its type and default."""
    build_site(tmp_path)
    api = (tmp_path / "api" / "index.html").read_text()
    missing = [name for name in latecast.__all__ if f'id="latecast.{name}"' not in api]
    assert not missing, f"not in docs/api.md: {missing}"
    for name in ["Loader", "wrap", "jpeg", "Augment", "transforms.Mix", "Erasing"]:
        obj = latecast
        for part in name.split("."):
            obj = getattr(obj, part)
        options = list(inspect.signature(obj).parameters)
        if name == "wrap":
            options = [o for o in options if o != "options"] + wrap_options()
        cells = options_table(api, name)
        assert {c[0] for c in cells} >= {f"<code>{o}</code>" for o in options}, name
        assert all(len(c) == 4 and c[1] and c[2] for c in cells), name  # a type and a default


def test_readme_python_snippets_are_verbatim_from_tested_examples():
    """Each Python block of the README is a run of lines of an example the tests run."""
    examples = {p: p.read_text() for p in (ROOT / "examples").glob("*.py")}
    blocks = PYTHON_BLOCK.findall((ROOT / "README.md").read_text())
    assert blocks
    for block in blocks:
        found = [p for p, text in examples.items() if f"\n{block}" in text]
        assert found, f"not cut from any file under examples/:\n{block}"
        assert any(map(run_by_a_test, found)), f"{found} is run by no test"


def test_docs_python_snippets_are_verbatim_sections_of_tested_examples():
    """Each block is a marked section (``# --8<-- [start:NAME]``..``[end:NAME]``, dedented)
    or the whole file, never included (``--8<--``): it reads the same off the site."""
    pages = {page.name: page.read_text() for page in sorted((ROOT / "docs").glob("*.md"))}
    including = [name for name, text in pages.items() if "--8<--" in text]
    assert not including, f"an include line, not the code, in docs/{including}"
    examples = {p: p.read_text() for p in (ROOT / "examples").glob("*.py")}
    cuts = {p: [*sections(text), text.strip()] for p, text in examples.items()}
    blocks = [(n, b.strip()) for n, text in pages.items() for b in PYTHON_BLOCK.findall(text)]
    assert blocks
    for page, block in blocks:
        found = [p for p, cut in cuts.items() if block in cut]
        assert found, f"{page}: no marked section of a file under examples/ is this:\n{block}"
        assert any(map(run_by_a_test, found)), f"{page}: {found} is run by no test"


def test_the_quickstart_example_trains(tmp_path):
    """examples/quickstart.py, the README's Loader, reaches its accuracy on the bundled MNIST."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 0 and "test accuracy 0." in proc.stdout, proc.stderr[-2000:]


def test_every_test_reliability_md_cites_exists():
    """Each row of docs/RELIABILITY.md names at least one test as ``tests/LAYER/FILE::NAME`` (a
    parametrised id after it allowed), and each is a test function defined in that file."""
    import ast

    text = (ROOT / "docs" / "RELIABILITY.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    rows = [row for row in rows if not row.startswith("| fault |")]
    assert len(rows) > 100
    defined: dict[str, set[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        tree = ast.parse(path.read_text())
        key = path.relative_to(ROOT / "tests").as_posix()  # core/test_loader.py
        defined[key] = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    missing = []
    for row in rows:
        cited = re.findall(r"`tests/(\w+/\w+\.py)::(\w+)(?:\[[^\]`]*\])?`", row.split(" | ")[-1])
        assert cited, f"a row cites no test: {row[:120]}"
        missing += [f"{f}::{name}" for f, name in cited if name not in defined.get(f, ())]
    assert not missing, f"docs/RELIABILITY.md cites tests that do not exist: {missing}"
