"""A kind of field is one class with a small interface (``latecast.fields.Field``): a toy kind
defined in this file alone crosses and finishes through every path that packs a batch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from _helpers import hooked_fit, lightning_hook, mover
from torch.utils.data import DataLoader, TensorDataset

import latecast
from latecast.data import Dataset, Split
from latecast.fields import Field, Image, Taken, labels_field
from latecast.transfer import Ring, TransferStats, pack, unpack

CPU = torch.device("cpu")


class Doubled(Field):
    """Integers that cross as int8 (one byte each) and come out doubled, as int64."""

    @classmethod
    def plan(cls, name, t, options, batch):
        return cls(name, torch.int8, tuple(t.shape), t.dtype)

    def view(self, raw, device):
        return raw.view(torch.int8).view(self.shape).long()

    def finish(self, x, ctx):
        return x * 2


class Heat(Field):
    """A pixel kind: int16 values per pixel ``(N, H, W)``, cropped and flipped with the batch's
    images (its draw), out float32 ``(N, 1, H, W)``."""

    pixels = True

    @classmethod
    def plan(cls, name, t, options, batch):
        return cls(name, torch.int16, tuple(t.shape), t.dtype)

    @property
    def size(self):
        return self.shape[1:]

    def view(self, raw, device):
        return raw.view(torch.int16).view(self.shape)[..., None]  # (N, H, W, 1)

    def finish(self, x, ctx):
        return ctx.draw.shift_and_flip(x).permute(0, 3, 1, 2).float()


class Nibbles(Image):
    """A kind a store holds: uint8 images of 16 grey levels stored two pixels a byte
    ``(N, H, W / 2, C)``, half the bytes; unpacked on the device, then finished as images."""

    @classmethod
    def plan(cls, name, t, options, batch):
        return cls(name, torch.uint8, tuple(t.shape), t.dtype)

    @property
    def size(self):
        n, h, half, c = self.shape
        return (h, 2 * half)

    def view(self, raw, device):
        x = raw.view(self.shape)  # (N, H, W / 2, C): the high nibble first
        return torch.stack([x >> 4, x & 15], 3).flatten(2, 3) * 17  # (N, H, W, C), 0..255


def nibbled(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 ``(N, H, W, C)`` of multiples of 17 packed two a byte."""
    x = (pixels // 17).view(*pixels.shape[:2], -1, 2, pixels.shape[3])
    return (x[:, :, :, 0] << 4) | x[:, :, :, 1]


@dataclass(frozen=True, eq=False)
class NibbleStore(Split):
    """A split whose images are stored as ``Nibbles``: its batch is described as that kind."""

    packed: np.ndarray  # (N, H, W / 2, C) uint8

    @property
    def image_shape(self):
        n, h, half, c = self.packed.shape
        return (h, 2 * half, c)

    @property
    def image_bytes(self):
        return self.packed.nbytes

    def batch(self, at):
        images = Nibbles(0, torch.uint8, (len(at), *self.packed.shape[1:]))
        return [images, labels_field(self.labels, len(at))], [
            Taken(self.packed, at), Taken(self.labels, at)
        ]  # fmt: skip


def grey16(n: int = 12, h: int = 6, w: int = 8, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 16, (n, h, w, 1), generator=g).to(torch.uint8) * 17


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
    plans = [Image(0, torch.uint8, (2, 6, 6, 3)), Doubled.plan("x", b["x"], None, {})]
    rows = torch.tensor([3, 1])
    s = pack(ring, plans, [Taken(images, rows.numpy()), b["x"]], stats)
    got_images, got_x = unpack(ring, s)
    assert torch.equal(got_images, b["image"][rows])
    assert torch.equal(plans[1].finish(got_x, None), b["x"] * 2)
    assert (stats.image_bytes, stats.other_bytes, stats.copies) == (2 * 6 * 6 * 3, 8, 1)


AUG = dict(crop=2, flip=0.5)


def heat_batches() -> list[dict]:
    """Images whose first channel holds the heat's values: the heat must move as they do."""
    out = []
    for k in range(2):
        g = torch.Generator().manual_seed(k)
        heat = torch.randint(0, 256, (4, 6, 7), generator=g, dtype=torch.int16)
        image = torch.cat([heat[..., None].to(torch.uint8)] * 3, 3)
        out.append({"image": image, "heat": heat, "y": torch.arange(4)})
    return out


def nibble_batches() -> list[dict]:
    return [{"image": nibbled(grey16(4, seed=k)), "y": torch.arange(4)} for k in range(2)]


def assert_heat_moves_with_images(got: list[dict]) -> None:
    moved = 0
    for b, before in zip(got, heat_batches()):
        assert b["heat"].dtype == torch.float32 and b["heat"].shape == (4, 1, 6, 7)
        assert torch.equal(b["heat"][:, 0], (b["image"][:, 0] * 255).round())
        moved += not torch.equal(b["heat"][:, 0], before["heat"].float())
    assert moved  # the draw did move them


def test_a_pixel_kind_of_ones_own_is_cropped_and_flipped_with_the_images():
    options = dict(augment=latecast.Augment(**AUG), fields={"heat": Heat}, seed=3)
    by_wrap = list(latecast.wrap(heat_batches(), device="cpu", **options))
    assert_heat_moves_with_images(by_wrap)
    one = latecast.Mover(device="cpu", **options)
    for got, want in zip([one(b) for b in heat_batches()], by_wrap):
        assert all(torch.equal(got[k], want[k]) for k in want)


def test_a_kind_a_store_holds_moves_by_every_mover_as_its_unpacked_pixels():
    """A split that describes its batch as ``Nibbles`` (``batch``) is moved by every mover,
    half the image bytes, to the same batches as its pixels stored whole."""
    pixels, labels = grey16(), np.arange(12, dtype=np.uint8) % 3
    common = ("nib", "train", labels, ("a", "b", "c"), (0.5,), (0.25,))
    store = NibbleStore(*common, nibbled(pixels).numpy())
    whole = Dataset(*common, pixels.numpy())
    options = dict(batch_size=5, device="cpu", seed=1, augment=latecast.Augment(**AUG))
    for transfer in ("uint8", "prefetch", "resident", "float32"):
        got = latecast.Loader(store, transfer=mover(transfer), **options)
        want = latecast.Loader(whole, transfer=mover(transfer), **options)
        for (x, y), (wx, wy) in zip(list(got), list(want), strict=True):
            assert torch.equal(x, wx) and torch.equal(y, wy), transfer
        if transfer == "uint8":
            assert got.stats.image_bytes * 2 == want.stats.image_bytes
    declared = dict(fields={"image": Nibbles}, mean=(0.5,), std=(0.25,))
    by_wrap = list(latecast.wrap(nibble_batches(), device="cpu", **declared))
    one = latecast.Mover(device="cpu", **declared)
    for got, m in zip(by_wrap, [one(b) for b in nibble_batches()], strict=True):
        assert torch.equal(got["image"], m["image"])
    for k, got in enumerate(by_wrap):
        want = latecast.normalize(grey16(4, seed=k), (0.5,), (0.25,))
        assert torch.equal(got["image"], want)


def test_the_toy_kinds_under_the_lightning_hook_come_out_as_through_wrap():
    """The pixel kind and the stored kind declared to a ``PrepareOnDevice`` LightningModule
    under a real ``Trainer``: each training step sees what ``wrap`` makes of the batch."""
    pytest.importorskip("lightning")
    for batches, options in (
        (heat_batches(), dict(augment=latecast.Augment(**AUG), fields={"heat": Heat}, seed=3)),
        (nibble_batches(), dict(fields={"image": Nibbles}, mean=(0.5,), std=(0.25,))),
    ):
        loader = DataLoader(batches, batch_size=None)  # each batch as it is
        seen = hooked_fit(loader, trainer=dict(max_steps=2), **options).trained
        want = list(latecast.wrap(batches, device="cpu", **options))
        assert len(seen) == len(want) == 2
        for got, ref in zip(seen, want):
            assert all(torch.equal(got[k], ref[k]) for k in ref)


def test_the_new_kinds_under_the_lightning_hook_come_out_as_through_wrap():
    """16-bit images with a mask, audio and a clip in one batch under a real ``Trainer``:
    each step sees what ``wrap`` makes of it (nothing drawn), the bytes counted are wrap's."""
    pytest.importorskip("lightning")
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
    options = dict(fields=fields, mean=(0.5,), std=(0.25,))
    model = hooked_fit(DataLoader(data, batch_size=8), trainer=dict(max_steps=2), **options)
    seen = model.trained
    wrapped = latecast.wrap(DataLoader(data, batch_size=8), device="cpu", **options)
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
    from latecast.errors import ConfigError
    from latecast.movers import Stored

    gathered = []

    class Counted(Stored):
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
    """Undeclared JPEG files are decoded alike by ``wrap``, ``Mover`` and the Lightning hook."""
    from _helpers import jpeg_bytes

    rng = np.random.default_rng(0)
    files = [jpeg_bytes(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)) for _ in range(3)]
    b = {"image": files, "label": torch.tensor([0, 1, 2])}
    by_wrap = next(iter(latecast.wrap([b], device="cpu")))
    by_mover = latecast.Mover(device="cpu")(b)
    assert by_wrap["image"].shape == (3, 3, 8, 8) and by_wrap["image"].dtype == torch.float32
    assert torch.equal(by_mover["image"], by_wrap["image"])
    assert torch.equal(lightning_hook(b)["image"], by_wrap["image"])
