"""A kind of field is one class with a small interface (``latecast.fields.Field``): a toy kind
defined in this file alone crosses and finishes through every path that packs a batch."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import latecast
from latecast.fields import Field, Image, Taken
from latecast.transfer import Ring, TransferStats, pack, unpack

CPU = torch.device("cpu")


class Doubled(Field):
    """Integers that cross as int8 (one byte each) and come out doubled, as int64."""

    @classmethod
    def plan(cls, name, t, options):
        return cls(name, torch.int8, tuple(t.shape), t.dtype)

    def view(self, raw, device):
        return raw.view(torch.int8).view(self.shape).long()

    def finish(self, x):
        return x * 2


def batch() -> dict:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (4, 6, 6, 3), dtype=torch.uint8, generator=g)
    return {"image": images, "x": torch.tensor([[1, -2], [3, 127], [-128, 0], [5, 6]])}


def test_a_kind_of_ones_own_crosses_narrow_and_finishes_through_wrap_and_mover():
    b = batch()
    for moved in (
        next(iter(latecast.wrap([b], device="cpu", fields={"x": Doubled}))),
        latecast.Mover(device="cpu", fields={"x": Doubled})(b),
    ):
        assert moved["x"].dtype == torch.int64 and torch.equal(moved["x"], b["x"] * 2)
        want = b["image"].permute(0, 3, 1, 2).float() / 255  # ToTensor()
        torch.testing.assert_close(moved["image"], want, atol=1e-6, rtol=0)
    w = latecast.wrap([b], device="cpu", fields={"x": Doubled})
    list(w)
    s = w.stats
    assert (s.other_bytes, s.image_bytes, s.copies) == (8, 4 * 6 * 6 * 3, 1)  # x: 8 bytes
    assert s.usual_bytes == 8 * 8 + 4 * 6 * 6 * 3  # as it arrived: int64


def test_the_loaders_packer_takes_the_same_kind():
    """The Loader's movers hand their host batch (``Taken`` rows of its arrays) to ``pack``,
    the packer ``wrap`` uses: the toy kind rides beside its images in one copy."""
    b = batch()
    ring, stats = Ring(2, CPU), TransferStats()
    images = b["image"].numpy()
    plans = [Image(0, torch.uint8, (2, 6, 6, 3)), Doubled.plan("x", b["x"], None)]
    rows = torch.tensor([3, 1])
    s = pack(ring, plans, [Taken(images, rows.numpy()), b["x"]], stats)
    got_images, got_x = unpack(ring, s)
    assert torch.equal(got_images, b["image"][rows])
    assert torch.equal(plans[1].finish(got_x), b["x"] * 2)
    assert (stats.image_bytes, stats.other_bytes, stats.copies) == (2 * 6 * 6 * 3, 8, 1)


def test_the_new_kinds_under_the_lightning_hook_come_out_as_through_wrap():
    """16-bit images with a mask, audio and a video clip in one batch, declared to a
    ``PrepareOnDevice`` LightningModule under a real ``Trainer``: each training step sees
    what ``wrap`` makes of the same batch (no augmentation: nothing drawn), and the bytes
    counted are wrap's."""
    pytest.importorskip("lightning")
    import lightning as L
    from _helpers import lightning_trainer

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randint(-1024, 3000, (16, 1, 8, 8), dtype=torch.int16, generator=g),
        torch.randint(0, 3, (16, 8, 8), generator=g),
        torch.randint(-3000, 3000, (16, 1, 1600), dtype=torch.int16, generator=g),
        torch.randint(0, 256, (16, 4, 8, 8, 3), dtype=torch.uint8, generator=g),
        torch.randint(0, 2, (16,), generator=g),
    )
    fields = {
        0: latecast.image16(window=(-1000, 400)),
        1: "mask",
        2: latecast.waveform(1600),
        3: latecast.clip(frames=4),
    }
    seen = []

    class Model(latecast.PrepareOnDevice, L.LightningModule):
        def __init__(self):
            super().__init__()
            self.prepare_on_device(fields=fields, mean=(0.5,), std=(0.25,))
            self.w = torch.nn.Parameter(torch.zeros(()))

        def training_step(self, batch, i):
            seen.append([t.clone() for t in batch])
            return self.w * batch[0].mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), 0.1)

    model = Model()
    lightning_trainer(max_steps=2, enable_checkpointing=False).fit(
        model, DataLoader(data, batch_size=8)
    )
    wrapped = latecast.wrap(
        DataLoader(data, batch_size=8), device="cpu", fields=fields, mean=(0.5,), std=(0.25,)
    )
    want = list(wrapped)
    assert len(seen) == len(want) == 2
    for got, ref in zip(seen, want):
        floats, ints = torch.float32, torch.int64
        assert [t.dtype for t in got] == [floats, ints, floats, floats, ints]
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert model.latecast_stats.h2d_bytes == wrapped.stats.h2d_bytes


def test_a_dataset_brings_its_own_movers_and_the_loader_takes_them():
    """A split that names its movers (``movers``, as a JPEG store names ``jpeg``) is moved by
    them: ``auto`` is its first, another name one error saying what the split holds."""
    import numpy as np

    from latecast.data import Dataset
    from latecast.errors import ConfigError
    from latecast.transfer import Uint8

    gathered = []

    class Counted(Uint8):
        name = "counted"

        def gather(self, idx):
            gathered.append(len(idx))
            return super().gather(idx)

    class Mine(Dataset):
        movers = {"counted": Counted}
        what = "pixels of my own"

    images = np.random.default_rng(0).integers(0, 256, (10, 4, 4, 1), dtype=np.uint8)
    labels = np.arange(10, dtype=np.uint8) % 3
    mine = Mine("mine", "train", labels, ("a", "b", "c"), (0.5,), (0.25,), images)
    plain = Dataset("mine", "train", labels, ("a", "b", "c"), (0.5,), (0.25,), images)
    got = list(latecast.Loader(mine, 4, device="cpu", shuffle=False))
    want = list(latecast.Loader(plain, 4, device="cpu", shuffle=False, transfer="uint8"))
    assert gathered == [4, 4, 2]
    for (x, y), (wx, wy) in zip(got, want, strict=True):
        assert torch.equal(x, wx) and torch.equal(y, wy)
    with pytest.raises(ConfigError, match=r"'uint8' does not move mine/train \(pixels of my own\)"
                       r"; valid: auto, counted"):  # fmt: skip
        latecast.Loader(mine, 4, device="cpu", transfer="uint8")


def test_undeclared_jpeg_files_are_recognised_by_mover_as_by_wrap():
    """The edge names the recogniser (``Fields.recognise``): a field of JPEG files that
    ``fields=`` does not declare is decoded alike by ``wrap`` and ``Mover``."""
    import numpy as np
    from _helpers import jpeg_bytes

    rng = np.random.default_rng(0)
    files = [jpeg_bytes(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)) for _ in range(3)]
    b = {"image": files, "label": torch.tensor([0, 1, 2])}
    by_wrap = next(iter(latecast.wrap([b], device="cpu")))
    by_mover = latecast.Mover(device="cpu")(b)
    assert by_wrap["image"].shape == (3, 3, 8, 8) and by_wrap["image"].dtype == torch.float32
    assert torch.equal(by_mover["image"], by_wrap["image"])
