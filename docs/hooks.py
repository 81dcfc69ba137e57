"""mkdocs hook, two markers, each a line of its own in a page:

- ``<!-- options: latecast.NAME -->`` becomes a table of NAME's keyword options (name, type,
  default, meaning), read from the code as the site is built, so the reference lists what the
  code takes. The meaning is the docstring's ``Args:`` entry, else the comment beside a
  dataclass field; ``wrap``'s ``**options`` are the fields of the dataclass its module checks
  them with (``Fields``).
- ``<!-- include: PATH -->`` becomes the Markdown file PATH (relative to the repository), its
  headings one level down and its relative links (to raw outputs, not pages) left as text.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import sys
from pathlib import Path

MARK = re.compile(r"^<!-- options: (latecast(?:\.\w+)+) -->$", re.M)
INCLUDE = re.compile(r"^<!-- include: (\S+\.md) -->$", re.M)
LOCAL_LINK = re.compile(r"\[([^\]]+)\]\((?!https?:)[^)]*\)")  # [`cpu/`](cpu/) -> `cpu/`
FIELD = re.compile(r"^\s+(\w+): [^#]*?#\s*(.+)$")  # `name: type = default  # meaning`
ARG = re.compile(r"^ {4}(\w+(?:, \w+)*):\s*(.*)$")  # an `Args:` entry, docstring dedented
WRAP_OPTIONS = "Fields"  # wrap(**options) is Fields(**options), in wrap's own module


def resolve(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def meanings(obj) -> dict[str, str]:
    """Each documented option's text: the docstring's ``Args:`` entries (joined lines, a
    shared entry such as ``shuffle, seed`` given to each), then dataclass field comments."""
    found: dict[str, str] = {}
    names: list[str] = []
    doc = (inspect.getdoc(obj) or "").split("\nArgs:\n", 1)
    for line in doc[1].splitlines() if len(doc) == 2 else []:
        entry = ARG.match(line)
        if entry:
            names = entry[1].split(", ")
            found.update(dict.fromkeys(names, entry[2]))
        elif names and line.startswith(" " * 8) and line.strip():
            found.update({n: f"{found[n]} {line.strip()}" for n in names})
        elif not line.startswith(" "):
            break  # the next section (Example:)
    if dataclasses.is_dataclass(obj):
        for line in inspect.getsource(obj).splitlines():
            field = FIELD.match(line)
            if field:
                found.setdefault(field[1], field[2])
    return found


def rows(obj) -> list[tuple[str, str, str, str]]:
    """(name, type, default, meaning) of every keyword ``obj`` takes."""
    options = (
        sys.modules[obj.__module__].__dict__.get(WRAP_OPTIONS) if obj.__name__ == "wrap" else None
    )
    if obj.__name__ == "wrap" and options is None:
        raise LookupError(
            f"docs/hooks.py: wrap's options class {WRAP_OPTIONS} is not in {obj.__module__}"
        )
    text = {**(meanings(options) if options else {}), **meanings(obj)}
    out = []
    params = [p for p in inspect.signature(obj).parameters.values() if p.kind != p.VAR_KEYWORD]
    if options:
        params += [
            inspect.Parameter(
                f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type
            )
            for f in dataclasses.fields(options)
        ]
    for p in params:
        kind = (
            p.annotation
            if isinstance(p.annotation, str)
            else inspect.formatannotation(p.annotation)
        )
        default = "required" if p.default is p.empty else f"`{p.default!r}`"
        out.append(
            (p.name, kind if p.annotation is not p.empty else "", default, text.get(p.name, ""))
        )
    return out


def table(path: str) -> str:
    lines = ["| option | type | default | meaning |", "|---|---|---|---|"]
    for name, kind, default, meaning in rows(resolve(path)):
        cell = meaning.replace("|", "\\|")
        lines.append(f"| `{name}` | `{kind}` | {default} | {cell} |".replace("``", ""))
    return "\n".join(lines)


def include(path: str, config) -> str:
    lines, fenced = [], False
    for line in (Path(config.config_file_path).parent / path).read_text().splitlines():
        fenced ^= line.startswith("```")
        heading = not fenced and line.startswith("#")
        lines.append("#" + line if heading else line if fenced else LOCAL_LINK.sub(r"\1", line))
    return "\n".join(lines)


def on_page_markdown(markdown: str, config, **_) -> str:
    markdown = INCLUDE.sub(lambda m: include(m[1], config), markdown)
    return MARK.sub(lambda m: table(m[1]), markdown)
