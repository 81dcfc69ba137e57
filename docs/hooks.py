"""mkdocs hook, two markers, each a line of its own in a page:

- ``<!-- options: latecast.NAME -->`` becomes a table of NAME's keyword options (name, type,
  default, meaning), read from the code as the site is built, so the reference lists what the
  code takes. The meaning is the docstring's ``Args:`` entry, else the comment beside a
  dataclass field; ``wrap``'s ``**options`` are the fields of the dataclass its module checks
  them with (``Options``).
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
OPTIONS = "Options"  # wrap(**options) is Options.of(options), a dataclass wrap's module imports


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


def keywords(obj) -> list[inspect.Parameter]:
    """``obj``'s parameters; a ``**options`` is the fields of the options dataclass in its
    module (wrap's ``Options``), each with its type and default."""
    params = list(inspect.signature(obj).parameters.values())
    if not any(p.kind == p.VAR_KEYWORD for p in params):
        return params
    options = vars(sys.modules[obj.__module__]).get(OPTIONS)
    if not dataclasses.is_dataclass(options):
        raise LookupError(f"docs/hooks.py: {obj.__name__}'s **options: no {OPTIONS} beside it")
    kw = inspect.Parameter.KEYWORD_ONLY
    fields = [inspect.Parameter(f.name, kw, default=f.default, annotation=f.type)
              for f in dataclasses.fields(options)]  # fmt: skip
    return [p for p in params if p.kind != p.VAR_KEYWORD] + fields


def rows(obj) -> list[tuple[str, str, str, str]]:
    """(name, type, default, meaning) of every keyword ``obj`` takes."""
    options = vars(sys.modules[obj.__module__]).get(OPTIONS)
    text = {**(meanings(options) if dataclasses.is_dataclass(options) else {}), **meanings(obj)}
    out = []
    for p in keywords(obj):
        kind = "" if p.annotation is p.empty else p.annotation
        kind = kind if isinstance(kind, str) else inspect.formatannotation(kind)
        default = "required" if p.default is p.empty else f"`{p.default!r}`"
        out.append((p.name, kind, default, text.get(p.name, "")))
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
