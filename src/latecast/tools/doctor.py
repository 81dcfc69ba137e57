"""``latecast doctor``: run anyone's training script, unmodified, and say what crosses the
host->device bus wider than it needs to, and the change that narrows it.

The script runs as ``__main__`` in this process (``runpy``) under an ``Observer``, a
``TorchFunctionMode`` that sees every ``Tensor.to(device)``, ``.cuda()``, ``copy_`` from
host memory into a device tensor and ``torch.tensor``/``as_tensor(..., device=)`` made on
the main thread (DataLoader workers and its pin-memory thread only prepare batches; the
move is the script's). Each move is charged to the script's own line (the innermost frame
outside torch, latecast and the installed libraries). The first ``TENSORS`` tensors of each
site are sampled, ``VALUES`` values a channel of their first ``SAMPLES`` samples, evenly
strided: no random draw, no write, so the script computes exactly what it computes alone.
When the script stops (after ``--steps`` optimizer steps, through torch's global step hook,
or at its end) each site's samples are classified:

- floats that are ``(k/255 - mean)/std`` for integers k, per channel (what ``ToTensor()`` +
  ``Normalize`` make of 8-bit pixels): they could cross as uint8, 4x fewer bytes than
  float32; mean and std are recovered by a least-squares fit of the values on their grid;
- integers, and floats holding only integers: the narrowest integer dtype that holds them;
- bool and 1-byte dtypes: already narrow; other floats: nothing to gain.

Without an accelerator ``.to(device)`` targets the CPU and moves nothing: those calls are
recorded all the same, as what would cross the bus on a GPU, and the report says so. Moves
torch makes itself, and latecast's own copies, are not the script's to change.

The advice is edits (``advice.py``), so the script's own source is read with what the run
showed (``watching``): every DataLoader it makes, the line each ``ToTensor``/``Normalize`` of
their transforms is made at, and which loader handed out each tensor that moves. A transform
made to yield uint8 means every loader that shares it is wrapped, moved or not; tensors no
DataLoader handed out are batches made per call, for ``latecast.Mover``. Moves with gradients
off are evaluation's (``torch.no_grad``); ``--eval-steps`` ends the training pass after
``--steps`` (its DataLoader runs out, as at an epoch's end) to watch the evaluation after it.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib.abc
import linecache
import os
import re
import runpy
import sys
import sysconfig
import tempfile
import traceback
import warnings
import weakref
from dataclasses import asdict, dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.overrides import TorchFunctionMode

from ..config import option, validate
from ..errors import ConfigError, LatecastError
from ..storage.fileio import atomic_write
from ..trainer.rundir import check_path
from ..wrapper import NARROW, fits
from .advice import Advice, Edit
from .text import human_bytes

TENSORS, SAMPLES, VALUES = 8, 8, 8192  # sampled per site; per tensor: samples, values a channel
CHANNELS = (1, 3, 4)  # a 4-dim tensor whose dim 1 (or 3) is one of these holds images
WARMUP, PROFILED = 2, 3  # --profile: steps before the profiler starts, steps it records
_SKIP = re.compile(r"(torch\w*|latecast)(\.|$)")  # modules whose frames are not the script's
_LIBRARY = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")}) + ("<",)
_PACKAGE = str(Path(__file__).parents[1])  # latecast's own files (an editable install too)


@dataclass(frozen=True)
class DoctorConfig:
    module: str | None = option(None, "run a module, as python -m MODULE", short="-m")
    steps: int = option(50, "stop the script after this many optimizer steps", low=1)
    eval_steps: int = option(
        0,
        "after --steps, end the training pass and watch up to this many batches of the "
        "evaluation that follows (0: stop at --steps)",
        low=0,
    )
    output_dir: str | None = option(None, "also write doctor.md there")
    profile: bool = option(False, "CUDA: torch.profiler over a few steps, Memcpy HtoD vs kernels")

    def __post_init__(self) -> None:
        validate(self)


class ScriptError(LatecastError):
    """The doctored script raised or exited with a non-zero status: its own error, and
    doctor's ``result`` (what it moved until then: ``--json`` prints it with the error)."""

    def __init__(self, message: str, result: dict) -> None:
        super().__init__(message)
        self.result = result


class _Stop(BaseException):
    """Raised by the step hook after ``--steps`` steps: not an ``Exception``, so the
    script's own ``except Exception`` lets it through."""


@dataclass
class Site:
    """The tensors moved from one line of the script, of one dtype and kind."""

    where: str  # file:line
    dtype: torch.dtype  # as it crosses
    shape: tuple[int, ...]  # the latest one's
    axis: int | None  # its channel axis (images), else None
    targets: set = field(default_factory=set)  # device types moved to
    pinned: bool = False  # any came from pinned memory (DataLoader pin_memory=True)
    calls: int = 0
    nbytes: int = 0
    last_step: int = 0  # optimizer steps done before its latest call
    samples: list = field(default_factory=list)  # float64 (channels, values) arrays
    latecast: bool = False  # latecast's own copy (the script already moves through it)
    evaluation: bool = False  # moved with gradients off (torch.no_grad, inference_mode)
    loaders: set = field(default_factory=set)  # indices of the DataLoaders whose batches it moved
    file: str = ""  # the script's file (absolute) and line: where the advice edits
    line: int = 0


@dataclass
class LoaderSeen:
    """A DataLoader the script made: where, and what its dataset's transform is made of."""

    file: str  # the script's file that made it (absolute), and the line
    line: int
    cls: str  # its class's name
    transform: list[tuple[str, tuple | None]]  # (class name, (file, line) it was made at)
    normalize: tuple | None  # (mean, std) of its transform's Normalize
    workers: int


class Marks:
    """Objects of the script (tensors, loaders, transforms) marked while they live, each with
    a value: by identity (a tensor's ``==`` compares its elements), forgotten as each is
    freed; the objects themselves are never written to."""

    def __init__(self) -> None:
        self.marked: dict[int, tuple[weakref.ref, object]] = {}

    def add(self, obj: object, value: object = True) -> None:
        key = id(obj)
        self.marked[key] = (weakref.ref(obj, lambda _: self.marked.pop(key, None)), value)

    def get(self, obj: object) -> object:
        ref, value = self.marked.get(id(obj), (None, None))
        return value if ref is not None and ref() is obj else None


class Observer(TorchFunctionMode):
    """Records every host->device move made under it, per site (see the module docstring).
    torch's own moves (``_torchs_own``) are not the script's; a move inside latecast is
    latecast's own copy, and what latecast hands out is on the device already (on a CPU,
    the script's ``.to(device)`` of it moves nothing on a GPU either)."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: dict[tuple, Site] = {}
        self.steps = 0
        self.start = Path.cwd()  # sites are named relative to it
        self.latecasts = Marks()  # tensors latecast made
        self.loaders: list[LoaderSeen] = []  # every DataLoader the script made
        self.loader_of = Marks()  # a DataLoader -> its index in loaders
        self.batches = Marks()  # tensors a DataLoader handed out -> its index in loaders
        # --eval-steps: the training pass ended after --steps, the evaluation watched
        self.ending, self.late_steps, self.eval_batches, self.stopped = False, 0, 0, ""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)  # the mode is off in here: nothing below is recorded
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if _torchs_own(caller):
            return out
        ours = caller == "latecast" or caller.startswith("latecast.")
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if ours and isinstance(t, torch.Tensor):
                self.latecasts.add(t)
        moved = _moved(func, args, kwargs, out)
        if moved is not None and (ours or not self.latecasts.get(moved[0])):
            # with gradients off: evaluation (Module.to moves its parameters so too)
            evaluation = not torch.is_grad_enabled() and not caller.startswith("torch.nn.")
            self._record(*moved, latecast=ours, evaluation=evaluation)
        return out

    def _record(
        self, t: torch.Tensor, dtype: torch.dtype, target: str, latecast: bool, evaluation: bool
    ) -> None:
        axis = 1 if t.dim() == 4 and t.shape[1] in CHANNELS else None
        axis = 3 if t.dim() == 4 and axis is None and t.shape[3] in CHANNELS else axis
        # the script's own line (x.to(d), y.to(d) on one line: two sites, by instruction)
        frame = _script_frame(sys._getframe(2))
        file, line, at = (
            (frame.f_code.co_filename, frame.f_lineno, frame.f_lasti) if frame else ("?", 0, 0)
        )
        where = f"{_short(file, self.start)}:{line}"
        key = (where, at, dtype, t.dim(), axis and t.shape[axis], latecast, evaluation)
        s = self.sites.get(key) or Site(where, dtype, tuple(t.shape), axis)
        s.latecast, s.evaluation, s.file, s.line = latecast, evaluation, file, line
        self.sites[key] = s
        loader = self.batches.get(t)
        s.loaders |= set() if loader is None else {loader}
        s.shape, s.calls, s.last_step = tuple(t.shape), s.calls + 1, self.steps
        s.nbytes += t.numel() * dtype.itemsize
        s.targets.add(target)
        s.pinned |= t.device.type == "cpu" and t.is_pinned()
        if len(s.samples) < TENSORS and t.numel():
            s.samples.append(_sample(t, dtype, axis))


def _torchs_own(module: str) -> bool:
    """A move torch makes of a tensor it keeps on the device (``clip_grad_norm_`` gathering
    its norms, an optimizer's state): on a CPU it looks like one of the script's. What a
    module's ``.to()`` moves, and what DDP and DataParallel move to their devices, is the
    script's."""
    return (module == "torch" or module.startswith("torch.")) and not module.startswith(
        ("torch.nn.modules.", "torch.nn.parallel.")
    )


def _moved(func, args, kwargs, out) -> tuple[torch.Tensor, torch.dtype, str] | None:
    """(host tensor, dtype it crosses in, target device type) of a move, else None. A
    blocking copy that also converts converts on the host: the new dtype crosses (ATen's
    ``copy_kernel_cuda``); a non-blocking one converts on the device."""
    if func is torch.Tensor.to:
        device, dtype, non_blocking, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
        src = args[0]
    elif func is torch.Tensor.cuda:
        src, device, dtype, non_blocking = args[0], torch.device("cuda"), None, False
    elif func is torch.Tensor.copy_:
        (dst, src), non_blocking = args[:2], kwargs.get("non_blocking", args[2:3] == (True,))
        device, dtype = (dst.device, dst.dtype) if dst.device.type != "cpu" else (None, None)
    elif func in (torch.tensor, torch.as_tensor) and kwargs.get("device") is not None:
        data = args[0] if args else kwargs.get("data")
        if isinstance(data, torch.Tensor) and data.device.type != "cpu":
            return None
        if out.device.type == "cpu" and not _mine(sys._getframe(2)):
            return None  # a library's constant on the host (Normalize's mean), not a move
        return out, out.dtype, out.device.type
    else:
        return None
    if device is None or not isinstance(src, torch.Tensor) or src.device.type != "cpu":
        return None
    return src, dtype if dtype is not None and not non_blocking else src.dtype, device.type


def _mine(frame) -> bool:
    name = frame.f_globals.get("__name__", "")
    return name == "__main__" or not (_SKIP.match(name) or _library(frame.f_code.co_filename))


def _library(path: str) -> bool:
    """Installed code, the standard library or latecast: not the script's."""
    return path.startswith(_LIBRARY) or path.startswith(_PACKAGE)


def _short(path: str, start: Path) -> str:
    """``path`` relative to ``start``, where doctor was started (the script may change
    directory), or whole where it lies outside."""
    p = Path(path)
    return str(p.relative_to(start)) if p.is_absolute() and p.is_relative_to(start) else path


def _sample(t: torch.Tensor, dtype: torch.dtype, axis: int | None) -> np.ndarray:
    x = t.detach()[:SAMPLES] if t.dim() > 1 else t.detach().reshape(-1)
    x = x.movedim(axis, 0).reshape(x.shape[axis], -1) if axis else x.reshape(1, -1)
    x = x[:, :: -(-x.shape[1] // VALUES)].to("cpu", dtype)  # (channels, <= VALUES)
    return x.double().numpy() if dtype.is_floating_point else x.numpy().astype(np.float64)


# -- what the values are -------------------------------------------------------------------


def grid(u: np.ndarray, eps: float) -> tuple[float, float] | None:
    """``(mean, std)`` when every value of ``u`` is ``(k/255 - mean)/std`` for integers k in
    0..255 within the rounding of a float with machine epsilon ``eps``, else None.

    The step between levels is first the smallest gap that rounding leaves sharp (float16
    blurs gaps far from zero), then refitted by least squares over a window of levels
    around it that widens 4x a pass, so no level is given the wrong k. The darkest value
    seen is taken as k = 0, unless another k makes a mean of at most 4 decimals (as
    Normalize constants are written) and that one does not."""
    levels = np.unique(u)
    gaps = np.diff(levels)
    sharp = gaps > 100 * eps * np.maximum(np.abs(levels[:-1]), np.abs(levels[1:]))
    if len(levels) < 3 or not sharp.any():
        return None
    i = np.flatnonzero(sharp)[np.argmin(gaps[sharp])]
    step, origin, width = gaps[i], levels[i], 8
    while True:
        near = np.abs(levels - origin) <= width * step
        k = np.rint((levels[near] - origin) / step)
        step, origin = np.polyfit(k, levels[near], 1)  # level = step * k + origin
        if near.all():
            break
        width *= 4
    off = levels - origin - k * step
    if k[-1] - k[0] > 255 or np.abs(off).max() > 0.1 * step + eps * np.abs(levels).max():
        return None
    std, darkest = 1 / (255 * step), origin + k[0] * step
    means = [k0 / 255 - darkest * std for k0 in range(256 - int(k[-1] - k[0]))]
    nice = [m for m in means if abs(m - round(m, 4)) < 1e-6]
    return (means[0] if not nice or means[0] in nice else nice[0]), std


def verdict(s: Site) -> dict:
    """What a site moves now, what it could move, and the change."""
    u = np.concatenate(s.samples, axis=1) if s.samples else np.zeros((1, 0))
    now, then, stats, lo, hi = s.dtype, s.dtype, None, None, None
    finite = bool(np.isfinite(u).all())
    if s.latecast:
        kind = "latecast"
    elif now.itemsize == 1 or u.size == 0:
        kind = "narrow"
    elif finite and (u == np.rint(u)).all():
        lo, hi = int(u.min()), int(u.max())
        kind, then = "integers", next(d for d in NARROW if fits(d, lo, hi))
    else:
        eps = torch.finfo(now).eps
        found = [grid(c, eps) for c in u] if finite else [None]
        kind = "8-bit image" if all(found) else "float"
        if all(found):
            then, stats = torch.uint8, [list(x) for x in zip(*found)]
    return {
        "kind": kind,
        "could_cross": _name(then),
        "factor": now.itemsize / then.itemsize,
        "range": None if lo is None else [lo, hi],
        "mean": stats and stats[0],
        "std": stats and stats[1],
        "change": _change(s, kind, then, stats, lo, hi),
    }


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _change(s: Site, kind: str, then: torch.dtype, stats, lo, hi) -> str:
    now, factor = _name(s.dtype), s.dtype.itemsize // then.itemsize
    if kind == "8-bit image":
        m, sd = (tuple(round(float(x), 4) for x in v) for v in stats)
        norm = f"mean={m}, std={sd}" if any(m) or any(x != 1 for x in sd) else ""
        if s.axis is None:  # not an image batch latecast.wrap would recognise
            return f"move it as uint8 and normalize on the device ({norm or 'k/255'}), {factor}x"
        given = f" + `Normalize({norm})`" if norm else ""
        wrap = f"latecast.wrap(loader{', ' + norm if norm else ''})"
        return (
            f"8-bit pixels{' normalized with ' + norm if norm else ''}: they could cross as "
            f"uint8, normalized on the device, {factor}x fewer bytes: make the dataset yield "
            f"uint8 (`PILToTensor()` for `ToTensor()`{given}) and pass every DataLoader that "
            f"uses it through `{wrap}`"
        )
    if kind == "integers" and factor > 1:
        if s.dtype.is_floating_point:
            return f"{now} holding only integers {lo}..{hi}: move them as {_name(then)}, {factor}x"
        return (
            f"{now} in {lo}..{hi}: they cross as {_name(then)} through `latecast.wrap` "
            f"(int64 again on the device), {factor}x"
        )
    if kind == "latecast":
        return f"{now} bytes of latecast's own copy: nothing to change"
    why = {"narrow": "already narrow", "float": "not on an 8-bit grid"}.get(
        kind, f"in {lo}..{hi}: no narrower dtype holds them"
    )
    return f"{now} {why}: nothing to gain"


# -- running the script --------------------------------------------------------------------


@dataclass(frozen=True)
class Script:
    """What follows ``--``: a script's path or a module's name, its arguments, and the
    interpreter's own options given before it (``python -u -W ignore train.py``)."""

    kind: str  # "path" | "module"
    name: str
    argv: list[str]
    flags: list[tuple[str, str | None]]  # ("u", None), ("W", "ignore"), ...


def target(cfg: DoctorConfig, command: list[str]) -> Script:
    """The script from what follows ``--``; one line for a script or module that is not
    there, a launcher doctor cannot look inside, or an interpreter option it cannot apply."""
    cmd = command[1:] if command[:1] == ["--"] else list(command)
    flags: list[tuple[str, str | None]] = []
    if not cfg.module and cmd and re.fullmatch(r"python[\d.]*", Path(cmd[0]).name):
        flags, cmd = python_options(cmd[1:])
    module = cfg.module
    if not module and cmd[:1] == ["-m"] and len(cmd) > 1:
        module, cmd = cmd[1], cmd[2:]
    name = module or (cmd.pop(0) if cmd else "")
    if not name:
        raise ConfigError("name the script to run: latecast doctor -- python train.py [ARGS]")
    if Path(name).name in ("torchrun", "torch.distributed.run", "torch.distributed.launch"):
        raise ConfigError(
            "doctor watches the process it runs in, not torchrun's children: start doctor "
            "under torchrun instead, torchrun [OPTIONS] -m latecast doctor -- train.py"
        )
    if module:
        sys.path.insert(0, os.getcwd())  # as python -m does
        try:
            found = find_spec(module) is not None
        except ImportError:  # its parent package is not there
            found = False
        finally:
            sys.path.pop(0)
        if not found:
            raise ConfigError(f"no module named {module!r} to run")
        return Script("module", module, cmd, flags)
    if not Path(name).is_file():
        raise ConfigError(f"script {name} not found (or not a file)")
    return Script("path", name, cmd, flags)


# python's options that doctor applies for the script's run (-u: its output flushed at each
# line; -W, -B), and those that shape the interpreter as it starts, which hold only where
# doctor itself was started under them (their names in sys.flags)
APPLIED = "uWB"
AT_START = {"O": "optimize", "E": "ignore_environment", "s": "no_user_site", "S": "no_site"}
AT_START |= {"I": "isolated", "P": "safe_path", "b": "bytes_warning", "d": "debug"}
AT_START |= {"v": "verbose", "q": "quiet", "i": "inspect", "R": "hash_randomization"}


def python_options(cmd: list[str]) -> tuple[list[tuple[str, str | None]], list[str]]:
    """The interpreter's options before the script in ``python -u -Wignore -X dev train.py``
    (letters may be joined, ``-uB``; ``-W``/``-X`` take the rest of the word or the next),
    and what follows them; ``-m MODULE`` is left at the front."""
    cmd, flags = list(cmd), []
    while cmd and cmd[0].startswith("-") and cmd[0] not in ("-", "-m"):
        word = cmd.pop(0)
        if word.startswith("--"):
            raise ConfigError(f"python option {word}: doctor takes python's one-letter options")
        for i, letter in enumerate(word[1:], 1):
            if letter in "WXm":  # takes a value: the rest of the word, else the next word
                value = word[i + 1 :] or (cmd.pop(0) if cmd else "")
                if not value:
                    raise ConfigError(f"python -{letter} needs a value")
                if letter == "m":
                    cmd[:0] = ["-m", value]
                else:
                    flags.append((letter, value))
                break
            if letter == "c":
                raise ConfigError("doctor runs a script or a module (-m), not python -c code")
            flags.append((letter, None))
    for letter, value in flags:
        if letter in APPLIED or _in_effect(letter, value):
            continue
        given = f"-{letter}" + (f" {value}" if value else "")
        raise ConfigError(
            f"python {given} shapes the interpreter as it starts, and doctor runs the script in "
            f"its own: start doctor under it, python {given} -m latecast doctor -- SCRIPT"
        )
    return flags, cmd


def _in_effect(letter: str, value: str | None) -> bool:
    """Whether this interpreter was started with ``-LETTER [VALUE]``."""
    if letter == "X":  # -X dev: {"dev": True}; -X int_max_str_digits=9: {"...": "9"}
        key, eq, val = (value or "").partition("=")
        return key in sys._xoptions and sys._xoptions[key] == (val if eq else True)
    return bool(getattr(sys.flags, AT_START.get(letter, ""), False))


@contextlib.contextmanager
def as_python_would(flags: list[tuple[str, str | None]]) -> Iterator[None]:
    """The script's run as ``python FLAGS script`` runs it: ``-u``, ``-W``, ``-B`` applied,
    and its warnings shown as Python shows them (``file:line: Category: message``), not as
    the command line shows latecast's own; all put back after."""
    streams = [s for s in (sys.stdout, sys.stderr) if hasattr(s, "reconfigure")]
    saved = sys.dont_write_bytecode, warnings.formatwarning
    buffering = [(s.line_buffering, s.write_through) for s in streams]
    with warnings.catch_warnings():  # the filters -W adds go with it
        warnings.formatwarning = python_formatwarning
        try:
            # what python does with -W at its start (a bad value: one line, then ignored)
            warnings._processoptions([value for letter, value in flags if letter == "W"])
            if ("u", None) in flags:  # unbuffered; here written through at each line
                for s in streams:
                    s.reconfigure(line_buffering=True, write_through=True)
            if ("B", None) in flags:
                sys.dont_write_bytecode = True
            yield
        finally:
            sys.dont_write_bytecode, warnings.formatwarning = saved
            for s, (line, through) in zip(streams, buffering):
                s.reconfigure(line_buffering=line, write_through=through)


def python_formatwarning(message, category, filename, lineno, line=None) -> str:
    """A warning as Python's own ``warnings.formatwarning`` shows it (the command line
    replaces that function with one line of its own for latecast's warnings)."""
    line = linecache.getline(filename, lineno) if line is None else line
    source = f"  {line.strip()}\n" if line and line.strip() else ""
    return f"{filename}:{lineno}: {category.__name__}: {message}\n{source}"


def run_script(script: Script, obs: Observer, cfg, debug: bool) -> dict:
    """Run the script as ``__main__`` under ``obs`` until it ends or ``cfg.steps`` optimizer
    steps are done: how it ended, its exit status and its error (reported, never swallowed).
    The working directory, ``sys.argv`` and ``sys.path`` are put back after."""
    profiler = Profiler() if cfg.profile else None

    def step(optimizer, args, kwargs) -> None:
        if obs.ending:  # after --steps: one more step may train on a batch read ahead
            obs.late_steps += 1
            if obs.eval_batches or obs.late_steps > 1:
                obs.stopped = "training"  # the script trained on, with no evaluation between
                raise _Stop
            return
        obs.steps += 1
        if profiler:
            profiler.step(obs.steps)
        if obs.steps >= cfg.steps and cfg.eval_steps:
            obs.ending = True
        elif obs.steps >= cfg.steps:
            raise _Stop

    name, saved = script.name, (sys.argv, sys.path[:], os.getcwd())
    sys.argv = [name, *script.argv]
    here = str(Path(name).resolve().parent) if script.kind == "path" else os.getcwd()
    sys.path.insert(0, here)
    hook = register_optimizer_step_post_hook(step)
    ended, status, error = "end", 0, None
    try:
        with as_python_would(script.flags), watching(obs, cfg), obs:
            if script.kind == "path":  # python's __file__ is absolute since 3.9
                runpy.run_path(str(Path(name).absolute()), run_name="__main__")
            else:
                runpy.run_module(name, run_name="__main__", alter_sys=True)
    except _Stop:
        ended = obs.stopped or "steps"
    except SystemExit as stop:
        code = stop.code
        ended, status = "exit", code if isinstance(code, int) else int(code is not None)
        error = None if status == 0 else f"exited with status {status}"
        if isinstance(code, str):
            error += f" ({code})"
    except Exception as err:  # the script's own: reported, and doctor exits 1
        if debug:
            traceback.print_exc()
        ended, status, error = "error", 1, _raised(err, obs.start)
    finally:
        hook.remove()
        sys.argv, sys.path[:] = saved[:2]
        os.chdir(saved[2])
        if profiler:
            profiler.close()
        _release_group()
    return {
        "ended": ended,
        "exit_status": status,
        "error": error,
        "profile": profiler and profiler.result,
    }


# -- the script's DataLoaders and transforms -------------------------------------------------

TRANSFORMS = "torchvision.transforms.transforms"  # where ToTensor and Normalize are defined
MADE_AT = ("ToTensor", "Normalize")  # the transforms whose line doctor's advice edits


@contextlib.contextmanager
def watching(obs: Observer, cfg) -> Iterator[None]:
    """While the script runs: each DataLoader it makes (where, and its dataset's transform),
    the batches each hands out, the line each ``ToTensor``/``Normalize`` is made at (once
    torchvision's transforms are imported, by whoever imports them); and with
    ``--eval-steps``, the training pass ended after ``--steps`` and the evaluation that
    follows watched. Read-only: every method is the original, called as it was, and put back
    after."""
    from torch.utils.data import DataLoader
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    made, iterators, undo = Marks(), Marks(), []

    def patch(owner: type, name: str, wrapper: Callable) -> None:
        original = owner.__dict__.get(name)
        if original is not None:  # (a torchvision without its own ToTensor.__init__: none)
            undo.append((owner, name, original))
            setattr(owner, name, functools.wraps(original)(wrapper(original)))

    def made_at(original: Callable) -> Callable:
        def init(self, *args, **kwargs) -> None:
            original(self, *args, **kwargs)
            frame = _script_frame(sys._getframe(1))
            made.add(self, frame and (frame.f_code.co_filename, frame.f_lineno))

        return init

    def transforms(module) -> None:
        for name in MADE_AT:
            patch(getattr(module, name), "__init__", made_at)

    def loader_init(original: Callable) -> Callable:
        def init(self, *args, **kwargs) -> None:
            original(self, *args, **kwargs)
            frame = _script_frame(sys._getframe(1))
            if frame is not None:
                obs.loaders.append(_loader(self, frame, made))
                obs.loader_of.add(self, len(obs.loaders) - 1)

        return init

    def loader_iter(original: Callable) -> Callable:
        def it(self):
            iterator = original(self)
            iterators.add(iterator, (obs.loader_of.get(self), obs.ending))
            return iterator

        return it

    def loader_next(original: Callable) -> Callable:
        def next_(self):
            loader, late = iterators.get(self) or (None, False)
            if obs.ending and not late:  # the training pass, ended after --steps
                raise StopIteration
            if obs.ending and obs.eval_batches >= cfg.eval_steps:
                obs.stopped = "eval"
                raise _Stop
            try:
                batch = original(self)
            except StopIteration:
                if obs.ending:  # the evaluation's loader is done: stop before what follows
                    obs.stopped = "eval"
                    raise _Stop from None
                raise
            obs.eval_batches += obs.ending
            if loader is not None:
                for t in _tensors(batch):
                    obs.batches.add(t, loader)
            return batch

        return next_

    patch(DataLoader, "__init__", loader_init)
    patch(DataLoader, "__iter__", loader_iter)
    patch(_BaseDataLoaderIter, "__next__", loader_next)
    finder = None
    if TRANSFORMS in sys.modules:
        transforms(sys.modules[TRANSFORMS])
    else:
        finder = AfterImport(TRANSFORMS, transforms)
        sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
        for owner, name, original in reversed(undo):
            setattr(owner, name, original)


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then(module)`` once the module ``name`` is imported, by whoever imports it
    (doctor imports none of torchvision itself: 3-4 s for a script that may not use it)."""

    def __init__(self, name: str, then: Callable) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname != self.name or self not in sys.meta_path:
            return None
        sys.meta_path.remove(self)  # the finders after it find the module
        spec = find_spec(fullname)
        if spec is not None and spec.loader is not None:
            load = spec.loader.exec_module

            def exec_module(module) -> None:
                load(module)
                self.then(module)

            spec.loader.exec_module = exec_module
        return spec


def _script_frame(frame):
    """The innermost frame of the script at or above ``frame``, or None."""
    while frame is not None and not _mine(frame):
        frame = frame.f_back
    return frame


def _loader(loader, frame, made: Marks) -> LoaderSeen:
    """What doctor keeps of a DataLoader the script made at ``frame``: its dataset's
    transform's parts and the lines they were made at, read from instance dictionaries only
    (no property of the script's runs), through Subset and ConcatDataset."""
    todo, transform = [vars(loader).get("dataset")], None
    for _ in range(8):
        if not todo or transform is not None:
            break
        d = getattr(todo.pop(0), "__dict__", {})
        transform = d.get("transform")
        todo += [d["dataset"]] if "dataset" in d else list(d.get("datasets", ()))[:8]
    parts = getattr(transform, "__dict__", {}).get("transforms", [transform])
    parts = [p for p in parts if p is not None] if isinstance(parts, list) else [transform]
    normalize = next((p for p in parts if type(p).__name__ == "Normalize"), None)
    stats = normalize and tuple(tuple(float(x) for x in v) for v in (normalize.mean, normalize.std))
    return LoaderSeen(
        frame.f_code.co_filename,
        frame.f_lineno,
        type(loader).__name__,
        [(type(p).__name__, made.get(p)) for p in parts],
        stats,
        int(vars(loader).get("num_workers", 0)),
    )


def _tensors(batch) -> list[torch.Tensor]:
    """The tensors of a batch: itself, or the fields of a tuple, list or dict."""
    fields = batch.values() if isinstance(batch, dict) else batch
    fields = fields if isinstance(batch, (tuple, list, dict)) else [batch]
    return [t for t in fields if isinstance(t, torch.Tensor)]


# torch re-raises an exception of a DataLoader worker (or its pin-memory thread) in the main
# process as "Caught E in DataLoader worker process 0.\nOriginal Traceback ...\nE: message"
_WORKER = re.compile(r"Caught \w+ (in .+?)\.?\nOriginal Traceback", re.S)
_FRAME = re.compile(r'^\s*File "(.+)", line (\d+)', re.M)


def _raised(err: Exception, start: Path) -> str:
    """``raised E: message (file:line)``: the script's own message and its innermost line
    of the script; for an error in a DataLoader worker, the worker's, as torch kept them."""
    text, name = str(err).strip(), type(err).__name__
    worker = _WORKER.match(text)
    if worker:
        last = text.splitlines()[-1]
        first = last.split(": ", 1)[1] if last.startswith(f"{name}: ") else last
        lines = [(f, n) for f, n in _FRAME.findall(text) if not _library(f)]
        at = f"{_short(lines[-1][0], start)}:{lines[-1][1]}" if lines else "?"
        return f"raised {name} {worker.group(1)}: {first} ({at})"
    at, tb = "?", err.__traceback__
    while tb is not None:
        if _mine(tb.tb_frame):
            at = f"{_short(tb.tb_frame.f_code.co_filename, start)}:{tb.tb_lineno}"
        tb = tb.tb_next
    first = (text.splitlines() or [""])[0]
    return f"raised {name}: {first} ({at})"


def _release_group() -> None:
    """A script stopped at ``--steps`` never reaches its ``destroy_process_group()``, and
    its DDP model, held by its functions' globals until the collector runs at exit, keeps the
    group alive; then a gloo worker thread freeing its last all-reduce can abort the process
    (pytorch/pytorch#179291). Destroy it and collect the script's objects while Python runs."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()


class Profiler:
    """``torch.profiler`` over the ``PROFILED`` steps after ``WARMUP`` (CUDA): the time
    ``Memcpy HtoD`` takes against kernel time, per step."""

    def __init__(self) -> None:
        self.prof, self.result = None, None

    def step(self, n: int) -> None:
        if n == WARMUP:
            torch.cuda.synchronize()  # the recorded window starts with an idle device
            acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            self.prof = torch.profiler.profile(activities=acts)
            self.prof.__enter__()
        elif n == WARMUP + PROFILED and self.prof is not None:
            torch.cuda.synchronize()  # every kernel and copy of the window is done
            prof = self.close()
            from .profiling import trace_totals  # imports the trainer: only when asked

            with tempfile.TemporaryDirectory() as tmp:
                prof.export_chrome_trace(f"{tmp}/trace.json")
                kernel_us, memcpy = trace_totals(Path(tmp) / "trace.json")
            copy_us = sum(m["us"] for m in memcpy.values())
            self.result = {
                "steps": PROFILED,
                "memcpy_htod_ms": copy_us / 1e3 / PROFILED,
                "kernel_ms": kernel_us / 1e3 / PROFILED,
                "memcpy_share": copy_us / (copy_us + kernel_us) if copy_us + kernel_us else 0.0,
            }

    def close(self) -> torch.profiler.profile | None:
        """Stop the profiler if it runs (the script may end inside the window)."""
        prof, self.prof = self.prof, None
        if prof is not None:
            prof.__exit__(None, None, None)
        return prof


# -- the verdict ---------------------------------------------------------------------------


def diagnose(script: str, obs: Observer, outcome: dict) -> dict:
    """The result: the sites of the training steps (per step) and of evaluation (moved with
    gradients off, per batch) with their verdicts, the total per training step, the moves
    made only before the first step (the model's ``.to(device)``: once, not per step), and
    the DataLoaders the script made."""
    steps, sites, evaluation, setup, advised = obs.steps, [], [], [], []
    for s in obs.sites.values():
        row = {"site": s.where, "dtype": _name(s.dtype), "shape": list(s.shape)}
        row.update(latecast=s.latecast, loaders=sorted(s.loaders))
        row.update(pinned=s.pinned, devices=sorted(s.targets), calls=s.calls)
        if steps >= 2 and s.last_step == 0 and not s.evaluation:
            setup += [] if s.latecast else [{**row, "bytes": s.nbytes}]  # not its constants
            continue
        row.update(verdict(s))
        advised += [(s, row)] if row["factor"] > 1 and not s.latecast else []
        if s.evaluation:
            row.update(bytes_per_batch=s.nbytes / s.calls)
            row["bytes_per_batch_then"] = row["bytes_per_batch"] / row["factor"]
            evaluation.append(row)
            continue
        per = max(steps + obs.late_steps, 1)  # a step after --steps trains on a batch too
        row.update(calls_per_step=s.calls / per, bytes_per_step=s.nbytes / per)
        row["bytes_per_step_then"] = row["bytes_per_step"] / row["factor"]
        sites.append(row)
    advice = Advice(obs.loaders, lambda path: _short(path, obs.start), torch.cuda.is_available())
    for s, row in sorted(advised, key=lambda sr: sr[1]["kind"] != "8-bit image"):  # first
        advice.site(s, row)
    now = sum(r["bytes_per_step"] for r in sites)
    then = sum(r["bytes_per_step_then"] for r in sites)
    return {
        "script": script,
        "steps": steps,
        **outcome,
        "eval_batches": obs.eval_batches,
        "on_cpu": any("cpu" in r["devices"] for r in sites + evaluation + setup),
        "sites": sites,
        "evaluation": evaluation,
        "setup": setup,
        "total": {
            "bytes_per_step": now,
            "bytes_per_step_then": then,
            "factor": now / then if then else 1.0,
        },
        "edits": [asdict(e) for e in advice.edits()],
        "loaders": [
            {
                "made_at": f"{_short(x.file, obs.start)}:{x.line}",
                "class": x.cls,
                "transform": [name for name, _ in x.transform],
                "workers": x.workers,
            }
            for x in obs.loaders
        ],
    }


def _table(rows: list[list[str]]) -> list[str]:
    """A markdown table with its columns padded, as readable in a terminal as in a file."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    return [
        line(rows[0]),
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
        *map(line, rows[1:]),
    ]


def _nothing(r: dict) -> str:
    if all(s["latecast"] for s in r["sites"] + r["evaluation"]):
        return "latecast moves every batch"
    return "every tensor crosses as narrow as its values allow"


def _rows(sites: list[dict], per: str) -> list[list[str]]:
    """The table's rows for sites counted ``per`` ``step`` or ``batch``."""
    return [
        [
            s["site"] + (" (latecast)" if s["latecast"] else ""),
            f"{s['calls_per_step']:.3g}" if per == "step" else str(s["calls"]),
            f"{s['dtype']} {tuple(s['shape'])}" + (" pinned" if s["pinned"] else ""),
            s["could_cross"],
            f"{human_bytes(s[f'bytes_per_{per}'])} -> {human_bytes(s[f'bytes_per_{per}_then'])}",
            f"{s['factor']:.1f}x",
        ]
        for s in sites
    ]


def report(r: dict, cfg: DoctorConfig) -> str:
    n, k = cfg.steps, r["eval_batches"]
    ended = {
        "steps": f"stopped at --steps {n}",
        "eval": f"stopped at the end of the evaluation after --steps {n}, "
        f"{k} batch{'es' * (k != 1)} watched",
        "training": f"stopped after --steps {n}: it trained on, no evaluation in between",
        "end": "the script ended",
    }
    how = ended.get(r["ended"], f"the script {r['error'] or 'exited with status 0'}")
    lines = [f"latecast doctor: {r['script']}, {r['steps']} optimizer steps ({how})"]
    if r["on_cpu"]:
        lines.append(
            "no accelerator here: the script's .to(device) targets the CPU and moves nothing;\n"
            "each such call is counted as what would cross the bus on a GPU"
        )
    if not r["sites"] and not r["evaluation"] and not r["setup"]:
        lines.append("no tensor was moved to a device: nothing crosses the bus in what ran")
    if r["sites"]:
        head = "site|per step|crosses now|could cross|bytes/step now -> then|factor".split("|")
        t = r["total"]
        total = f"{human_bytes(t['bytes_per_step'])} -> {human_bytes(t['bytes_per_step_then'])}"
        total_row = ["total", "", "", "", total, f"{t['factor']:.1f}x"]
        lines += ["", *_table([head, *_rows(r["sites"], "step"), total_row])]
    if r["evaluation"]:
        head = "site|batches|crosses now|could cross|bytes/batch now -> then|factor".split("|")
        lines += ["", "evaluation (moved with gradients off):"]
        lines += _table([head, *_rows(r["evaluation"], "batch")])
    changes = [s for s in r["sites"] + r["evaluation"] if s["factor"] > 1]
    if r["sites"] or r["evaluation"]:
        lines += ["", "what to change:" if changes else "nothing to change: " + _nothing(r)]
        lines += [f"- {s['site']} {s['dtype']} {tuple(s['shape'])}: {s['change']}" for s in changes]
    if r["edits"]:
        lines += ["", "the edits, to apply as written (--json lists them too):"]
        lines += [x for e in r["edits"] for x in Edit(**e).shown()]
    if r["setup"]:
        by_site = {}
        for s in r["setup"]:
            by_site[s["site"]] = by_site.get(s["site"], 0) + s["bytes"]
        once = ", ".join(f"{site} ({human_bytes(b)})" for site, b in by_site.items())
        lines += ["", f"moved once before the first step, not counted per step: {once}"]
    if cfg.profile:
        p = r["profile"]
        lines.append(
            f"profile of {p['steps']} steps: Memcpy HtoD {p['memcpy_htod_ms']:.3f} ms a step, "
            f"kernels {p['kernel_ms']:.3f} ms: the copies are {p['memcpy_share']:.0%} of the two"
            if p
            else f"profile: the script stopped before step {WARMUP + PROFILED}, nothing profiled"
        )
    return "\n".join(lines)


def doctor(
    cfg: DoctorConfig, command: list[str], *, show: bool = True, debug: bool = False
) -> dict:
    """``latecast doctor``: check the options, run the script, and where ``show`` (rank 0)
    print the report (and write ``doctor.md``); the result. A script that fails is one
    ``ScriptError`` that carries the result."""
    if cfg.profile and not torch.cuda.is_available():
        raise ConfigError("--profile needs CUDA (it times Memcpy HtoD on the GPU): none here")
    if cfg.profile and cfg.steps < WARMUP + PROFILED:
        raise ConfigError(f"--profile needs --steps >= {WARMUP + PROFILED}, got {cfg.steps}")
    # relative to where doctor started, wherever the script changes directory to
    out = check_path(cfg.output_dir).absolute() if cfg.output_dir else None
    script = target(cfg, command)
    obs = Observer()
    r = diagnose(script.name, obs, run_script(script, obs, cfg, debug))
    if show:
        text = report(r, cfg)
        print(text)
        if out is not None:
            with atomic_write(out / "doctor.md") as f:
                f.write(f"# latecast doctor\n\n{text}\n".encode())
            print(f"wrote {out / 'doctor.md'}")
    if r["error"]:
        raise ScriptError(f"{script.name} {r['error']}", result=r)
    return r
