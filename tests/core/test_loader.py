"""Loader order, strategy equivalence, byte accounting and state, on the CPU."""

from __future__ import annotations

import inspect
import math
from dataclasses import fields

import numpy as np
import pytest
import torch
from _helpers import mover, small
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DistributedSampler

import latecast
from latecast.errors import ConfigError
from latecast.loader import Loader
from latecast.movers import MOVERS
from latecast.order import epoch_order
from latecast.trainer.baseline import Float32
from latecast.transfer import ahead, float32_bytes

STRATS = ["float32", *MOVERS]  # uint8 pixels: the core's movers and the baseline


def collect(loader):
    return [(x.clone(), y.clone()) for x, y in loader]


# -- values ------------------------------------------------------------------------------


def test_every_strategy_equals_torchvision_on_real_mnist(mnist):
    tv = pytest.importorskip("torchvision.transforms")
    reference = tv.Compose([tv.ToTensor(), tv.Normalize(mnist.mean, mnist.std)])
    order = epoch_order(len(mnist), seed=7, epoch=0)
    for name in STRATS:
        loader = Loader(mnist, 256, device="cpu", transfer=mover(name), seed=7)
        for k, (images, labels) in zip(range(3), loader):
            idx = order[k * 256 : (k + 1) * 256].numpy()
            expected = torch.stack([reference(mnist.images[i]) for i in idx])
            assert images.shape == (256, 1, 28, 28) and images.dtype == torch.float32
            assert (images - expected).abs().max().item() <= 1e-6, name
            assert labels.dtype == torch.int64
            assert torch.equal(labels, torch.from_numpy(mnist.labels[idx].astype(np.int64)))


def test_strategies_agree_bitwise_with_partial_batch():
    ds = small(n=300, shape=(8, 8, 3))
    results = {
        name: collect(Loader(ds, 64, device="cpu", transfer=mover(name), seed=3)) for name in STRATS
    }
    for name, batches in results.items():
        assert [len(y) for _, y in batches] == [64, 64, 64, 64, 44], name
        for (x, y), (rx, ry) in zip(batches, results["float32"]):
            assert torch.equal(x, rx) and torch.equal(y, ry), name


def test_uint16_labels_survive_the_packed_copy():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 1000, 50)
    images = rng.integers(0, 256, (50, 4, 4, 1), dtype=np.uint8)
    ds = latecast.from_arrays(images, labels, classes=[str(i) for i in range(1000)])
    assert ds.labels.dtype == np.uint16
    for name in STRATS:
        loader = Loader(ds, 16, device="cpu", transfer=mover(name), shuffle=False)
        got = torch.cat([y for _, y in loader])
        assert torch.equal(got, torch.from_numpy(labels.astype(np.int64))), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_output_is_rounded_float32(dtype):
    ds = small(n=40)
    x32, _ = next(iter(Loader(ds, 40, device="cpu", transfer="uint8", shuffle=False)))
    x, _ = next(iter(Loader(ds, 40, device="cpu", transfer="uint8", shuffle=False, dtype=dtype)))
    assert x.dtype == dtype and torch.equal(x, x32.to(dtype))


def test_channels_last_layout_same_values():
    ds = small(n=20, shape=(6, 5, 3))
    x, _ = next(iter(Loader(ds, 20, device="cpu", shuffle=False)))
    y, _ = next(iter(Loader(ds, 20, device="cpu", shuffle=False, channels_last=True)))
    assert y.is_contiguous(memory_format=torch.channels_last) and x.is_contiguous()
    assert not x.is_contiguous(memory_format=torch.channels_last) and torch.equal(x, y)


def test_augmentation_is_seeded_and_per_batch():
    ds = small(n=128, shape=(16, 16, 3))
    aug = latecast.Augment(crop=2, flip=0.5, cutout=4)
    runs = [collect(Loader(ds, 32, device="cpu", seed=1, augment=aug)) for _ in range(2)]
    plain = collect(Loader(ds, 32, device="cpu", seed=1))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(*runs))
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(runs[0], plain))


# -- order -------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 400),
    world=st.integers(1, 8),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 5),
)
def test_order_matches_distributed_sampler(n, world, seed, epoch):
    shards = []
    for rank in range(world):
        sampler = DistributedSampler(
            range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed
        )
        sampler.set_epoch(epoch)
        mine = epoch_order(n, seed=seed, epoch=epoch, rank=rank, world_size=world)
        assert mine.tolist() == list(sampler)
        shards.append(mine)
    assert len({len(s) for s in shards}) == 1  # equal lengths: equal batch counts
    assert set(torch.cat(shards).tolist()) == set(range(n))  # every index covered


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 400), world=st.integers(1, 8))
def test_unpadded_shards_partition_the_dataset(n, world):
    shards = [
        epoch_order(n, seed=0, epoch=0, rank=r, world_size=world, pad=False) for r in range(world)
    ]
    assert sorted(torch.cat(shards).tolist()) == list(range(n))


@pytest.mark.parametrize(
    "n,b,drop_last", [(300, 64, False), (300, 64, True), (256, 64, True), (5, 64, False)]
)
def test_len_and_every_index_once(n, b, drop_last):
    ds = small(n=n, shape=(2, 2, 1))
    loader = Loader(ds, b, device="cpu", drop_last=drop_last, transfer="uint8")
    batches = collect(loader)
    assert len(batches) == len(loader) == (n // b if drop_last else math.ceil(n / b))
    sizes = [len(y) for _, y in batches]
    assert all(s == b for s in sizes[:-1])
    assert sum(sizes) == (n // b * b if drop_last else n)


def test_every_index_exactly_once_per_epoch():
    n = 300
    # Each image carries its own index in its pixels, so the batches tell which sample it is.
    images = np.zeros((n, 2, 2, 1), np.uint8)
    images[:, 0, 0, 0], images[:, 0, 1, 0] = np.arange(n) % 256, np.arange(n) // 256
    ds = latecast.from_arrays(
        images, np.zeros(n, np.int64), classes=["a"], mean=(0.0,), std=(1 / 255,)
    )
    batches = Loader(ds, 64, device="cpu")
    seen = torch.cat([(x[:, 0, 0, 0] + 256 * x[:, 0, 0, 1]).round().long() for x, _ in batches])
    assert sorted(seen.tolist()) == list(range(n))


def test_order_changes_with_epoch_and_repeats_with_seed():
    a = epoch_order(1000, seed=5, epoch=0)
    assert not torch.equal(a, epoch_order(1000, seed=5, epoch=1))
    assert torch.equal(a, epoch_order(1000, seed=5, epoch=0))
    assert not torch.equal(a, epoch_order(1000, seed=6, epoch=0))
    assert torch.equal(epoch_order(10, seed=5, epoch=3, shuffle=False), torch.arange(10))


def test_epoch_advances_by_itself_and_set_epoch_overrides():
    ds = small(n=100, shape=(2, 2, 1))
    loader = Loader(ds, 100, device="cpu", transfer="uint8")
    first = collect(loader)[0][1]
    second = collect(loader)[0][1]
    assert loader.epoch == 2 and not torch.equal(first, second)
    loader.set_epoch(0)
    assert torch.equal(collect(loader)[0][1], first)


def test_state_dict_resumes_mid_epoch():
    ds = small(n=300, shape=(4, 4, 1))
    full = collect(Loader(ds, 32, device="cpu", seed=2, transfer="uint8"))
    loader = Loader(ds, 32, device="cpu", seed=2, transfer="uint8")
    head = []
    for batch in loader:
        head.append(batch)
        if len(head) == 4:
            break
    state = loader.state_dict()
    assert state["position"] == 4 and state["epoch"] == 0
    resumed = Loader(ds, 32, device="cpu", seed=2, transfer="uint8")
    resumed.load_state_dict(state)
    tail = collect(resumed)
    assert len(tail) == len(full) - 4
    assert all(torch.equal(a[1], b[1]) for a, b in zip(tail, full[4:]))
    other = Loader(ds, 16, device="cpu", seed=2)
    with pytest.raises(ConfigError, match="batch_size"):
        other.load_state_dict(state)


def test_rank_and_world_from_torchrun_environment(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    loader = Loader(small(n=10, shape=(2, 2, 1)), 4, device="cpu")
    assert (loader.rank, loader.world_size, loader.num_samples, len(loader)) == (1, 3, 4, 1)


def test_empty_pass_moves_to_the_next_epoch():
    loader = Loader(small(n=100, shape=(2, 2, 1)), 32, device="cpu")
    loader.load_state_dict({**loader.state_dict(), "position": 4})  # the epoch's 4 batches done
    assert collect(loader) == [] and (loader.epoch, loader.position) == (1, 0)


class Backwards:
    """A source of its own (the protocol ``loader.Order`` states): every sample once an epoch,
    last first, in batches of ``batch_size``; ``position`` saved as the state's ``"done"``."""

    order, elastic = "backwards", False

    def __init__(self, n, batch_size, **options) -> None:
        self.n, self.batch_size = n, batch_size

    def count(self, epoch, rank, world):
        return self.n, math.ceil(self.n / self.batch_size)

    def batches(self, epoch, rank, world, position):
        return list(torch.arange(self.n).flip(0).split(self.batch_size))[position:]

    def feed(self, batches, *where):
        return batches

    def state_dict(self, epoch):
        return {"done": "yes"}

    def load_state_dict(self, state, epoch, position, world):
        return position


class Reversed(latecast.Dataset):
    def source(self, batch_size, **options):
        return Backwards(len(self), batch_size, **options)


def test_a_dataset_with_a_source_of_its_own_is_read_in_its_order():
    """The Loader asks the source for its batches, counts and state: no branch of its own."""
    ds = small(n=10, shape=(2, 2, 1))
    loader = Loader(Reversed(**{f.name: getattr(ds, f.name) for f in fields(ds)}), 4, device="cpu")
    assert (len(loader), loader.num_samples) == (3, 10)
    assert [y.tolist() for _, y in loader] == [[9, 8, 7, 6], [5, 4, 3, 2], [1, 0]]
    state = loader.state_dict()
    assert state["order"] == "backwards" and state["done"] == "yes"
    loader.load_state_dict({**state, "position": 2})
    assert [y.tolist() for _, y in loader] == [[1, 0]]


# -- movers ------------------------------------------------------------------------------


def test_movers_move_only_and_float32_finishes_on_the_host():
    """Every mover is made from (dataset, device, batch size) alone and handed the one finish
    per pass; ``float32`` calls it on the host, then copies what it made as it is."""
    assert {tuple(inspect.signature(m).parameters) for m in (*MOVERS.values(), Float32)} == {
        ("dataset", "device", "batch_size")
    }
    ds, cpu, where = small(n=10, shape=(2, 2, 1)), torch.device("cpu"), []
    baseline = Float32(ds, cpu, 4)

    def finish(plans, values, device):
        where.append(device)
        return [values[0].permute(0, 3, 1, 2).float(), values[1]]

    ((mx, my),) = baseline.batches([torch.arange(4)], finish)
    assert where == [cpu] and torch.equal(mx[:, 0], torch.from_numpy(ds.images[:4, ..., 0]).float())
    assert torch.equal(my, torch.from_numpy(ds.labels[:4]).long())
    assert (baseline.stats.image_bytes, baseline.stats.label_bytes) == (64, 32)


def test_ahead_takes_the_next_item_before_handing_out_this_one():
    taken = []

    def items():
        for k in range(3):
            taken.append(k)
            yield k

    got = [(item, last, len(taken)) for item, last in ahead(items())]
    assert got == [(0, False, 2), (1, False, 3), (2, True, 3)]
    assert list(ahead([])) == [] and list(ahead("a")) == [("a", True)]


# -- bytes -------------------------------------------------------------------------------


def test_byte_accounting_is_exact():
    ds = small(n=300)
    stats = {}
    for name in STRATS:
        loader = Loader(ds, 64, device="cpu", transfer=mover(name))
        for _ in range(2):  # two epochs
            collect(loader)
        stats[name] = loader.stats
    f32, u8 = stats["float32"], stats["uint8"]
    assert f32.image_bytes == 2 * 300 * 784 * 4 and f32.label_bytes == 2 * 300 * 8
    assert f32.image_bytes == 4 * u8.image_bytes and f32.label_bytes == 8 * u8.label_bytes
    assert f32.h2d_bytes == float32_bytes(ds, 600)
    assert stats["prefetch"].h2d_bytes == u8.h2d_bytes
    assert u8.copies == 2 * 5 and f32.copies == 2 * 2 * 5  # one packed copy per batch
    res = stats["resident"]  # one upload of the dataset, then one permutation per epoch
    assert res.image_bytes == 300 * 784 and res.label_bytes == 300
    assert res.index_bytes == 2 * 300 * 8 and res.batches == 10


def test_resident_moves_nothing_per_step():
    loader = Loader(small(n=300), 32, device="cpu", transfer="resident")
    it = iter(loader)
    next(it)
    after_first = loader.stats.h2d_bytes
    for _ in it:
        assert loader.stats.h2d_bytes == after_first


# -- bad arguments (docs/RELIABILITY.md row 29) ----------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 8, "transfer": "fast"}, "valid: auto, uint8, prefetch, resident"),
        ({"batch_size": 8, "device": "tpu:0"}, "device"),
        ({"batch_size": 8, "rank": 2, "world_size": 2}, "rank 2"),
    ],
)
def test_bad_arguments_are_clear(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        Loader(small(n=10, shape=(2, 2, 1)), **kwargs)


def test_cuda_device_works_or_is_refused_clearly():
    ds = small(n=10, shape=(2, 2, 1))
    if torch.cuda.is_available():
        assert Loader(ds, 4, device="cuda").device.type == "cuda"
    else:
        with pytest.raises(ConfigError, match="no CUDA"):
            Loader(ds, 4, device="cuda")


def test_auto_is_resident_on_cpu():
    assert Loader(small(n=10, shape=(2, 2, 1)), 4, device="cpu").transfer == "resident"


def test_pinned_buffer_falls_back_to_pageable_with_one_warning():
    """docs/RELIABILITY.md row 27: where pinning fails (no driver here, or the OS limit on a
    GPU machine) the buffer is pageable and one warning says copies become synchronous."""
    from latecast.transfer import host_buffer

    if torch.cuda.is_available():
        assert host_buffer(64, pin=True).is_pinned()
        return
    with pytest.warns(UserWarning, match="pinned host buffer of 64 bytes failed"):
        buf = host_buffer(64, pin=True)
    assert buf.numel() == 64 and buf.dtype == torch.uint8 and not buf.is_pinned()
