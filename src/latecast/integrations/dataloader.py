"""``latecast.wrap``: a ``DataLoader`` comes back as an instance of its own class (frameworks
that look for one find it); any other iterable as the core's ``Wrapped``."""

from __future__ import annotations

import inspect
from typing import Any, Iterable

import torch
from torch.utils.data import DataLoader

from ..errors import ConfigError
from ..wrapper import Fields, Wrapped


class WrappedLoader(Wrapped, DataLoader):
    """``wrap`` of a ``DataLoader``: an instance of the loader's own class sharing its
    ``__dict__``. Re-made from arguments (Lightning's sampler injection), it makes a loader of
    the source's class and wraps it the same way."""

    source: type  # set on each wrap's own class, with `options`: what __init__ re-makes
    options: tuple  # (Fields, device)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._adopt(self.source(*args, **kwargs))

    @property
    def _is_accelerate_prepared(self) -> bool:
        """What accelerate's ``prepare`` asks first: True where accelerate made the source, else
        a ConfigError (``prepare`` would re-make it without the wrap)."""
        if vars(self).get("_is_accelerate_prepared") or type(self.batches).__module__.startswith(
            "accelerate."
        ):
            return True
        raise ConfigError(
            "accelerator.prepare(latecast.wrap(dl)) would re-make the loader as accelerate's "
            "DataLoaderShard without latecast (uint8 batches); wrap what prepare returns: "
            "latecast.wrap(accelerator.prepare(dl, device_placement=[False]), mean=..., std=...)"
        )

    def _adopt(self, loader: DataLoader) -> WrappedLoader:
        object.__setattr__(self, "__dict__", loader.__dict__)
        Wrapped.__init__(self, loader, *self.options)
        return self


def loader_class(cls: type, fields: Fields, device: str | torch.device) -> type:
    """A ``WrappedLoader`` class for loaders of class ``cls``, wrapped with these options."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        WrappedLoader.__init__(self, *args, **kwargs)

    __init__.__signature__ = inspect.signature(cls.__init__)  # read by Lightning to re-make it
    body = {"__init__": __init__, "source": cls, "options": (fields, device)}
    if hasattr(cls, "state_dict"):  # else the source's own, one batch ahead, would answer
        body.update(state_dict=Wrapped._state_dict, load_state_dict=Wrapped._load_state_dict)
    return type(f"Wrapped{cls.__name__}", (WrappedLoader, cls), body)


def wrap(batches: Iterable, *, device: str | torch.device = "auto", **options: Any) -> Wrapped:
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
    spec = Fields.of(options)
    if isinstance(batches, Wrapped):
        raise ConfigError(f"{type(batches).__name__} is wrapped already: wrap its source once")
    if isinstance(batches, DataLoader):
        return object.__new__(loader_class(type(batches), spec, device))._adopt(batches)
    return Wrapped(batches, spec, device)
