"""PyTorch Lightning: your ``DataLoader`` yields uint8, ``PrepareOnDevice`` packs each batch
in ``transfer_batch_to_device`` and finishes it in ``on_after_batch_transfer`` (Lightning's
place for device-side work), as ``latecast.wrap`` would. Imports no Lightning itself."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from ..errors import ConfigError
from ..fields import AsIs, split
from ..transfer import Ring, Sent, TransferStats, unpack
from ..wrapper import Fields


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
        """``options`` as for ``latecast.wrap``; augment, erase and mix in training only."""
        train = Fields.of(options)  # and, by self.training, for evaluation:
        self._latecast = {True: train, False: replace(train, augment=None, erase=None, mix=None)}
        self._latecast_moved = {k: replace(f) for k, f in self._latecast.items()}
        for f in self._latecast_moved.values():
            f.moved = True  # batches another transfer_batch_to_device moved
        self._latecast_stats, self._latecast_ring = TransferStats(), None

    @property
    def latecast_stats(self) -> TransferStats:
        """The bytes of the batches prepared (training and evaluation), as ``wrap.stats``."""
        return replace(self._latecast_stats)

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int):
        """The batch packed and its copy started; ``on_after_batch_transfer`` finishes it."""
        if not hasattr(self, "_latecast"):
            self.prepare_on_device()
        if self._latecast_ring is None or self._latecast_ring.device != device:
            self._latecast_ring = Ring(2, device)
        fields = self._latecast[self.training]
        return fields.send(self._latecast_ring, batch, self._latecast_stats)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        batch = super().on_after_batch_transfer(batch, dataloader_idx)
        if not hasattr(self, "_latecast"):
            self.prepare_on_device()
        trainer = self.trainer
        step = trainer.fit_loop.epoch_loop.batch_idx + 1  # Lightning counts it up after this hook
        where = (trainer.current_epoch, trainer.global_rank, step)
        self._latecast_stats.batches += 1
        if isinstance(batch, Sent):  # packed by transfer_batch_to_device above
            ring, extra = self._latecast_ring, batch.extra
            fields, plans = self._latecast[self.training], batch.plans
            views, device = unpack(ring, batch, keep=True), ring.device
        else:  # moved by a transfer_batch_to_device of your own: finished as it came
            fields, extra = self._latecast_moved[self.training], split(batch)
            values, plans = fields.plan(extra[0])
            tensors = [v if isinstance(v, torch.Tensor) else None for v in values]
            self._latecast_stats.count(plans, copies=sum(t is not None for t in tensors))
            plans = [None if isinstance(f, AsIs) else f for f in plans]  # as they came
            device = next((t.device for t in tensors if t is not None), None)
            views = [  # the fields' bytes viewed as unpack views them
                f and f.view(t.to(f.dtype).contiguous().view(-1).view(torch.uint8), device)
                for t, f in zip(tensors, plans)
            ]
        return fields.finish_batch(plans, views, extra, where, device)
