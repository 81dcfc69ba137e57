"""``latecast.wrap`` of a ``DataLoader``: the wrapped loader is an instance of the loader's own
class, so the frameworks that look for a DataLoader find one (Lightning re-makes it with its
``DistributedSampler``; accelerate's ``prepare`` is refused, its own loader wrapped instead),
and timm's ``loader.mixup_enabled`` switch reaches the mix wherever it lives. Any other
iterable is wrapped by the core's ``Wrapped``.
"""

from __future__ import annotations

import inspect
from typing import Any, Iterable

import torch
from torch.utils.data import DataLoader

from ..errors import ConfigError
from ..wrapper import Fields, Wrapped


class WrappedLoader(Wrapped, DataLoader):
    """``wrap`` of a ``DataLoader``: an instance of the loader's own class that shares its
    attributes (one ``__dict__``) and moves its batches. So frameworks that look for a
    DataLoader find one: Lightning injects its ``DistributedSampler`` by re-making it as
    ``type(w)(**arguments read off it)``, which makes a loader of the source's class from those
    arguments and wraps it the same way. accelerate's ``prepare`` would re-make it as its own
    class: that is refused (wrap what ``prepare`` returns instead; README, "Your own data")."""

    source: type  # set on each wrap's own class, with `options`: what __init__ re-makes
    options: tuple  # (Fields, device)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._adopt(self.source(*args, **kwargs))

    @property
    def _is_accelerate_prepared(self) -> bool:
        """What accelerate's ``prepare`` asks a DataLoader first: True returns it as it is.
        A source accelerate has not sharded would be re-made as accelerate's own
        ``DataLoaderShard`` from its arguments, without the wrap (uint8 to the loop)."""
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
    """Batches of ``batches`` (any iterable: a ``DataLoader``, a generator, a list) on the
    device: uint8 images augmented and normalized there, integers widened there after
    crossing narrow, every field of a batch in one pinned buffer and one copy, the next
    batch's copy started on a side CUDA stream while this one is used. Every attribute but
    latecast's own (``stats``, ``device``, ``epoch``, ...) is read from and written to
    ``batches``; a ``DataLoader`` comes back as one of its class (``WrappedLoader``). Rank and
    device are resolved at the first pass. What a field is: see the module docstring.

    Args:
        batches: yields a tensor, a tuple/list or a dict of tensors or numpy arrays.
        device: ``"auto"`` (``cuda:LOCAL_RANK`` under a launcher), ``"cpu"``, ``"cuda:1"``, ...
        options: the fields of ``latecast.wrapper.Fields``:
        mean, std: per-channel statistics in [0, 1] units (as ``Normalize``); without them
            images are only scaled to [0, 1] (as ``ToTensor``).
        augment: ``f(images, generator)`` on uint8 ``(N, H, W, C)``, e.g. ``latecast.Augment``
            (without ``altflip``: it needs dataset indices; an ``Augment`` where there are
            masks); seeded from (seed, epoch, rank, batch) like the Loader's.
        dtype, channels_last: the images' output dtype and memory format: the model's
            (timm's ``--model-dtype bfloat16``: ``dtype=torch.bfloat16``).
        layout: ``"auto"``, ``"NHWC"`` or ``"NCHW"``: where uint8 images keep their channels.
        fields: ``{name: "image" | "mask" | latecast.jpeg(...) | integer dtype | (integer
            dtype, output dtype) | a Field subclass (a kind of your own, ``fields.py``)}``.
        seed: mixed into the augmentation's seeds.
        erase: ``latecast.Erasing(p=...)``, torchvision's ``RandomErasing`` per image on the
            normalized batch (drawn from the augmentation's generator).
        mask_fill: what declared masks are padded with where a crop leaves no pixel (0; the
            ignore index of your loss, e.g. 255 as torchvision's segmentation reference).
        mix: ``f(images, labels, generator)`` on the normalized images and the batch's one
            integer field of one value per sample, e.g. ``latecast.transforms.Mix`` or
            torchvision's ``lambda x, y, g: MixUp(num_classes=10)(x, y)``; the labels come out
            as it makes them (class probabilities). ``mixup_enabled`` switches it.

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
