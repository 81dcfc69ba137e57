"""Block order (stores bigger than RAM): every sample once per epoch, reads mostly in
sequence, and shards across ranks exactly like the random order."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import latecast
from latecast.errors import ConfigError
from latecast.loader import Loader
from latecast.order import block_order, epoch_order, parse_order


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 600),
    block=st.integers(1, 64),
    window=st.integers(1, 20),
    world=st.integers(1, 6),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 50),
)
def test_block_order_visits_every_sample_once_and_shards_like_random(
    n, block, window, world, seed, epoch
):
    order = block_order(n, seed=seed, epoch=epoch, block=block, window=window)
    assert sorted(order.tolist()) == list(range(n))  # a permutation: every sample once
    assert torch.equal(order, block_order(n, seed=seed, epoch=epoch, block=block, window=window))
    args = dict(seed=seed, epoch=epoch, order=f"block:{block}:{window}")
    shards = [epoch_order(n, rank=r, world_size=world, **args) for r in range(world)]
    rand = [epoch_order(n, seed=seed, epoch=epoch, rank=r, world_size=world) for r in range(world)]
    assert [len(s) for s in shards] == [len(s) for s in rand] == [math.ceil(n / world)] * world
    padded = torch.cat([order, order.repeat(world)[: len(shards[0]) * world - n]])
    assert all(torch.equal(s, padded[r::world]) for r, s in enumerate(shards))  # r::world
    unpadded = [epoch_order(n, rank=r, world_size=world, pad=False, **args) for r in range(world)]
    assert sorted(torch.cat(unpadded).tolist()) == list(range(n))  # evaluation: a partition


def test_block_order_reads_blocks_whole_within_a_window():
    n, block, window = 10_000, 50, 8
    order = block_order(n, seed=0, epoch=3, block=block, window=window)
    span = block * window
    for k in range(0, n, span):  # each run of the order is `window` whole blocks
        blocks = order[k : k + span] // block
        assert len(blocks.unique()) == window
        assert (blocks.bincount()[blocks.unique()] == block).all()
    assert not torch.equal(order, block_order(n, seed=0, epoch=4, block=block, window=window))
    assert (order[:span].diff() == 1).float().mean() < 0.1  # shuffled within the window


def test_loader_block_order_every_index_once_and_state():
    n = 500
    images = np.zeros((n, 2, 2, 1), np.uint8)
    images[:, 0, 0, 0], images[:, 0, 1, 0] = np.arange(n) % 256, np.arange(n) // 256
    ds = latecast.from_arrays(images, np.zeros(n, int), mean=(0.0,), std=(1 / 255,))
    loader = Loader(ds, 64, device="cpu", order="block:16:4", seed=5)
    for _ in range(2):
        seen = torch.cat([(x[:, 0, 0, 0] + 256 * x[:, 0, 0, 1]).round().long() for x, _ in loader])
        assert sorted(seen.tolist()) == list(range(n))
    state = loader.state_dict()
    assert state["order"] == "block:16:4"
    with pytest.raises(ConfigError, match="order 'block:16:4' != 'random'"):
        Loader(ds, 64, device="cpu", seed=5).load_state_dict(state)
    Loader(ds, 64, device="cpu", seed=5).load_state_dict({**state, "order": "random"})
    with pytest.raises(ConfigError, match="order None != 'random'"):  # a state without one
        Loader(ds, 64, device="cpu", seed=5).load_state_dict({**state, "order": None})
    assert Loader(ds, 64, order="block").state_dict()["order"] == "block:32:256"
    for bad in ("sorted", "block:0:5", "block:x", "block:8", "block:8:4:2", "Random", 3, None):
        with pytest.raises(ConfigError, match=r"order must be random, block \(block:32:256\) or"):
            Loader(ds, 64, order=bad)
    with pytest.raises(ConfigError, match=f"sizes in 1..2\\*\\*63-1, got 'block:{2**63}:4'"):
        epoch_order(n, seed=0, epoch=0, order=f"block:{2**63}:4")
    assert parse_order(f"block:{2**63 - 1}:1") == (2**63 - 1, 1) and parse_order("random") is None
    one_block = epoch_order(n, seed=5, epoch=0, order=f"block:{2**63 - 1}:1")
    assert sorted(one_block.tolist()) == list(range(n))  # the largest block: one shuffled run
