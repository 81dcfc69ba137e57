"""What ``latecast doctor`` sees of a script as it runs: every host->device move, charged
to the script's own line (``Observer``, a ``TorchFunctionMode``), and its DataLoaders, their
batches and where their transforms are made (``watching``). Read-only: a bounded, strided
sample of the first tensors of each site, no random draw, every original method called."""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import re
import sys
import sysconfig
import weakref
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

TENSORS, SAMPLES, VALUES = 8, 8, 8192  # sampled per site; per tensor: samples, values a channel
CHANNELS = (1, 3, 4)  # a 4-dim tensor whose dim 1 (or 3) is one of these holds images
_SKIP = re.compile(r"(torch\w*|latecast)(\.|$)")  # modules whose frames are not the script's
_LIBRARY = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")}) + ("<",)
_PACKAGE = str(Path(__file__).parents[1])  # latecast's own files (an editable install too)


class Stop(BaseException):
    """Stops the script: not an ``Exception``, so the script's ``except Exception`` lets it by."""


@dataclass
class Site:
    """The tensors moved from one line of the script, of one dtype and kind."""

    where: str  # file:line
    dtype: torch.dtype  # as it crosses
    shape: tuple[int, ...]  # the latest one's
    axis: int | None  # its channel axis (images, clips), else None
    targets: set = field(default_factory=set)  # device types moved to
    pinned: bool = False  # any came from pinned memory (DataLoader pin_memory=True)
    calls: int = 0
    nbytes: int = 0
    last_step: int = 0  # optimizer steps done before its latest call
    samples: list = field(default_factory=list)  # float64 (channels, values) arrays
    latecast: bool = False  # latecast's own copy (the script already moves through it)
    evaluation: bool = False  # moved with gradients off (torch.no_grad, inference_mode)
    loaders: set = field(default_factory=set)  # indices of the DataLoaders whose batches it moved
    from_floats: bool = False  # floats cast to integers in the move (`.to(d, torch.int64)`)
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
    dataset: str  # the class (module.name) of the dataset that applies the transform
    columns: list = field(default_factory=list)  # a dict batch's image-shaped (4-dim) keys
    # the values were 16-bit before the transform: MONAI's ScaleIntensityRange(d, clip=True)
    # window (a_min, a_max) and its key, or True where the dataset holds int16/uint16 arrays
    stored: tuple | bool = False


class Marks:
    """The script's objects marked with a value while they live, by identity (a tensor's
    ``==`` compares elements); the objects themselves are never written to."""

    def __init__(self) -> None:
        self.marked: dict[int, tuple[weakref.ref, object]] = {}

    def add(self, obj: object, value: object = True) -> None:
        key = id(obj)
        try:
            ref = weakref.ref(obj, lambda _: self.marked.pop(key, None))
        except TypeError:  # a class of the script's own with __slots__ and no __weakref__
            return
        self.marked[key] = (ref, value)

    def get(self, obj: object) -> object:
        ref, value = self.marked.get(id(obj), (None, None))
        return value if ref is not None and ref() is obj else None


class Observer(TorchFunctionMode):
    """Records every host->device move made under it, per site, but torch's own
    (``_torchs_own``); latecast's copies are marked so. What a move handed out is on the
    device: moved again at another site it is not counted, at its own site it is each time."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: dict[tuple, Site] = {}
        self.steps = 0
        self.start = Path.cwd()  # sites are named relative to it
        self.latecasts = Marks()  # tensors latecast made
        self.arrived = Marks()  # what a recorded move handed out -> its site's file:line
        self.loaders: list[LoaderSeen] = []  # every DataLoader the script made
        self.loader_of = Marks()  # a DataLoader -> its index in loaders
        self.batches = Marks()  # tensors a DataLoader handed out -> its index in loaders
        # loaders (Ray Data's iterators) whose mark passes to what the host computes from them
        self.derived: set[int] = set()
        # --eval-steps: the training pass ended after --steps, the evaluation watched
        self.ending, self.late_steps, self.eval_batches, self.stopped = False, 0, 0, ""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)  # the mode is off in here: nothing below is recorded
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if _torchs_own(caller):
            return out
        ours = caller == "latecast" or caller.startswith("latecast.")
        if self.derived and not ours:  # a Ray batch normalized on the host stays its loader's
            marks = (self.batches.get(t) for t in _tensors(list(args)))
            loader = next((m for m in marks if m in self.derived), None)
            for t in _tensors(out) if loader is not None else ():
                if t.device.type == "cpu":
                    self.batches.add(t, loader)
        for t in _tensors(out) if ours else ():
            self.latecasts.add(t)
        moved = _moved(func, args, kwargs, out)
        if moved is not None and (ours or not self.latecasts.get(moved[0])):
            # with gradients off: evaluation (Module.to moves its parameters so too)
            evaluation = not torch.is_grad_enabled() and not caller.startswith("torch.nn.")
            self._record(moved, out, latecast=ours, evaluation=evaluation)
        return out

    def _record(self, moved: tuple, out: torch.Tensor, latecast: bool, evaluation: bool) -> None:
        t, dtype, target = moved  # as _moved found it
        axis = next((a for a in (1, 3) if t.dim() == 4 and t.shape[a] in CHANNELS), None)
        if t.dim() == 5:  # clips: NCTHW, NTCHW or NTHWC, the first dim of 1 or 3 channels
            axis = next((a for a in (1, 2, 4) if t.shape[a] in (1, 3)), None)
        # the script's own line (x.to(d), y.to(d) on one line: two sites, by instruction)
        frame = script_frame(sys._getframe(2))
        file, line, at = (
            (frame.f_code.co_filename, frame.f_lineno, frame.f_lasti) if frame else ("?", 0, 0)
        )
        where = f"{short_path(file, self.start)}:{line}"
        if not latecast:  # (latecast's pinned buffers cross at each site they are read at)
            if self.arrived.get(t) not in (None, where):  # on the device already: no crossing
                return
            self.arrived.add(out, where)
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
        s.from_floats |= t.dtype.is_floating_point and not dtype.is_floating_point
        if len(s.samples) < TENSORS and t.numel():
            s.samples.append(_sample(t, dtype, axis))


def _torchs_own(module: str) -> bool:
    """A move torch makes of a tensor it keeps on the device (``clip_grad_norm_``'s norms);
    a module's ``.to()`` and what DDP and DataParallel move are the script's."""
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
        if out.device.type == "cpu" and not is_script(sys._getframe(2)):
            return None  # a library's constant on the host (Normalize's mean), not a move
        return out, out.dtype, out.device.type
    else:
        return None
    if device is None or not isinstance(src, torch.Tensor) or src.device.type != "cpu":
        return None
    return src, dtype if dtype is not None and not non_blocking else src.dtype, device.type


def is_script(frame) -> bool:
    name = frame.f_globals.get("__name__", "")
    return name == "__main__" or not (_SKIP.match(name) or is_library(frame.f_code.co_filename))


def is_library(path: str) -> bool:
    """Installed code, the standard library or latecast: not the script's."""
    return path.startswith(_LIBRARY) or path.startswith(_PACKAGE)


def short_path(path: str, start: Path) -> str:
    """``path`` relative to ``start`` (where doctor started), or whole where it lies outside."""
    p = Path(path)
    return str(p.relative_to(start)) if p.is_absolute() and p.is_relative_to(start) else path


def _sample(t: torch.Tensor, dtype: torch.dtype, axis: int | None) -> np.ndarray:
    x = t.detach()[:SAMPLES] if t.dim() > 1 else t.detach().reshape(-1)
    x = x.movedim(axis, 0).reshape(x.shape[axis], -1) if axis else x.reshape(1, -1)
    x = x[:, :: -(-x.shape[1] // VALUES)].to("cpu", dtype)  # (channels, <= VALUES)
    return x.double().numpy() if dtype.is_floating_point else x.numpy().astype(np.float64)


TRANSFORMS = "torchvision.transforms.transforms"  # where ToTensor and Normalize are defined
RAY = "ray.data.iterator"  # where DataIterator.iter_torch_batches is (Dataset's calls it)
MADE_AT = ("ToTensor", "Normalize")  # the transforms whose line doctor's advice edits


@contextlib.contextmanager
def watching(obs: Observer, cfg) -> Iterator[None]:
    """While the script runs: its DataLoaders, their batches, where each ``ToTensor`` and
    ``Normalize`` is made; ``--eval-steps``' end of the training pass. Originals put back."""
    from torch.utils.data import DataLoader
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    made, iterators, undo = Marks(), Marks(), []

    def patch(owner: type, name: str, wrapper: Callable) -> None:
        """``owner.name`` calls ``wrapper(original, self, ...)`` until put back."""
        original = owner.__dict__.get(name)
        if original is not None:  # (a torchvision without its own ToTensor.__init__: none)

            def patched(self, *args, **kwargs):
                return wrapper(original, self, *args, **kwargs)

            undo.append((owner, name, original))
            setattr(owner, name, functools.wraps(original)(patched))

    def made_at(original: Callable, self, *args, **kwargs) -> None:
        original(self, *args, **kwargs)
        frame = script_frame(sys._getframe(1))
        made.add(self, frame and (frame.f_code.co_filename, frame.f_lineno))

    def transforms(module) -> None:
        for name in MADE_AT:
            patch(getattr(module, name), "__init__", made_at)

    def loader_init(original: Callable, self, *args, **kwargs) -> None:
        original(self, *args, **kwargs)
        frame = script_frame(sys._getframe(1))
        if frame is not None:
            obs.loaders.append(_loader(self, frame, made))
            obs.loader_of.add(self, len(obs.loaders) - 1)

    def loader_iter(original: Callable, self):
        iterator = original(self)
        iterators.add(iterator, (obs.loader_of.get(self), obs.ending))
        return iterator

    def loader_next(original: Callable, self):
        loader, late = iterators.get(self) or (None, False)
        if obs.ending and not late:  # the training pass, ended after --steps
            raise StopIteration
        try:
            if obs.ending and obs.eval_batches >= cfg.eval_steps:
                raise StopIteration  # --eval-steps batches watched: as if the loader were done
            batch = original(self)
        except StopIteration:
            if obs.ending:  # the evaluation is done: stop before what follows
                obs.stopped = "eval"
                raise Stop from None
            raise
        obs.eval_batches += obs.ending
        if loader is not None:
            for t in _tensors(batch):
                obs.batches.add(t, loader)
        return batch

    def torch_batches(original: Callable, self, *args, **kwargs):
        batches, frame = original(self, *args, **kwargs), script_frame(sys._getframe(1))
        if frame is None:
            return batches
        where = (frame.f_code.co_filename, frame.f_lineno)
        obs.loaders.append(LoaderSeen(*where, "iter_torch_batches", [], None, 0, RAY))
        obs.derived.add(len(obs.loaders) - 1)
        return _marked(batches, obs, len(obs.loaders) - 1)

    patch(DataLoader, "__init__", loader_init)
    patch(DataLoader, "__iter__", loader_iter)
    patch(_BaseDataLoaderIter, "__next__", loader_next)
    ray = (RAY, lambda module: patch(module.DataIterator, "iter_torch_batches", torch_batches))
    finders = [AfterImport(name, then) for name, then in [(TRANSFORMS, transforms), ray]]
    for finder in finders:
        if finder.name in sys.modules:
            finder.then(sys.modules[finder.name])
        else:
            sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        for finder in finders:
            if finder in sys.meta_path:
                sys.meta_path.remove(finder)
        for owner, name, original in reversed(undo):
            setattr(owner, name, original)


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then(module)`` once the module ``name`` is imported, by whoever imports it."""

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


def script_frame(frame):
    """The innermost frame of the script at or above ``frame``, or None."""
    while frame is not None and not is_script(frame):
        frame = frame.f_back
    return frame


def _loader(loader, frame, made: Marks) -> LoaderSeen:
    """What doctor keeps of a DataLoader made at ``frame``: its dataset's transform's parts
    and where each was made, read from instance dictionaries only (through Subset and
    ConcatDataset; a joint ``transforms=`` through its first ``Compose`` attribute)."""
    todo, transform, holder = [vars(loader).get("dataset")], None, None
    for _ in range(8):
        if not todo or transform is not None:
            break
        holder = todo.pop(0)
        d = getattr(holder, "__dict__", {})
        transform = next((d[k] for k in ("transform", "transforms") if d.get(k) is not None), None)
        todo += [d["dataset"]] if "dataset" in d else list(d.get("datasets", ()))[:8]
    held = [transform, *getattr(transform, "__dict__", {}).values()]  # a Compose, or holds one
    lists = (getattr(t, "__dict__", {}).get("transforms") for t in held)
    parts = next((p for p in lists if isinstance(p, (list, tuple))), [transform])
    parts = [p for p in parts if p is not None]
    normalize = next((p for p in parts if type(p).__name__ == "Normalize"), None)
    stats = normalize and tuple(tuple(float(x) for x in v) for v in (normalize.mean, normalize.std))
    made_at = [(type(p).__name__, made.get(p)) for p in parts]
    workers, dataset = vars(loader).get("num_workers", 0), type(holder)
    held = getattr(holder, "__dict__", {}).values()
    sixteen = any(str(getattr(v, "dtype", "")).endswith(SIXTEEN) for v in held)
    return LoaderSeen(
        frame.f_code.co_filename, frame.f_lineno, type(loader).__name__, made_at, stats,
        int(workers), f"{dataset.__module__}.{dataset.__name__}",
        stored=next(filter(None, map(_window, parts)), sixteen),
    )  # fmt: skip


SIXTEEN = ("int16", "uint16")  # numpy's and torch's names of them end so


def _window(transform) -> tuple | None:
    """MONAI's ``ScaleIntensityRange`` (or its ``d`` form's ``scaler``) that clips: its window
    ``(a_min, a_max)`` in stored units and the key it reads, else None."""
    scaler = getattr(transform, "scaler", transform)
    if type(scaler).__name__ != "ScaleIntensityRange" or not getattr(scaler, "clip", False):
        return None
    keys = getattr(transform, "keys", None) or (0,)
    return (float(scaler.a_min), float(scaler.a_max)), keys[0]


def _marked(batches, obs: Observer, index: int) -> Iterator:
    """Ray Data's batches, each tensor marked as loader ``index``'s; its image-shaped columns
    kept."""
    for batch in batches:
        for t in _tensors(batch):
            obs.batches.add(t, index)
        if isinstance(batch, dict) and not obs.loaders[index].columns:
            images = [k for k, t in batch.items() if isinstance(t, torch.Tensor) and t.dim() == 4]
            obs.loaders[index].columns = images
        yield batch


def _tensors(batch) -> list[torch.Tensor]:
    """The tensors of a batch: itself, or the fields of a tuple, list or dict."""
    fields = batch.values() if isinstance(batch, dict) else batch
    fields = fields if isinstance(batch, (tuple, list, dict)) else [batch]
    return [t for t in fields if isinstance(t, torch.Tensor)]
