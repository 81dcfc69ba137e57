"""The Loader's lazy placement and epoch state as Lightning and accelerate drive them, and
the Lightning mixin; 2-process runs are in ``test_examples.py``."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from _helpers import finished, lightning_trainer

import latecast
from latecast.loader import Loader
from latecast.order import epoch_order
from latecast.transfer import float32_bytes

N, BATCH = 64, 8  # per rank: 32 samples, 4 batches an epoch


def ids_dataset() -> latecast.Dataset:
    """Sample ``i`` has label ``i``: what a rank saw is read off its labels."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (N, 4, 4, 1), dtype=np.uint8)
    return latecast.from_arrays(images, np.arange(N), classes=[str(i) for i in range(N)])


def test_a_loader_built_before_the_launcher_reads_its_rank_at_the_first_pass(monkeypatch):
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    loader = Loader(ids_dataset(), BATCH, device="auto")
    assert (loader.rank, loader.world_size) == (0, 1)
    monkeypatch.setenv("LOCAL_RANK", "1")  # Lightning's launcher: LOCAL_RANK, no RANK
    monkeypatch.setenv("WORLD_SIZE", "2")
    seen = torch.cat([y for _, y in loader])
    assert (loader.rank, loader.world_size, loader.device.type) == (1, 2, "cpu")
    assert torch.equal(seen, epoch_order(N, seed=0, epoch=0, rank=1, world_size=2))  # 32 of 64


def test_the_last_batch_moves_the_loader_to_the_next_epoch():
    """Lightning never asks past the last batch: the state says "next epoch" once it is out
    (regression: an empty second epoch)."""
    loader = Loader(ids_dataset(), BATCH, device="cpu")
    firsts = []
    for epoch in range(3):
        batches = list(itertools.islice(loader, len(loader)))  # never exhausts the generator
        assert len(batches) == len(loader) == 8
        assert loader.state_dict()["epoch"] == epoch + 1 and loader.position == 0
        assert sorted(torch.cat([y for _, y in batches]).tolist()) == list(range(N))
        firsts.append(batches[0][1])
    assert not torch.equal(firsts[0], firsts[1])  # a new order every epoch
    assert loader.stats.usual_bytes == float32_bytes(loader.dataset, 3 * N)


@pytest.mark.slow
def test_prepare_on_device_mixin_normalizes_and_draws_as_the_loader_would():
    """The mixin augments and mixes in training (seeded by seed, epoch, rank and batch
    index), only normalizes in validation."""
    L = pytest.importorskip("lightning")
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    from latecast import PrepareOnDevice

    rng = np.random.default_rng(0)
    images = torch.from_numpy(rng.integers(0, 256, (N, 6, 5, 3), dtype=np.uint8))
    mean, std, aug = (0.4, 0.5, 0.6), (0.2, 0.3, 0.25), latecast.Augment(crop=1, flip=0.5)

    class Net(PrepareOnDevice, L.LightningModule):
        def __init__(self, mix=None):
            super().__init__()
            self.prepare_on_device(mean=mean, std=std, augment=aug, seed=3, mix=mix)
            self.lin, self.trained, self.validated = torch.nn.Linear(90, N), [], []

        def training_step(self, batch, batch_idx):
            self.trained.append((self.current_epoch, batch_idx, *batch))
            return F.cross_entropy(self.lin(batch[0].flatten(1)), batch[1])

        def validation_step(self, batch, batch_idx):
            self.validated.append(batch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    # NCHW, as PILToTensor() collates; uint8 labels cross as one byte
    data = TensorDataset(images.permute(0, 3, 1, 2).contiguous(), torch.arange(N).to(torch.uint8))
    net = Net()
    lightning_trainer(max_epochs=2, enable_checkpointing=False, limit_val_batches=2).fit(
        net, DataLoader(data, batch_size=16, shuffle=True), DataLoader(data, batch_size=16)
    )
    assert len(net.trained) == 8 and {e for e, *_ in net.trained} == {0, 1}
    for epoch, batch_idx, x, y in net.trained:
        assert y.dtype == torch.int64 and x.shape == (16, 3, 6, 5)
        want = finished(images[y], y, (epoch, 0, batch_idx), mean, std, augment=aug, seed=3)
        assert torch.equal(x, want[0]), (epoch, batch_idx)
    for x, y in net.validated:
        assert torch.equal(x, latecast.normalize(images[y], mean, std))

    mix = latecast.transforms.Mix(classes=N, mixup=0.4, cutmix=1.0)
    net = Net(mix)  # in order: batch k holds samples 16k..16k+15
    lightning_trainer(max_epochs=1, enable_checkpointing=False, limit_val_batches=1).fit(
        net, DataLoader(data, batch_size=16), DataLoader(data, batch_size=16)
    )
    for _, batch_idx, x, y in net.trained:
        ids = torch.arange(16 * batch_idx, 16 * batch_idx + 16)
        wx, wy = finished(images[ids], ids, (0, 0, batch_idx), mean, std, augment=aug, seed=3,
                          mix=mix)  # fmt: skip
        assert y.shape == (16, N) and torch.equal(x, wx) and torch.equal(y, wy)
    assert {tuple(y.tolist()) for _, y in net.validated} == {tuple(range(16))}  # never mixed
