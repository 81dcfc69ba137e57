"""``latecast.wrap``: a ``DataLoader`` comes back as an instance of its own class (frameworks
that look for one find it), any other iterable as a ``Forwarding`` (the core's ``Wrapped``)."""

from __future__ import annotations

import contextlib
import inspect
import threading
from typing import Any, Callable, Iterable, Iterator

import torch
from torch.utils.data import DataLoader

from ..errors import ConfigError
from ..transfer import END, Sent
from .plan import Options
from .wrapped import Wrapped


class Forwarding(Wrapped):
    """``wrap`` of any iterable: what latecast does not own (attributes, ``set_epoch``, a
    source's state, timm's ``mixup_enabled``) forwarded to the source, read ahead unseen
    (``Behind``). Every attribute not latecast's (slots, methods, properties) is the source's."""

    __slots__ = ("_state", "_behind")  # the source's state after the batch out; its Behind

    def __init__(self, batches: Iterable, options: Options, device: str | torch.device) -> None:
        super().__init__(batches, options, device)
        self._state = self._behind = None

    def __getattr__(self, name: str) -> Any:
        """The source's attribute; ``state_dict`` and ``load_state_dict`` are latecast's
        where the source has them (Lightning and accelerate ask ``hasattr``)."""
        if name in OWN or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(name)  # not set yet (copy, pickle): never the source's
        if name in ("state_dict", "load_state_dict") and hasattr(self.batches, name):
            return getattr(self, f"_{name}")
        return getattr(self.batches, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in OWN or getattr(getattr(type(self), name, None), "fset", None):
            object.__setattr__(self, name, value)
        else:
            setattr(self.batches, name, value)

    @property
    def mixup_enabled(self) -> bool:
        """timm's switch of its loader's mixing, for the mix wherever it lives: ``mix=``, else
        the source's or its ``collate_fn``'s switch. False where nothing mixes; switching
        that on is a ConfigError."""
        owner, name = self._mixer()
        return owner is not None and bool(getattr(owner, name))

    @mixup_enabled.setter
    def mixup_enabled(self, on: bool) -> None:
        owner, name = self._mixer()
        if owner is not None:
            setattr(owner, name, on)
        elif on:
            raise ConfigError(
                "mixup_enabled = True: nothing mixes here; give wrap mix=..., or a loader "
                "whose collate_fn mixes and has mixup_enabled (timm's FastCollateMixup)"
            )

    def _mixer(self) -> tuple[Any, str]:
        if self.options.mix is not None:
            return self, "mixing"
        for owner in (self.batches, getattr(self.batches, "collate_fn", None)):
            if owner is not None and hasattr(owner, "mixup_enabled"):
                return owner, "mixup_enabled"
        return None, ""

    def set_epoch(self, epoch: int) -> None:
        """Seed augmentation from ``epoch``; passed on to the source's ``set_epoch``, else to
        its sampler's and its dataset's."""
        super().set_epoch(epoch)
        source = self.batches
        if callable(getattr(source, "set_epoch", None)):
            return source.set_epoch(epoch)
        for obj in (getattr(source, "sampler", None), getattr(source, "dataset", None)):
            if callable(getattr(obj, "set_epoch", None)):
                obj.set_epoch(epoch)

    def _state_dict(self) -> dict:
        source = self._state
        if source is None:  # after the last batch (the source run to its end), or before any
            get = self.batches.state_dict
            source = self._behind.finish(get) if self._behind else get()
        return {"epoch": self.epoch, "position": self.position, "source": source}

    def _load_state_dict(self, state: dict) -> None:
        epoch, position = self._saved(state, "source")
        self.batches.load_state_dict(state["source"])
        self.epoch, self.position, self._state, self._behind = epoch, position, None, None

    def _source_state(self) -> Any:
        """The source's state, or None where it keeps none."""
        try:
            return self.batches.state_dict() if hasattr(self.batches, "state_dict") else None
        except AttributeError:  # accelerate's DataLoaderShard over a plain DataLoader
            return None

    def _finished(self) -> Iterator[tuple[Any, bool]]:
        source = self._behind = Behind(self.batches)
        state = self._source_state if self._source_state() is not None else lambda: None
        yield from self._ahead(source, state)
        rest = source.rest()  # past the last by len(): nothing, unless len() fell short
        if rest is not None:  # then the epoch counted as ended at the last by len() goes on
            self.epoch, self.position = self.epoch - 1, source.taken - 1
            yield from self._ahead(rest, state)

    def _handing(self, s: Sent, last: bool) -> None:
        self._state = None if last else s.state  # the last: the next epoch's, the source's
        self._behind.show(0)  # the next batch is taken: the source as before it


OWN = frozenset(Wrapped.__slots__ + Forwarding.__slots__)  # latecast's, not the source's


class Behind:
    """A read-ahead's source seen as if it were not read ahead, so what it signals as it
    yields (accelerate's ``end_of_dataloader``) stays true of the batch in use: attributes
    it sets while batch k + 1 is taken are put back while batch k is out (``show(0)``); where
    its ``len()`` is known, it is run past its last batch (its end-of-pass code) only when the
    next is asked for (``rest``) or the state saved (``finish``)."""

    def __init__(self, source: Iterable) -> None:
        self.it, self.attrs = iter(source), getattr(source, "__dict__", None)
        self.length, self.taken = None, 0  # None: no len(), or a guess (an IterableDataset's)
        if not isinstance(getattr(source, "dataset", None), torch.utils.data.IterableDataset):
            with contextlib.suppress(TypeError):
                self.length = len(source)
        self.changed: dict[str, tuple[Any, Any]] = {}  # by the last take: (before, after)
        self.held: list = []  # taken before it was asked for (END: the source has ended)

    def __iter__(self) -> Iterator[Any]:
        while self.taken != self.length:
            batch = self.take()
            if batch is END:
                return
            yield batch
            ended = self.changed.get("end_of_dataloader", (None, None))[1]  # set in taking it
            if self.length is None and ended is True:
                self.length = self.taken  # the source said it was its last (accelerate's)
        self.show(1)  # the last batch goes out as the source left it

    def take(self) -> Any:
        """The source's next batch (or END), recording the attributes taking it changed."""
        self.show(1)
        if self.held:
            return self.held.pop()
        before = dict(self.attrs or {})
        batch = next(self.it, END)
        after = before if batch is END else self.attrs or {}
        self.taken += batch is not END
        pairs = ((k, (before.get(k, END), after.get(k, END))) for k in {*before, *after})
        self.changed = {k: pair for k, pair in pairs if pair[0] is not pair[1]}
        return batch

    def show(self, which: int) -> None:
        """The source's attributes as before (0) or after (1, for good) its last take."""
        for k, values in self.changed.items():
            if values[which] is END:
                self.attrs.pop(k, None)
            else:
                self.attrs[k] = values[which]
        self.changed = self.changed if which == 0 else {}

    def ended(self) -> bool:
        """Whether the source has no batch past its ``len()``; finding out runs its end."""
        if self.taken == self.length and not self.held:
            self.held.append(self.take())
        return not self.held or self.held[0] is END

    def finish(self, state: Callable[[], Any]) -> Any:
        """``state()`` once the source has run to its end (the next pass's); where it yields
        past its ``len()``, its state before that batch."""
        before = state()
        if self.ended():
            return state()
        self.show(0)  # the batch taken is not out yet
        return before

    def rest(self) -> Iterator[Any] | None:
        """What the source yields past its ``len()``; None where it ended there."""
        if self.ended():
            return None
        self.length = None
        return iter(self)


class WrappedLoader(Forwarding, DataLoader):
    """``wrap`` of a ``DataLoader``: an instance of the loader's own class sharing its
    ``__dict__``. Re-made from arguments (Lightning's sampler injection), it makes a loader of
    the source's class and wraps it the same way."""

    wrapping: tuple  # (Options, device), set on each wrap's own class

    @property
    def _is_accelerate_prepared(self) -> bool:
        """What accelerate's ``prepare`` asks first: True where accelerate made the source, else
        a ConfigError (``prepare`` would re-make it without the wrap)."""
        made = vars(self).get("_is_accelerate_prepared")  # set on its shards by accelerate
        if made or type(self.batches).__module__.startswith("accelerate."):
            return True
        raise ConfigError(
            "accelerator.prepare(latecast.wrap(dl)) would re-make the loader as accelerate's "
            "DataLoaderShard without latecast (uint8 batches); wrap what prepare returns: "
            "latecast.wrap(accelerator.prepare(dl, device_placement=[False]), mean=..., std=...)"
        )

    def _adopt(self, loader: DataLoader) -> WrappedLoader:
        object.__setattr__(self, "__dict__", loader.__dict__)
        Forwarding.__init__(self, loader, *self.wrapping)
        return self


def loader_class(cls: type, options: Options, device: str | torch.device) -> type:
    """A ``WrappedLoader`` class for loaders of class ``cls``, wrapped with these options."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._adopt(cls(*args, **kwargs))

    __init__.__signature__ = inspect.signature(cls.__init__)  # read by Lightning to re-make it
    body = {"__init__": __init__, "wrapping": (options, device)}
    if hasattr(cls, "state_dict"):  # else the source's own, one batch ahead, would answer
        body.update(state_dict=Forwarding._state_dict, load_state_dict=Forwarding._load_state_dict)
    return type(f"Wrapped{cls.__name__}", (WrappedLoader, cls), body)


def wrap(batches: Iterable, *, device: str | torch.device = "auto", **options: Any) -> Forwarding:
    """Batches of ``batches`` on the device: every field of a batch in one pinned buffer and
    one copy (the next batch's on a side stream), uint8 images augmented and normalized there,
    integers widened after crossing narrow. Attributes other than latecast's own (``stats``,
    ``device``, ``epoch``, ...) are the source's. Bad options: ConfigError; bad batches:
    BatchError.

    Args:
        batches: yields a tensor, a tuple/list or a dict of tensors or numpy arrays.
        device: ``"auto"`` (``cuda:LOCAL_RANK`` under a launcher), ``"cpu"``, ``"cuda:1"``, ...;
            resolved, with the rank, at the first pass.
        mean, std: per-channel statistics in [0, 1] units; without them images are only
            scaled to [0, 1].
        augment: ``f(images, generator)`` on uint8 ``(N, H, W, C)``, e.g. ``latecast.Augment``
            (no ``altflip``; an ``Augment`` where there are masks), seeded from (seed, epoch,
            rank, batch).
        dtype, channels_last: the images' output dtype and memory format.
        layout: ``"auto"``, ``"NHWC"`` or ``"NCHW"``: where uint8 images keep their channels.
        fields: ``{name: "image" | "mask" | latecast.jpeg(...) | integer dtype | (integer
            dtype, output dtype) | a Field subclass}``.
        seed: mixed into the augmentation's seeds.
        erase: ``latecast.Erasing(p=...)`` on the normalized images.
        mask_fill: what masks are padded with where a crop leaves no pixel (e.g. 255).
        mix: ``f(images, labels, generator)`` on the normalized images and the one integer
            field of one value per sample, e.g. ``latecast.transforms.Mix``; switched by
            ``mixup_enabled``.

    Example:
        >>> tf = torchvision.transforms.PILToTensor()   # uint8 (C, H, W), not ToTensor()
        >>> dl = DataLoader(ImageFolder("train", tf), batch_size=256, num_workers=8)
        >>> for images, labels in latecast.wrap(dl, mean=MEAN, std=STD, device="cuda"):
        ...     ...   # float32 (256, 3, H, W) normalized on the device; int64 labels
    """
    if not isinstance(batches, Iterable):
        raise ConfigError(f"batches must be an iterable of batches, got {batches!r:.60}")
    spec = Options.of(options)
    if isinstance(batches, Wrapped):
        raise ConfigError(f"{type(batches).__name__} is wrapped already: wrap its source once")
    if isinstance(batches, DataLoader):
        return object.__new__(loader_class(type(batches), spec, device))._adopt(batches)
    return Forwarding(batches, spec, device)


class Mover(Wrapped):
    """``mover(batch)``: one host batch moved and prepared as ``wrap`` moves each of its
    batches, for programs that build batches per call; no read-ahead. ``position`` counts the
    calls and seeds the augmentation with ``epoch`` and the rank. Calls from several threads
    take turns.

    Example:
        >>> mover = latecast.Mover(device="cuda")            # wrap's options: fields=, mean=...
        >>> x, y = mover((x, y))   # int64 token ids cross as uint16, int64 on the device
    """

    def __init__(self, *, device: str | torch.device = "auto", **options: Any) -> None:
        super().__init__(None, Options.of(options), device)
        self._lock = threading.Lock()

    def __call__(self, batch: Any) -> Any:
        with self._lock:
            self._start()
            batch = self.finish(self.send(batch))
            self.position += 1
        return batch
