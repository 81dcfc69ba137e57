"""PyTorch Lightning: your ``DataLoader`` yields uint8, ``PrepareOnDevice`` packs each batch
in ``transfer_batch_to_device`` and finishes it in ``on_after_batch_transfer`` (Lightning's
place for device-side work), as ``latecast.wrap`` would, through the same two halves
(``Wrapped.send`` and ``finish``): the one path, no other. Imports no Lightning itself."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from ..errors import BatchError, ConfigError
from ..transfer import Sent, TransferStats
from .plan import Options
from .wrapped import Wrapped


class PrepareOnDevice:
    """Mixin for a ``LightningModule``: its uint8 batches are prepared on the device, seeded
    from (seed, epoch, global rank, batch). List it before ``LightningModule`` (else a
    ConfigError when the class is made); without ``prepare_on_device`` images are only scaled
    to [0, 1].

    Example:
        >>> class Classifier(PrepareOnDevice, L.LightningModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.prepare_on_device(mean=(0.1307,), std=(0.3081,), augment=Augment(crop=2))
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in cls.__mro__[: cls.__mro__.index(PrepareOnDevice)]:
            if "on_after_batch_transfer" in vars(base) and not issubclass(base, PrepareOnDevice):
                raise ConfigError(
                    f"class {cls.__name__}: list PrepareOnDevice before {base.__name__} in its "
                    f"bases, class {cls.__name__}(PrepareOnDevice, LightningModule); after it, "
                    f"{base.__name__}.on_after_batch_transfer runs instead and batches stay uint8"
                )

    def prepare_on_device(self, **options: Any) -> None:
        """``options`` as for ``latecast.wrap``; augment, erase and mix in training only, and
        a field's own draws too (a declaration's ``evaluated()``: waveform's gain and crop)."""
        train = Options.of(options)  # and, by self.training, for evaluation:
        fields = train.fields and {name: _evaluated(kind) for name, kind in train.fields.items()}
        evaluation = replace(train, augment=None, erase=None, mix=None, fields=fields)
        self._latecast = {True: train, False: evaluation}
        self._latecast_stats, self._latecast_movers = TransferStats(), {}

    @property
    def latecast_stats(self) -> TransferStats:
        """The bytes of the batches prepared (training and evaluation), as ``wrap.stats``."""
        return replace(self._latecast_stats)

    def _latecast_mover(self, device: torch.device) -> Wrapped:
        """The two halves for this mode (training or evaluation) on ``device``."""
        if not hasattr(self, "_latecast"):
            self.prepare_on_device()
        key = (self.training, str(device))
        if key not in self._latecast_movers:
            options = self._latecast[self.training]
            mover = Wrapped(None, options, device, stats=self._latecast_stats)
            mover._start()
            self._latecast_movers[key] = mover
        return self._latecast_movers[key]

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int):
        """The batch packed and its copy started; ``on_after_batch_transfer`` finishes it, by
        the same mover (its ring holds the batch)."""
        _refuse_datamodule_hook(self)
        self._latecast_sender = self._latecast_mover(device)
        trainer = self.trainer
        step = trainer.fit_loop.epoch_loop.batch_idx + 1  # Lightning counts it up after the hooks
        where = (trainer.current_epoch, trainer.global_rank, step)  # what finishes it too
        return self._latecast_sender.send(batch, where=where)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        batch = super().on_after_batch_transfer(batch, dataloader_idx)
        if not isinstance(batch, Sent):
            raise BatchError(
                f"PrepareOnDevice finishes the batches its transfer_batch_to_device packs; this "
                f"{type(batch).__name__} came from another one: leave the move to PrepareOnDevice "
                "(or call super().transfer_batch_to_device from yours)"
            )
        return self._latecast_sender.finish(batch)  # by the (epoch, rank, batch) it was sent for


def _refuse_datamodule_hook(module: Any) -> None:
    """A ``LightningDataModule`` that overrides ``on_after_batch_transfer`` (TorchGeo's, for
    its ``Normalize``) gets the packed batch in place of the mixin's hook, which never runs:
    refused before the first batch is packed, naming the change."""
    data = getattr(module.trainer, "datamodule", None)
    hook = getattr(type(data), "on_after_batch_transfer", None)
    if hook is None or hook.__qualname__ == "DataHooks.on_after_batch_transfer":  # Lightning's
        return
    name, owner = type(data).__name__, hook.__qualname__.split(".")[0]
    raise ConfigError(
        f"{name}.on_after_batch_transfer ({owner}'s) runs in place of PrepareOnDevice's, "
        f"which then never finishes a batch; drop it in a subclass, class Data({name}): "
        "on_after_batch_transfer = LightningDataModule.on_after_batch_transfer, and give what "
        "it did to the batch to prepare_on_device (mean/std, fields=, augment=)"
    )


def _evaluated(kind: Any) -> Any:
    """A declaration of ``fields=`` as evaluation takes it: its ``evaluated()`` where it has
    one (a field that draws of its own), else as it is."""
    evaluated = getattr(kind, "evaluated", None)
    return evaluated() if callable(evaluated) and not isinstance(kind, type) else kind
