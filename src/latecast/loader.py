"""The Loader: a source's index batches (which samples, in what order, on which rank; an
in-memory dataset's is ``order.Order``, ``DistributedSampler``'s, a stream brings its own),
moved by a mover (``movers.py``) and finished on the device (``prepare.py``). Static batches:
one shape in two buffers, so a CUDA graph can capture a step (on ``resident``: ``staged`` and
``fill``)."""

from __future__ import annotations

import numbers
import time
from dataclasses import replace
from functools import partial
from typing import Any, Iterable, Iterator

import numpy as np
import torch

from .data import Batch, Split
from .distributed import placement
from .errors import ConfigError, refuse
from .movers import Resident, Stored, resolve
from .order import Order
from .prepare import Augmentation, Mixing, Prepare
from .threads import one_thread
from .transfer import TransferStats, float32_bytes
from .transforms import FLOATS, Mix

# The label of a static evaluation batch's padding: F.cross_entropy's ignore_index, and
# never equal to a predicted class, so padding counts in no loss and no accuracy.
IGNORE = -100


def whole(value: Any, low: int = 0) -> bool:
    """Whether ``value`` is an integer (numpy's too, not a bool) in ``low..2**63-1``."""
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    return ok and low <= value < 2**63


class Epochs:
    """The ``epoch`` and ``position`` (batches of it handed out) of ``Loader`` and ``wrap``,
    both set by their ``__init__``."""

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch`` from the next pass on (like ``DistributedSampler``)."""
        refuse([(whole(epoch), "epoch", epoch, "an integer in 0..2**63-1")])
        if epoch != self.epoch:
            self.epoch, self.position = int(epoch), 0

    @staticmethod
    def _saved(state: Any, *more: str) -> tuple[int, int]:
        """``(epoch, position)`` of a ``state_dict()`` (which also holds ``more``), or one
        ConfigError: not a dict, or not their numbers."""
        got = state if isinstance(state, dict) else {}
        ints = [isinstance(got.get(k), numbers.Integral) for k in ("epoch", "position")]
        ok = all(ints) and min(got["epoch"], got["position"]) >= 0 and set(more) <= set(got)
        keys = ", ".join(("epoch", "position", *more))
        refuse([(ok, "state", state, f"a state_dict() of this loader: {keys}, counts >= 0")])
        return int(got["epoch"]), int(got["position"])

    def _count(self, items: Iterable[tuple[Any, bool]]) -> Iterator[Any]:
        """A pass's items, counted; the next epoch starts before the last is handed out (at
        once for a pass with none): a consumer that stops after it (Lightning knows len())
        or saves a checkpoint there starts the next epoch on its next pass."""
        empty = True
        for item, last in items:
            self.position, empty = self.position + 1, False
            if last:
                self.epoch, self.position = self.epoch + 1, 0
            yield item
        if empty:
            self.epoch, self.position = self.epoch + 1, 0


class Loader(Epochs):
    """Batches of ``(images, labels)`` ready on the device: images normalized float
    ``(N, C, H, W)``, labels int64. ``len()`` and ``set_epoch()`` work as with a
    ``DataLoader`` over a ``DistributedSampler``; the epoch also advances by itself after
    each complete pass. Rank, world size and device are resolved at the first pass, so a
    Loader built before a launcher's processes exist gets its own. A bad argument: one
    ConfigError naming it.

    Args:
        dataset: a ``Dataset`` (uint8 images), an ``EncodedDataset`` (JPEG files, decoded to
            ``dataset.size`` on the device), or a split with its own ``source(batch_size,
            **options)`` (a stream of shards: its own order, every sample once an epoch) or
            its own ``movers`` (``{name: Mover subclass}``: a JPEG store's ``jpeg``).
        batch_size: samples per batch, per rank.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...
        transfer: ``"uint8"``, ``"prefetch"``, ``"resident"``, ``"jpeg"`` (JPEG stores), a
            dataset's own or ``"auto"`` (``movers.resolve``); or a mover class (the usual
            float32 pipeline: ``latecast.trainer.baseline.Float32``).
        shuffle, seed: a new permutation per epoch from ``seed + epoch``.
        drop_last: drop this rank's last partial batch.
        dtype, channels_last: float32, bfloat16 or float16 output, in channels_last format.
        rank, world_size: this process's share; default from the process group or launcher.
        augment: uint8 -> uint8 ``f(images, generator)`` before the normalize (``Augment``).
        pad: wrap the order to a multiple of the world size (training); ``False``: each
            sample on one rank only (evaluation).
        order: ``"random"``, or ``"block:BLOCK:WINDOW"`` for stores bigger than RAM
            (``block_order``; ``"block"`` is ``"block:32:256"``).
        mix: ``f(images, labels, generator)`` after the normalize (``transforms.Mix``);
            labels become class probabilities.
        static: every batch ``batch_size`` long, in the same two buffers (overwritten by the
            next): training (``pad=True``) drops a partial last batch, evaluation pads it
            with labels ``IGNORE``.

    Example:
        >>> train = latecast.load_dataset("mnist")
        >>> loader = latecast.Loader(train, batch_size=256, device="cuda")
        >>> images, labels = next(iter(loader))  # (256, 1, 28, 28) float32, (256,) int64
    """

    def __init__(
        self,
        dataset: Split,
        batch_size: int,
        device: str | torch.device = "auto",
        transfer: str | type = "auto",
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        dtype: torch.dtype = torch.float32,
        channels_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        augment: Augmentation | None = None,
        pad: bool = True,
        order: str = "random",
        mix: Mixing | None = None,
        static: bool = False,
    ) -> None:
        kinds = "a latecast Dataset (load_dataset, open_store, from_arrays)"
        refuse([(isinstance(dataset, Split), "dataset", dataset, kinds)])
        flags = dict(shuffle=shuffle, drop_last=drop_last, channels_last=channels_last, pad=pad)
        flags, k = {**flags, "static": static}, dataset.num_classes
        mixes = f"a Mix of the dataset's {k} classes"
        refuse([
            (whole(batch_size, 1), "batch_size", batch_size, "an integer in 1..2**63-1"),
            (whole(seed), "seed", seed, "an integer in 0..2**63-1"),
            (isinstance(transfer, (str, type)), "transfer", transfer, "a transfer name or mover"),
            (any(dtype is d for d in FLOATS), "dtype", dtype, ", ".join(map(str, FLOATS))),
            (augment is None or callable(augment), "augment", augment, "f(images, generator)"),
            (mix is None or callable(mix), "mix", mix, "f(images, labels, generator)"),
            (not isinstance(mix, Mix) or mix.classes == k, "mix", mix, mixes),
            *[(isinstance(v, (bool, np.bool_)), n, v, "True or False") for n, v in flags.items()],
        ])  # fmt: skip
        batch_size, seed = int(batch_size), int(seed)  # numpy ints too (torch's seed wants int)
        if len(dataset) == 0:
            raise ConfigError(f"{dataset.name}/{dataset.split} is empty")
        if transfer != "auto":
            resolve(transfer, dataset, torch.device("cpu"))  # raises, listing valid names
        make = getattr(dataset, "source", None) or partial(Order, len(dataset))
        self.source = make(batch_size, shuffle=shuffle, seed=seed, pad=pad, order=order,
                           drop_last=drop_last, static=static)  # fmt: skip
        self.order = self.source.order  # as saved
        self.dataset, self.batch_size, self.static, self.seed = dataset, batch_size, static, seed
        self.shuffle, self.pad, self.augment = shuffle, pad, augment
        self.dtype, self.channels_last = dtype, channels_last
        self._asked, self._transfer = (device, rank, world_size), transfer
        self._where: tuple | None = None  # (device, rank, world), resolved by start()
        placement(device, rank, world_size)  # bad values fail here, not at the first pass
        self.prepare = Prepare(dataset.mean, dataset.std, dtype=dtype, channels_last=channels_last,
                               augment=augment, seed=seed, mix=mix)  # fmt: skip
        self.epoch, self.position = 0, 0  # position: batches of `epoch` already yielded
        self._mover: Stored | None = None
        self._batches, self._samples, self._wait = 0, 0, 0.0
        self._buffers: Batch | None = None  # static: (images, labels), allocated once
        self._index: torch.Tensor | None = None  # static resident: this step's samples
        self._indices: torch.Tensor | None = None  # ... and their CPU indices (altflip)

    # -- where: resolved at the first pass; before it, what the environment says now -----

    def _placement(self) -> tuple[torch.device, int, int]:
        return self._where or placement(*self._asked)

    device = property(lambda self: self._placement()[0])
    rank = property(lambda self: self._placement()[1])
    world_size = property(lambda self: self._placement()[2])

    @property
    def transfer(self) -> str:
        """The mover's name (``auto`` resolved)."""
        if self._mover is not None:
            return self._mover.name
        return resolve(self._transfer, self.dataset, self.device).name

    @property
    def stats(self) -> TransferStats:
        """Bytes and copies (the mover's count), batches, data wait and what the usual path
        would have moved for the same samples (this Loader's)."""
        moved = self._mover.stats if self._mover is not None else TransferStats()
        usual = float32_bytes(self.dataset, self._samples)
        return replace(moved, batches=self._batches, wait_seconds=self._wait, usual_bytes=usual)

    def start(self) -> Stored:
        """Resolve the placement, make the mover (``resident`` uploads the dataset here) and
        the static buffers; the first pass does it, call it to keep it out of a timer."""
        if self._mover is None:
            self._where = placement(*self._asked)
            device = self._where[0]
            cls = resolve(self._transfer, self.dataset, device)
            self._mover = cls(self.dataset, device, self.batch_size)  # may fail here
            if self.static:
                (h, w, c), b = self.dataset.image_shape, self.batch_size
                fmt = torch.channels_last if self.channels_last else torch.contiguous_format
                # zeros: padding rows hold finite values; index 0 is a valid sample
                images = torch.zeros((b, c, h, w), dtype=self.dtype, device=device)
                self._index = torch.zeros(b, dtype=torch.int64, device=device)
                labels = torch.zeros_like(self._index)
                if self.prepare.mix is not None:  # class probabilities after mixing
                    labels = images.new_zeros((b, self.dataset.num_classes), dtype=torch.float32)
                self._buffers = images.contiguous(memory_format=fmt), labels
        return self._mover

    # -- which samples, in what order: the source's ----------------------------------------

    @property
    def num_samples(self) -> int:
        """Samples this rank visits per epoch."""
        return self.source.count(self.epoch, self.rank, self.world_size)[0]

    def __len__(self) -> int:
        return self.source.count(self.epoch, self.rank, self.world_size)[1]

    def state_dict(self) -> dict:
        """Where the loader is: epoch and batches already yielded in it (plain values)."""
        state = dict(epoch=self.epoch, position=self.position, seed=self.seed)
        state.update(batch_size=self.batch_size, world_size=self.world_size)
        state.update(num_samples=len(self.dataset), order=self.order)
        return {**state, **self.source.state_dict(self.epoch)}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``: the next pass starts at its epoch and position."""
        epoch, position = self._saved(state)
        mine = self.state_dict()
        keys = ["seed", "batch_size", "world_size", "num_samples", "order"]
        if self.source.elastic:  # a stream splits what is left over any number of ranks
            keys.remove("world_size")
            saved = state.get("world_size")
            refuse([(whole(saved, 1), "state['world_size']", saved, "the saving run's ranks")])
        differ = [k for k in keys if state.get(k) != mine[k]]
        if differ:
            pairs = ", ".join(f"{k} {state.get(k)!r} != {mine[k]!r}" for k in differ)
            raise ConfigError(f"loader state does not match this loader: {pairs}")
        self.epoch = epoch
        self.position = self.source.load_state_dict(state, epoch, position, self.world_size)

    def index_batches(self) -> list[torch.Tensor]:
        """This epoch's index batches for this rank (CPU int64), from ``position`` on."""
        return self.source.batches(self.epoch, self.rank, self.world_size, self.position)

    def __iter__(self) -> Iterator[Batch]:
        return self._count(self._pass(fill=True))

    def staged(self) -> Iterator[Batch]:
        """A pass of a static ``resident`` training loader that only stages each batch (its
        indices and augmentation seed: host work, no sync) and yields the static buffers;
        the caller runs ``fill`` itself, inside the CUDA graph it replays."""
        if not (self.static and self.pad and isinstance(self.start(), Resident)):
            raise ConfigError(
                "staged() needs a static training loader (static=True, pad=True) on the "
                f"resident mover, not {self.transfer}"
            )
        return self._count(self._pass(fill=False))

    @one_thread()  # on a CPU device, latecast's own work as in _pass
    def fill(self) -> Batch:
        """The device half of a static ``resident`` step: gather the staged indices, augment
        and normalize into the static buffers, with the draws ``staged`` seeded. Nothing
        allocated for the outputs, no host sync, no host decision: what a CUDA graph captures."""
        mover, (images, labels) = self._mover, self._buffers
        values = mover.gathered(self._index)
        x, y = self.prepare.finish(mover.plans, values, mover.device, self._indices, self.epoch,
                                   out=[images, None])  # fmt: skip
        if x.data_ptr() != images.data_ptr():  # mixed
            images.copy_(x)
        labels.copy_(y)
        return images, labels

    def _pass(self, fill: bool) -> Iterator[Batch]:
        mover, start = self.start(), self.position
        todo = self.index_batches()
        resident = self.static and isinstance(mover, Resident)
        it = self._resident(mover, todo, start, fill) if resident else self._moved(mover, todo)
        for k in range(len(todo)):
            t0 = time.perf_counter()
            with one_thread():  # latecast's own CPU work: threads.py
                images, labels, n = next(it)
            self._wait += time.perf_counter() - t0
            self._batches, self._samples = self._batches + 1, self._samples + n
            yield (images, labels), k == len(todo) - 1

    def _moved(self, mover: Stored, batches: list[torch.Tensor]) -> Iterator[tuple]:
        """Moved and finished (``Prepare``) batch by batch; static: into the buffers."""
        rank, start = self._where[1], self.position
        fed = self.source.feed(batches, self.epoch, rank, self._where[2], start)
        steps = iter(enumerate(batches, start))

        def finish(plans: list, values: list, device: torch.device) -> list:
            k, idx = next(steps)  # in order: the batch the mover finishes now
            out = [self._buffers[0][: len(idx)], None] if self.static else None
            out = out if out and out[0].device == device else None  # float32: on the host
            return self.prepare(plans, values, (self.epoch, rank, k), device, idx, out)

        for idx, (x, y) in zip(batches, mover.batches(fed, finish)):
            n = len(idx)
            if not self.static:
                yield x, y, n
                continue
            images, labels = self._buffers
            if x.data_ptr() != images.data_ptr():  # mixed, or finished on the host
                images[:n].copy_(x)
            labels[:n].copy_(y)
            yield (*self._masked(n), n)

    def _resident(self, mover: Resident, batches: list, start: int, fill: bool) -> Iterator:
        """Static on ``resident``: the batch's indices copied on the device and its draws
        seeded (host work), then ``fill``."""
        order, at = mover.order(batches) if batches else None, 0
        for k, idx in enumerate(batches, start):
            n = len(idx)
            self._index[:n].copy_(order[at : at + n])  # device to device, no sync
            self._indices, at = idx, at + n
            self.prepare.seed_batch((self.epoch, self._where[1], k), mover.device)
            if fill:
                self.fill()
            yield (*self._masked(n), n)

    def _masked(self, n: int) -> Batch:
        """The buffers, labels past ``n`` (a last evaluation batch's padding) set to IGNORE
        (mixed labels, class probabilities: to 0, no class)."""
        images, labels = self._buffers
        if n < len(labels):
            labels[n:].fill_(IGNORE if labels.ndim == 1 else 0)
        return images, labels
