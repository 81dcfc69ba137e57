"""A split of WebDataset shards, streamed (``latecast train 'http://host/shard-{000..009}.tar'``,
``s3://...``, ``path/shard-*.tar``; docs/shards.md), indexed first if ``latecast index`` has
not; the last shard is the test split, the others the train split.

An epoch's order (``epoch_order``) is a pure function of (the index, seed, epoch), never of the
number of processes. Each rank takes a contiguous span of it, so it reads a contiguous run of
shards and holds at most ``buffer`` JPEG files (every shard read once an epoch, in all). Every
sample is trained on once an epoch (no padding, no dropped tail); every rank takes
``ceil(M / (world * batch))`` steps for the ``M`` samples left (the spans differ by one sample
at most). A checkpoint keeps what remains of its epoch's order (a few intervals): a resume on
any number of ranks splits that again (``Plan.left``), on the same number it continues where it
stopped, exactly. The training size, channels and mean/std come from the first ``STAT_FILES``
train samples, the same on every rank; the resume identity is the index's SHA-256 of every
shard of the split, whatever URL or path names them.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Iterator

import numpy as np

from ..data import Split, mean_std
from ..errors import ConfigError, FormatError, refuse
from ..kinds.jpegfiles import EncodedDataset
from .shards import Shard, read_index
from .store import jpeg_problem

STAT_FILES = 512  # train samples the training size and mean/std are measured on
STAT_CHUNK = 64  # of them decoded at a time (all 512 at once held 1.7 GB of int64 pixels)
BUFFER = 1024  # samples shuffled together: at most this many JPEG files held per rank
AHEAD = 2  # batches read ahead of the steps, by a thread (network reads overlap the step)
PROBES = 16  # shards whose size is asked at once before the first step (HEADs over HTTP)
_stats: dict = {}  # digest of the train shards -> (size, mean, std): measured once


def epoch_order(counts, *, seed: int, epoch: int, buffer: int, shuffle: bool):
    """``(S, order)`` of an epoch over shards of ``counts`` samples (ids in index order): ``S[p]``
    is the sample at stream position ``p`` (the shards permuted, each in its own order),
    ``order[k]`` the stream position of the epoch's ``k``-th sample (``S`` permuted within
    consecutive blocks of ``buffer``). Without ``shuffle`` both are the identity."""
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    total = int(starts[-1])
    shards = np.random.default_rng([seed, epoch]).permutation(len(counts))
    S = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in shards])
    order = np.arange(total)
    if not shuffle:
        return order.copy(), order
    g = np.random.default_rng([seed, epoch, 1])
    for a in range(0, total, buffer):
        order[a : a + buffer] = a + g.permutation(min(buffer, total - a))
    return S, order


def batch_sizes(n: int, steps: int, batch: int) -> list[int]:
    """``n`` samples in ``steps`` batches of at most ``batch``: full ones, then the rest as
    even as it divides (each at least 1; needs ``steps <= n <= steps * batch``)."""
    full = steps if batch == 1 else min(steps, (n - steps) // (batch - 1))
    q, r = divmod(n - full * batch, max(steps - full, 1))
    return [batch] * full + [q + 1] * r + [q] * (steps - full - r)


class Plan:
    """One rank's share of an epoch of ``stream``: ``sizes`` (its batches), ``ids`` (its
    samples in order); ``read`` its batches, ``left`` what remains of the epoch."""

    def __init__(self, stream, epoch, rank, world, batch, *, shuffle, seed, remaining) -> None:
        S, order = epoch_order(
            stream.counts, seed=seed, epoch=epoch, buffer=stream.buffer, shuffle=shuffle
        )
        spans = [(0, len(order))] if remaining is None else remaining
        self.ks = np.concatenate([np.arange(a, b) for a, b in spans] or [np.arange(0)])
        m, self.batch = len(self.ks), batch
        self.bounds = [r * m // world for r in range(world + 1)]  # spans differ by one at most
        self.steps = -(-m // (world * batch))
        if m // world < self.steps:  # some rank would have a step without a sample
            raise ConfigError(
                f"{stream.name}: {m} samples left in epoch {epoch + 1} for {world} processes "
                f"at batch {batch}: every process needs one sample a step at least; use "
                f"fewer processes or a larger batch"
            )
        mine = self.ks[self.bounds[rank] : self.bounds[rank + 1]]
        self.stream, self.S, self.source, self.epoch = order[mine], S, stream, epoch
        self.ids = S[self.stream]
        self.sizes = batch_sizes(len(mine), self.steps, batch)

    def left(self, position: int) -> list[list[int]]:
        """The epoch's positions left once every rank took ``position`` batches, as the
        ``[start, end)`` of their runs."""
        ends = zip(self.bounds, self.bounds[1:])
        rest = [
            self.ks[a + sum(batch_sizes(b - a, self.steps, self.batch)[:position]) : b]
            for a, b in ends
        ]
        ks = np.concatenate(rest)
        runs = np.split(ks, np.flatnonzero(np.diff(ks) != 1) + 1)
        return [[int(run[0]), int(run[-1]) + 1] for run in runs if len(run)]

    def read(self, start: int) -> Iterator[tuple]:
        """``(EncodedDataset, ids, names)`` of each batch from ``start`` on, read in stream
        order; files read but not yet batched are held (a block's at most)."""
        import torch

        at = sum(self.sizes[:start])
        wanted, held = self.source.files(self.S, np.sort(self.stream[at:])), {}
        for n in self.sizes[start:]:
            files = []
            for p in self.stream[at : at + n].tolist():
                while p not in held:
                    q, file = next(wanted)
                    held[q] = file
                files.append(held.pop(p))
            batch, names = self.source.batch(files)
            yield batch, torch.from_numpy(self.ids[at : at + n]), names
            at += n


def ahead_by_thread(items: Iterator, depth: int) -> Iterator:
    """``items``, taken by a thread up to ``depth`` ahead of the consumer; its exception is
    raised where its item would have come. A consumer that stops early cancels the takes not
    begun and waits for the one in hand: left inside torch's C++ code as Python exits, a
    thread is unwound there and aborts the process ("terminate called without an active
    exception")."""
    end = object()
    with ThreadPoolExecutor(1, "latecast-shards") as pool:
        ahead = deque(pool.submit(next, items, end) for _ in range(depth))
        try:
            while (item := ahead.popleft().result()) is not end:
                ahead.append(pool.submit(next, items, end))
                yield item
        finally:
            pool.shutdown(cancel_futures=True)


class Source:
    """A stream's epochs for a ``Loader`` (the source protocol of ``loader.Order``): each a
    ``Plan`` of the epoch and what remains of it, kept while asked for the same."""

    elastic = True  # a resume splits what is left of its epoch over any number of ranks

    def __init__(self, stream, batch_size, *, shuffle, seed, order, drop_last, **_) -> None:
        refuse([(order == "random", "order", order, "random for a stream (its own)"),
                (not drop_last, "drop_last", drop_last, "False for a stream")])  # fmt: skip
        self.stream, self.batch_size = stream, batch_size
        self.order = f"shards,buffer:{stream.buffer}"  # as saved: another buffer, another order
        self.args = dict(shuffle=shuffle, seed=seed)
        self.resume: tuple | None = None  # a resumed epoch and what remained of it
        self.planned: tuple = (None, None)  # the last plan and what it was made for

    def plan(self, epoch: int, rank: int, world: int) -> Plan:
        asked = (epoch, rank, world, self.remaining(epoch))
        if self.planned[1] != asked:
            plan = Plan(self.stream, *asked[:3], self.batch_size, remaining=asked[3], **self.args)
            self.planned = (plan, asked)
        return self.planned[0]

    def remaining(self, epoch: int) -> list | None:
        """Intervals of positions in ``epoch``'s order its plans are made from (None: all)."""
        return self.resume[1] if self.resume and self.resume[0] == epoch else None

    def count(self, epoch: int, rank: int, world: int) -> tuple[int, int]:
        sizes = self.plan(epoch, rank, world).sizes
        return sum(sizes), len(sizes)

    def batches(self, epoch: int, rank: int, world: int, position: int) -> list:
        import torch

        plan = self.plan(epoch, rank, world)
        return list(torch.from_numpy(plan.ids).split(plan.sizes))[position:]

    def feed(self, batches: list, epoch: int, rank: int, world: int, position: int):
        """``Plan.read``, by a thread ``AHEAD`` batches ahead of the steps (its reads and
        hashing release the GIL), as the ``jpeg`` mover asks."""
        return ahead_by_thread(self.plan(epoch, rank, world).read(position), AHEAD)

    def state_dict(self, epoch: int) -> dict:
        return {"remaining": self.remaining(epoch)}

    def load_state_dict(self, state: dict, epoch: int, position: int, world: int) -> int:
        remaining, saved = state.get("remaining"), int(state["world_size"])
        if saved != world:  # what every rank of the saved run had left
            args = dict(remaining=remaining, **self.args)
            remaining = Plan(self.stream, epoch, 0, saved, self.batch_size, **args).left(position)
            position = 0
        self.resume = (epoch, remaining)
        return position


@dataclass(frozen=True, eq=False)
class StreamedDataset(Split):
    """A split of indexed WebDataset shards (``open_shards``): JPEG files read as the batches
    are taken, never all held, moved and prepared as a JPEG store's (``Split``'s fields: every
    sample's labels)."""

    size: tuple[int, int]  # as EncodedDataset's
    channels: int  # as EncodedDataset's
    file_bytes: int  # the JPEG files' bytes, all together
    digest: str = ""  # what identifies the content: the index's hashes of its shards
    shards: tuple = ()  # the split's shards, as the index gives them
    buffer: int = BUFFER  # samples shuffled together (JPEG files a rank holds at most)
    limit: int | None = None  # train on the first `limit` samples only (--limit-train)
    encoding = "jpeg"
    movers = EncodedDataset.movers  # a JPEG store's: ``jpeg``
    image_shape = EncodedDataset.image_shape  # (*size, channels)
    what = "a stream of JPEG shards"

    @property
    def image_bytes(self) -> int:
        return self.file_bytes

    @property
    def counts(self) -> list[int]:
        ends = np.cumsum([0] + [len(s) for s in self.shards])
        return np.diff(ends if self.limit is None else ends.clip(max=self.limit)).tolist()

    def source(self, batch_size: int, **options) -> Source:
        """The Loader's source of this split (``Source``)."""
        return Source(self, batch_size, **options)

    def first(self, n: int) -> StreamedDataset:
        return replace(self, limit=n, labels=self.labels[:n])

    def files(self, S: np.ndarray, positions: np.ndarray) -> Iterator[tuple[int, tuple]]:
        """``(stream position, (jpeg, label, header, name))`` for ``positions`` (sorted), each
        shard of them read once, from its first sample wanted on."""
        starts = np.concatenate([[0], np.cumsum([len(s) for s in self.shards])])
        ids = S[positions]
        shard_of = np.searchsorted(starts, ids, side="right") - 1
        runs = np.split(np.arange(len(ids)), np.flatnonzero(np.diff(shard_of)) + 1)
        for run in runs if len(ids) else []:
            shard, wanted = self.shards[shard_of[run[0]]], ids[run] - starts[shard_of[run[0]]]
            # the shard's reader first: after its last file it checks a shard read whole
            for (k, jpg, label, head), p in zip(shard.read(wanted), positions[run].tolist()):
                yield p, (jpg, label, head, f"{shard.url}: sample {shard.keys[k]!r}")

    def batch(self, files: list[tuple]) -> tuple[EncodedDataset, list[str]]:
        """The files of one batch as an ``EncodedDataset``, what the ``jpeg`` mover gathers
        from; its name per file for messages."""
        sizes = [len(f[0]) for f in files]
        ds = EncodedDataset(
            name=self.name, split=self.split, labels=np.array([f[1] for f in files],
            self.labels.dtype), classes=self.classes, mean=self.mean, std=self.std,
            data=np.frombuffer(b"".join(f[0] for f in files), np.uint8),
            offsets=np.cumsum([0] + sizes).astype(np.int64),
            sizes=np.array([f[2][:2] for f in files], np.int32), channels=self.channels,
            size=self.size,
        )  # fmt: skip
        return ds, [f[3] for f in files]


def open_shards(spec: str, split: str = "train", buffer: int = BUFFER) -> StreamedDataset:
    """The ``split`` of the shards named by ``spec``, streamed: ``train`` (every shard but the
    last) or ``test`` (the last). Empty shards are skipped, each said once. Refused in one
    line: a shard of the split gone or of another size than the index says, a test label
    outside the train classes.

    Example:
        >>> train = open_shards("http://host/shards/shard-{000..009}.tar")
        >>> loader = latecast.Loader(train, 256, device="cuda")  # reads as it goes
    """
    if split not in ("train", "test"):
        raise ConfigError(f"unknown split {split!r} for {spec}; valid: train, test")
    shards = read_index(spec)
    if len(shards) < 2:
        raise ConfigError(
            f"{spec}: {len(shards)} shard(s); give two or more (the last is the test split)"
        )
    for s in shards:
        if not len(s) and split == "train":
            warnings.warn(f"{s.url}: no samples (an empty tar); skipped", stacklevel=2)
    train = [s for s in shards[:-1] if len(s)]
    if not train or not len(shards[-1]):
        empty = "the train shards" if not train else f"the test shard {shards[-1].url}"
        raise FormatError(f"{spec}: {empty} hold no samples")
    classes = int(max(s.labels.max() for s in train)) + 1
    test, outside = shards[-1], np.flatnonzero(shards[-1].labels >= classes)
    if len(outside):  # the model has `classes` outputs
        k = int(outside[0])
        raise FormatError(
            f"{test.url}: test sample {test.keys[k]!r} has label {test.labels[k]}, outside the "
            f"train shards' classes 0..{classes - 1} ({len(outside)} such test samples)"
        )
    part = train if split == "train" else shards[-1:]
    with ThreadPoolExecutor(PROBES) as pool:  # a shard gone is said now, not hours in
        list(pool.map(Shard.probe, part))
    size, channels, mean, std = _measured(train, spec)
    labels = np.concatenate([s.labels for s in part])
    return StreamedDataset(
        name=spec, split=split, labels=labels.astype(np.uint8 if classes <= 256 else np.uint16),
        classes=tuple(map(str, range(classes))), mean=mean, std=std, size=size,
        channels=channels, file_bytes=sum(s.size for s in part), digest=_digest(part),
        shards=tuple(part), buffer=buffer,
    )  # fmt: skip


def _digest(shards: list[Shard]) -> str:
    """The split's identity: every shard's SHA-256 and count, not its URL."""
    return hashlib.sha256(json.dumps([[s.sha256, len(s)] for s in shards]).encode()).hexdigest()


def _measured(train: list[Shard], spec: str) -> tuple:
    """``(size, channels, mean, std)`` of the first ``STAT_FILES`` train samples, measured once."""
    key = _digest(train)
    if key not in _stats:
        import torch

        from ..kinds.decode import Encoded, decode

        files, n = [], STAT_FILES
        for shard in train:
            got = list(shard.read(np.arange(min(n - len(files), len(shard)))))
            files += [
                (jpg, head, f"{shard.url}: sample {shard.keys[k]!r}") for k, jpg, _, head in got
            ]
            if len(files) == n:
                break
        size = Counter(h[:2] for _, h, _ in files).most_common(1)[0][0]
        channels = 1 if all(s.channels == 1 for s in train) else 3
        sums = torch.zeros(2, channels, dtype=torch.int64)
        for at in range(0, len(files), STAT_CHUNK):  # 64 photos of 500x375: 36 MB of pixels
            part = files[at : at + STAT_CHUNK]
            offsets = np.cumsum([0] + [len(f) for f, _, _ in part]).tolist()
            batch = Encoded(
                torch.frombuffer(bytearray(b"".join(f for f, _, _ in part)), dtype=torch.uint8),
                offsets, torch.tensor([h[:2] for _, h, _ in part]), torch.arange(len(part)),
                channels, torch.device("cpu"), spec, names=[name for _, _, name in part],
            )  # fmt: skip
            pixels = decode(batch, size).reshape(-1, channels).int()  # (n * H * W, C)
            sums += torch.stack([pixels.sum(0), (pixels * pixels).sum(0)])  # int32 squares fit
        count = len(files) * size[0] * size[1]
        _stats[key] = (tuple(size), channels, *mean_std(sums.numpy(), count))
    return _stats[key]


def verify(ds: StreamedDataset) -> str:
    """Read every shard of ``ds`` whole against its index; what was checked, in words."""
    for shard in ds.shards:
        for k, jpg, _, _ in shard.read(np.arange(len(shard))):
            if why := jpeg_problem(jpg):
                raise FormatError(f"{shard.url}: sample {shard.keys[k]!r}: {why}")
    return (
        f"{len(ds.shards)} shard(s) of {len(ds)} samples read whole against the index: each "
        f"shard's length and SHA-256, each sample's key, byte offset, label and CRC-32, each "
        f"JPEG's markers and frame header"
    )
