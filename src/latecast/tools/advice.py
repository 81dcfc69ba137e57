"""The edits ``latecast doctor`` proposes, found in the script's source with ``ast``: hunks of
whole lines to apply as written (tests/tools/test_doctor.py does). 8-bit images: the transform's
``ToTensor()`` (and its ``Normalize``) become ``PILToTensor()`` and *every* DataLoader sharing
that ``ToTensor`` goes through ``latecast.wrap`` with its mean and std. Batches made per call
(nanoGPT's ``get_batch``): the statements moving them become ``mover((x, y))``, one
``latecast.Mover`` made before. Elsewhere the advice stays in words, and says so."""

from __future__ import annotations

import ast
import tokenize
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Edit:
    """Lines ``old`` of ``file`` from ``line`` on (1-based) become ``new``."""

    file: str
    line: int
    old: list[str]
    new: list[str]

    def shown(self) -> list[str]:
        end = self.line + len(self.old) - 1
        at = f"{self.file}:{self.line}" + (f"-{end}" if end > self.line else "")
        return [f"--- {at}", *(f"-{x}" for x in self.old), *(f"+{x}" for x in self.new)]


class Source:
    """One file of the script: its lines, tree and replacements (at ``ast``'s positions)."""

    def __init__(self, path: str) -> None:
        with tokenize.open(path) as f:  # as Python reads it: its coding line, else UTF-8
            text = f.read()
        self.path, self.text, self.lines, self.tree = path, text, text.splitlines(), ast.parse(text)
        self.parent = {c: p for p in ast.walk(self.tree) for c in ast.iter_child_nodes(p)}
        self.spans: list[tuple[int, int, int, int, str]] = []

    def segment(self, node: ast.AST) -> str:
        return ast.get_source_segment(self.text, node)

    def replace(self, node: ast.AST, text: str, end: ast.AST | None = None) -> None:
        end = end or node
        self.spans.append((node.lineno, node.col_offset, end.end_lineno, end.end_col_offset, text))

    def insert(self, line: int, text: str) -> None:
        """A line ``text`` before line ``line`` (after the last, past the end)."""
        if line <= len(self.lines):
            self.spans.append((line, 0, line, 0, text + "\n"))
        else:
            end = len(self.lines[-1].encode())
            self.spans.append((len(self.lines), end, len(self.lines), end, "\n" + text))

    def call(self, line: int, names: tuple[str, ...]) -> ast.Call | None:
        """The one call of a function or class in ``names`` spanning ``line``, else None."""
        calls = [c for c in ast.walk(self.tree) if isinstance(c, ast.Call)]
        found = [c for c in calls if _name(c.func) in names and c.lineno <= line <= c.end_lineno]
        return found[0] if len(found) == 1 else None

    def ancestors(self, node: ast.AST):
        while node in self.parent:
            node = self.parent[node]
            yield node

    def top(self, node: ast.AST) -> ast.stmt:
        """The statement at the top of the module that holds ``node``."""
        return next(n for n in (node, *self.ancestors(node)) if self.parent.get(n) is self.tree)

    def import_line(self, module: str) -> str:
        """The name ``module`` is imported under at the top, its ``import`` added if none."""
        for stmt in self.tree.body:
            for alias in stmt.names if isinstance(stmt, ast.Import) else ():
                if alias.name == module:
                    return alias.asname or module
        last = [s for s in self.tree.body if isinstance(s, (ast.Import, ast.ImportFrom))]
        self.insert(last[-1].end_lineno + 1 if last else 1, f"import {module}")
        return module

    def edits(self, shown: str) -> list[Edit]:
        """The replacements as hunks of whole lines, overlapping ones merged, in order."""
        hunks: list[list] = []
        for span in sorted(set(self.spans)):
            if hunks and span[0] <= hunks[-1][1]:
                hunks[-1][1] = max(hunks[-1][1], span[2])
                hunks[-1][2].append(span)
            else:
                hunks.append([span[0], span[2], [span]])
        return [
            Edit(shown, first, self.lines[first - 1 : last], self._applied(first, last, spans))
            for first, last, spans in hunks
        ]

    def _applied(self, first: int, last: int, spans: list) -> list[str]:
        """Lines ``first..last`` with ``spans`` replaced (from the last: earlier offsets hold)."""
        rows = [x.encode() for x in self.lines[first - 1 : last]]
        starts = [sum(len(r) + 1 for r in rows[:i]) for i in range(len(rows))]
        text = b"\n".join(rows)
        for l0, c0, l1, c1, new in sorted(spans, reverse=True):
            a, b = starts[l0 - first] + c0, starts[l1 - first] + c1
            text = text[:a] + new.encode() + text[b:]
        return text.decode().split("\n")


def _name(func: ast.AST) -> str:
    """``DataLoader`` for ``DataLoader``, ``torch.utils.data.DataLoader`` and the like."""
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def to_uint8(src: Source, to_tensor: int, normalize: int | None) -> str | None:
    """The ``ToTensor()`` made at line ``to_tensor`` (and the ``Normalize`` made at line
    ``normalize``, the element right after it, or a name assigned from it there) replaced
    by ``PILToTensor()``; else why not."""
    tt = src.call(to_tensor, ("ToTensor",))
    if tt is None:
        return f"no one ToTensor() at {src.path}:{to_tensor}"
    parts = src.parent.get(tt)
    elements = parts.elts if isinstance(parts, (ast.List, ast.Tuple)) else [tt]
    after = elements[elements.index(tt) + 1 :]
    end = tt
    if normalize is not None:
        if not after or not _is_normalize(src, after[0], normalize):
            return "its Normalize is not the transform right after ToTensor()"
        end, after = after[0], after[1:]
    if after:
        names = ", ".join(src.segment(a) for a in after)
        return f"the transforms after ToTensor() ({names}) work on its floats"
    prefix = src.segment(tt.func)[: -len("ToTensor")]
    if isinstance(tt.func, ast.Name):  # from torchvision.transforms import ToTensor
        imports = [s for s in src.tree.body if isinstance(s, ast.ImportFrom)]
        importer = next((s for s in imports if "ToTensor" in _names(s)), None)
        if importer is None:
            return "ToTensor is not imported by name at the top of its file"
        if "PILToTensor" not in _names(importer):
            src.insert(importer.lineno, f"from {importer.module} import PILToTensor")
    src.replace(tt, f"{prefix}PILToTensor()", end)
    return None


def _names(stmt: ast.ImportFrom) -> list[str]:
    return [a.asname or a.name for a in stmt.names]


def _is_normalize(src: Source, node: ast.AST, line: int) -> bool:
    """Whether ``node`` is the ``Normalize(...)`` made at ``line``, or a name assigned it
    there (pytorch/examples' ImageNet script: ``normalize = transforms.Normalize(...)``)."""
    if isinstance(node, ast.Call):
        return _name(node.func) == "Normalize" and node.lineno <= line <= node.end_lineno
    made = src.call(line, ("Normalize",))
    return (
        isinstance(node, ast.Name)
        and made is not None
        and isinstance(src.parent.get(made), ast.Assign)
        and any(getattr(t, "id", None) == node.id for t in src.parent[made].targets)
    )


def wrap(src: Source, line: int, cls: str, options: str) -> str | None:
    """The DataLoader made at ``line`` through ``latecast.wrap(..., options)`` (unless it is):
    the name it is assigned to, or ``""``; None where there is no one call of it there."""
    call = src.call(line, (cls, "DataLoader"))
    if call is None:
        return None
    outer = src.parent.get(call)
    if isinstance(outer, ast.Call) and _name(outer.func) == "wrap":
        return _assigned(src, outer)
    latecast = src.import_line("latecast")
    src.replace(call, f"{latecast}.wrap({src.segment(call)}{', ' if options else ''}{options})")
    return _assigned(src, call)


def _assigned(src: Source, node: ast.AST) -> str:
    stmt = src.parent.get(node)
    targets = stmt.targets if isinstance(stmt, ast.Assign) else []
    return src.segment(targets[0]) if len(targets) == 1 else ""


def mover(src: Source, line: int, device: str) -> str | None:
    """The statement at ``line`` that moves tensors made per call (``x, y = x.to(d),
    y.to(d)``, ``return x.to(d)``), and each that moves the same tensors into the same names,
    made ``mover((x, y))``; the Mover made before their top-level statement, on the moves'
    device where it is a module's name, else on ``device``. Else why not."""
    stmts = [s for s in ast.walk(src.tree) if isinstance(s, (ast.Assign, ast.Return))]
    stmts = [s for s in stmts if s.lineno <= line <= s.end_lineno and s.value is not None]
    moved = _moves(stmts[-1].value) if stmts else None
    if not moved:
        return f"the move at line {line} is not `x = x.to(device)`, `return x.to(device)`"
    stmt, (receivers, where) = stmts[-1], moved
    scopes = (ast.FunctionDef, ast.AsyncFunctionDef)
    function = next((p for p in src.ancestors(stmt) if isinstance(p, scopes)), None)
    same = [stmt] + [
        s
        for s in ast.walk(function or src.tree)
        if isinstance(s, ast.Assign)
        and isinstance(stmt, ast.Assign)
        and s is not stmt
        and [src.segment(t) for t in s.targets] == [src.segment(t) for t in stmt.targets]
        and (_moves(s.value) or ([], None))[0] == receivers
    ]
    name = "mover" if "mover" not in _all_names(src.tree) else "latecast_mover"
    args = receivers[0] if len(receivers) == 1 else f"({', '.join(receivers)})"
    for s in same:
        src.replace(s.value, f"{name}({args})")
    top = src.top(stmt)
    first = min([top.lineno, *(d.lineno for d in getattr(top, "decorator_list", []))])
    if where is not None and _global(src, where, function, first):
        device = src.segment(where)
    src.insert(first, f"{name} = {src.import_line('latecast')}.Mover(device={device})")
    return None


def _moves(value: ast.AST) -> tuple[list[str], ast.AST | None] | None:
    """The tensors a value moves (``x.to(d), y.pin_memory().to(d, non_blocking=True)``:
    ``["x", "y"]``) and the device expression of the first, or None where it does more."""
    elements = value.elts if isinstance(value, ast.Tuple) else [value]
    receivers, device = [], None
    for e in elements:
        if not (isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute)):
            return None
        kwargs, args = {k.arg: k.value for k in e.keywords}, list(e.args)
        if e.func.attr == "to" and len(args) == 2:  # .to(device, dtype)
            kwargs["dtype"] = args.pop()
        cast = kwargs.pop("dtype", None)
        if cast is not None and ast.unparse(cast) not in ("torch.int64", "torch.long"):
            return None  # the Mover hands integers out as int64, as .to(d, torch.int64) does
        if e.func.attr == "to" and len(args) + ("device" in kwargs) == 1:
            if set(kwargs) - {"device", "non_blocking"}:
                return None
            device = device or (args[0] if args else kwargs["device"])
        elif e.func.attr != "cuda" or args:
            return None
        tensor = e.func.value
        while isinstance(tensor, ast.Call) and _name(tensor.func) == "pin_memory":
            tensor = tensor.func.value
        receivers.append(ast.unparse(tensor))
    return receivers, device


def _all_names(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def _stored(tree: ast.AST) -> list[ast.Name]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]


def _global(src: Source, expr: ast.AST, function: ast.AST | None, before: int) -> bool:
    """Whether every name ``expr`` reads is assigned at the module's top before ``before``,
    and none is ``function``'s own."""
    names = _all_names(expr)
    own: set[str] = set()
    if function is not None:
        own = {a.arg for a in ast.walk(function.args) if isinstance(a, ast.arg)}
        own |= {n.id for n in _stored(function)}
    scopes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
    module = {
        n.id
        for n in _stored(src.tree)
        if n.lineno < before and not any(isinstance(p, scopes) for p in src.ancestors(n))
    }
    return bool(names) and names <= module and not names & own


class Advice:
    """The edits for the sites that could cross narrower, or why doctor cannot write them.
    ``loaders``: the ``observe.LoaderSeen``; ``short`` names a file; ``cuda``: whether here."""

    def __init__(self, loaders: list, short: Callable[[str], str], cuda: bool) -> None:
        self.loaders, self.short, self.cuda = loaders, short, cuda
        self.sources: dict[str, Source] = {}
        self.wrapped: dict[int, str] = {}  # a loader's index -> the name it is assigned to
        self.converted: dict[tuple, str | None] = {}  # a ToTensor's (file, line) -> why not
        self.users: dict[tuple, list[int]] = {}  # a ToTensor's (file, line) -> its loaders
        self.floats: set[int] = set()  # loaders whose floats doctor cannot make integers

    def edits(self) -> list[Edit]:
        return [e for path, src in self.sources.items() for e in src.edits(self.short(path))]

    def site(self, site, row: dict) -> None:
        """``row["change"]`` for ``site``, with the edits that make it where doctor can."""
        ray = [i for i in sorted(site.loaders) if self.loaders[i].cls == "iter_torch_batches"]
        if ray and row["kind"] == "8-bit image":
            row["change"] = self.ray(self.loaders[ray[0]], row)
            self.floats |= site.loaders
            return
        try:
            if site.loaders:
                why = self.through_wrap(site, row)
            elif site.from_floats:  # the Mover would hand them out as the floats they were
                why = "floats cast to integers in the move: make them integers before it"
            elif row["kind"] == "integers" and not site.dtype.is_floating_point:
                why = mover(self.source(site.file), site.line, self.device(site))
            else:
                why = "its tensors come from no DataLoader and are not integers"
        except (OSError, SyntaxError, UnicodeDecodeError) as err:  # a source it cannot read
            why = f"its source cannot be read ({type(err).__name__})"
        if why is not None:
            row["change"] += f" (doctor cannot write this change for you: {why})"
            self.floats |= site.loaders if row["kind"] != "integers" else set()
        elif row["kind"] == "8-bit image":
            group = next(g for g in self.users.values() if set(g) & site.loaders)
            row["change"] = (
                f"{row['change'].split(':')[0]}: they cross as uint8, normalized on the device, "
                f"{row['factor']:.0f}x fewer bytes: with the edits below its transform yields "
                f"uint8 (PILToTensor) and every DataLoader that uses it goes through "
                f"`latecast.wrap`: {', '.join(map(self.named, group))}"
            )
            if not all(self.loaders[i].dataset.startswith("torchvision.datasets.") for i in group):
                row["change"] += (
                    " (PILToTensor() takes PIL images, as torchvision's datasets hand "
                    "ToTensor(); a dataset of yours that hands it numpy arrays wants "
                    "torchvision.transforms.v2.ToImage() there instead)"
                )
        else:
            row["change"] += " (the edits below)"

    def ray(self, x, row: dict) -> str:
        """The words for Ray Data's ``iter_torch_batches`` (docs/dataloader.md's Ray section):
        its loop normalizes the batch itself, which no edit of one line takes out."""
        m, sd = (tuple(round(float(v), 4) for v in row[k]) for k in ("mean", "std"))
        column = x.columns[0] if x.columns else "image"
        return (
            f"8-bit pixels normalized with mean={m}, std={sd}, from Ray Data's "
            f"`iter_torch_batches` at {self.short(x.file)}:{x.line}: its float32 dtypes cast "
            f"the uint8 column on the host; they could cross as uint8, normalized on the "
            f"device, {row['factor']:.0f}x fewer bytes: ask Ray for the stored dtypes, "
            f"`iter_torch_batches(..., dtypes=None)` (the {column!r} column comes uint8 "
            f"(N, H, W, C)), pass that through `latecast.wrap(..., mean={m}, std={sd}, "
            f'fields={{"{column}": "image"}})` and drop the loop\'s own permute, / 255 and '
            f"mean/std (doctor cannot write this change for you: the loop's own normalization "
            f"goes with it)"
        )

    def through_wrap(self, site, row: dict) -> str | None:
        if row["kind"] == "8-bit image":
            return next(filter(None, (self.convert(i, site) for i in sorted(site.loaders))), None)
        if row["kind"] in ("audio", "video clips", "16-bit image"):
            return "its dataset scales them: read them as stored there (above)"
        if row["kind"] != "integers" or site.dtype.is_floating_point:
            return "floats that hold integers: move them as integers, cast on the device"
        if site.loaders & self.floats:  # wrap with no mean/std would not normalize them
            return "its images must become uint8 in the same change (above)"
        kept, why = self.kept(), None
        for i in sorted(site.loaders - set(self.wrapped)):
            why = why or self.wrap(i, site, normalize=False)
        if why is not None:
            self.undo(kept)
        return why

    def convert(self, i: int, site) -> str | None:
        """Loader ``i``'s transform made to yield uint8, every loader using it wrapped."""
        parts = self.loaders[i].transform
        made = next((at for name, at in parts if name == "ToTensor"), None)
        normalize = next((at for name, at in parts if name == "Normalize"), None)
        if made is None:
            return "no ToTensor() seen made in its transform"
        if made not in self.converted:
            if normalize is not None and normalize[0] != made[0]:
                self.converted[made] = "its Normalize is made in another file than ToTensor()"
                return self.converted[made]
            group = [j for j, x in enumerate(self.loaders) if ("ToTensor", made) in x.transform]
            kept = self.kept()
            why = to_uint8(self.source(made[0]), made[1], normalize and normalize[1])
            for j in group:
                why = why or self.wrap(j, site, normalize=True)
            if why is not None:
                self.undo(kept)
            self.converted[made], self.users[made] = why, group
        return self.converted[made]

    def wrap(self, i: int, site, normalize: bool) -> str | None:
        """Loader ``i`` through ``latecast.wrap``, with its mean and std where ``normalize``."""
        x = self.loaders[i]
        stats = normalize and x.normalize  # (ToTensor() alone: scaled to [0, 1], as wrap does)
        options = [f"mean={stats[0]!r}, std={stats[1]!r}"] if stats else []
        options += [f"device={self.device(site)}"] * (self.device(site) != '"auto"')
        name = wrap(self.source(x.file), x.line, x.cls, ", ".join(options))
        if name is None:
            return f"no one {x.cls}(...) call at {self.short(x.file)}:{x.line}"
        self.wrapped[i] = name
        return None

    def device(self, site) -> str:
        """``device=``: the CPU where the script moved to it though CUDA is here, else auto."""
        return '"cpu"' if self.cuda and site.targets == {"cpu"} else '"auto"'

    def named(self, i: int) -> str:
        x, name = self.loaders[i], self.wrapped.get(i)
        return f"{self.short(x.file)}:{x.line}" + (f" (`{name}`)" if name else "")

    def source(self, path: str) -> Source:
        if path not in self.sources:
            self.sources[path] = Source(path)
        return self.sources[path]

    def kept(self) -> dict[str, int]:
        return {p: len(src.spans) for p, src in self.sources.items()}

    def undo(self, kept: dict[str, int]) -> None:
        """Drop the replacements made since ``kept``: a change is written whole or not."""
        for p, src in self.sources.items():
            del src.spans[kept.get(p, 0) :]
