"""The 16-bit image kind (``latecast.image16``): uint16/int16 images cross as stored and come
out equal to the float32 pipeline (torchvision v2's ops) with the same draws, masks moved
alike; bad input is one error naming the field."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision.transforms.v2.functional as TF
from _helpers import draw_of
from torch.utils.data import DataLoader, Dataset

import latecast
from latecast.errors import BatchError, ConfigError
from latecast.transforms import Mix

CPU = torch.device("cpu")
CUDA = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


class Tiles(Dataset):
    """``{"image": (C, H, W) in ``dtype``, "mask": int64 (H, W)}``, as a DataLoader's dataset
    (a CT slice in Hounsfield units, or a multispectral tile, beside its segmentation)."""

    def __init__(self, images: np.ndarray, masks: np.ndarray, dtype=None) -> None:
        self.images, self.masks, self.dtype = images, masks, dtype

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> dict:
        image = self.images[i] if self.dtype is None else self.images[i].astype(self.dtype)
        return {"image": torch.from_numpy(image), "mask": torch.from_numpy(self.masks[i])}


def ct_slices(n=24, h=20, w=18, seed=0) -> tuple[np.ndarray, np.ndarray]:
    """int16 (N, 1, H, W) Hounsfield units -1024..3071 (air to bone, past any window) and
    int64 (N, H, W) masks of 3 classes."""
    rng = np.random.default_rng(seed)
    images = rng.integers(-1024, 3072, (n, 1, h, w)).astype(np.int16)
    return images, rng.integers(0, 3, (n, h, w)).astype(np.int64)


def moved(x: torch.Tensor, i: int, draws, crop: int, nearest: bool = False) -> torch.Tensor:
    """Image ``i``'s ``x`` (C, H, W) moved by ``draws`` with torchvision v2's ops: resized crop
    (bilinear, or nearest as a ``Mask``), pad (0) and crop, flip."""
    h, w = x.shape[1:]
    if draws is not None and draws.boxes is not None:
        top, left, bh, bw = draws.boxes[i].tolist()
        mode = TF.InterpolationMode.NEAREST if nearest else TF.InterpolationMode.BILINEAR
        x = TF.resized_crop(x, top, left, bh, bw, [h, w], mode, antialias=True)
    if draws is not None and draws.shifts is not None:
        dy, dx = draws.shifts[i].tolist()
        x = TF.crop(TF.pad(x, [crop], fill=0), crop + dy, crop + dx, h, w)
    if draws is not None and draws.flips is not None and draws.flips[i]:
        x = TF.horizontal_flip(x)
    return x


def float32_pipeline(images, draws, *, mean, std, window=None, crop=0) -> torch.Tensor:
    """The usual way on (N, C, H, W) float32 with ``draws``: clamp, normalize, then moved."""
    out = []
    for i, x in enumerate(images.float()):  # (C, H, W)
        x = TF.normalize(x.clamp(*window) if window else x, list(mean), list(std))
        out.append(moved(x, i, draws, crop))
    return torch.stack(out)


def mask_pipeline(masks, draws) -> torch.Tensor:
    """The masks (N, H, W) moved by ``draws`` as torchvision moves a ``Mask``."""
    each = enumerate(masks[:, None])  # (1, H, W)
    return torch.stack([moved(m, i, draws, draws.augment.crop, nearest=True)[0] for i, m in each])


def draws_of(aug, seed: int, k: int, nhwc: torch.Tensor, epoch: int = 0):
    """The geometric draw ``wrap`` makes for batch ``k`` of ``epoch`` (the seeds it uses)."""
    return draw_of(aug, seed, (epoch, 0, k), nhwc)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_a_ct_window_through_wrap_equals_the_float32_pipeline_and_its_mask_follows(device):
    """MONAI's shape: int16 slices, ScaleIntensityRange(-1000, 400, 0, 1, clip=True), a
    random resized crop, crop and flip drawn once for the slice and its label map."""
    images, masks = ct_slices()
    aug = latecast.Augment(resized_crop=0.3, crop=3, flip=0.5)
    dl = DataLoader(Tiles(images, masks), batch_size=8, shuffle=False)
    kind = latecast.image16(window=(-1000, 400))
    got = latecast.wrap(
        dl, device=device, augment=aug, seed=4, fields={"image": kind, "mask": "mask"}
    )
    n = 0
    for k, (before, after) in enumerate(zip(dl, got)):
        draws = draws_of(aug, 4, k, before["image"].permute(0, 2, 3, 1))
        assert draws.boxes is not None and draws.flips.any()
        want = float32_pipeline(before["image"], draws, mean=[-1000], std=[1400],
                                window=(-1000, 400), crop=3).to(device)  # fmt: skip
        assert after["image"].dtype == torch.float32 and after["image"].device.type == device
        torch.testing.assert_close(after["image"], want, atol=1e-6, rtol=0)
        assert 0 <= after["image"].min() and after["image"].max() <= 1  # windowed
        assert torch.equal(after["mask"].cpu(), mask_pipeline(before["mask"], draws))
        n += len(after["image"])
    assert n == len(images)


def test_multispectral_bands_through_the_mover_per_band_mean_std_bfloat16_channels_last():
    """TorchGeo's uint16 13-band tiles (NHWC, past 32767), per-band statistics in stored
    units; dtype and channels_last apply."""
    rng = np.random.default_rng(1)
    tiles = rng.integers(0, 65536, (6, 16, 16, 13)).astype(np.uint16)
    mean = tuple(float(v) for v in rng.uniform(500, 3000, 13))
    std = tuple(float(v) for v in rng.uniform(200, 2000, 13))
    aug = latecast.Augment(crop=2, flip=0.5)
    for dtype, channels_last in [(torch.float32, False), (torch.bfloat16, True)]:
        mover = latecast.Mover(device="cpu", augment=aug, seed=2, dtype=dtype,
                               channels_last=channels_last,
                               fields={0: latecast.image16(mean=mean, std=std)})  # fmt: skip
        (out, labels) = mover((tiles, np.arange(6)))
        draws = draws_of(aug, 2, 0, torch.from_numpy(tiles))
        want = float32_pipeline(torch.from_numpy(tiles).permute(0, 3, 1, 2), draws, mean=mean,
                                std=std, crop=2)  # fmt: skip
        assert out.shape == (6, 13, 16, 16) and out.dtype == dtype
        assert out.is_contiguous(memory_format=torch.channels_last) == channels_last
        torch.testing.assert_close(out, want.to(dtype), atol=1e-6, rtol=0)
        assert labels.dtype == torch.int64


@pytest.mark.parametrize("dtype", [torch.uint16, torch.int16])
def test_without_a_scale_it_is_todtype_scale_true(dtype):
    """No range, window or mean/std: ``x / 65535`` (uint16), ``x / 32767`` (int16), as
    torchvision's ``ToDtype(torch.float32, scale=True)``; (N, H, W) is one channel."""
    low, high = (0, 65536) if dtype == torch.uint16 else (-32768, 32768)
    x = torch.from_numpy(np.random.default_rng(2).integers(low, high, (4, 9, 7)))
    x = x.to(torch.int32).numpy().astype(str(dtype).removeprefix("torch."))
    out = latecast.Mover(device="cpu", fields={"x": latecast.image16()})({"x": x})["x"]
    want = torch.from_numpy(x.astype(np.float32))[:, None] / float(np.iinfo(x.dtype).max)
    assert out.shape == (4, 1, 9, 7)
    torch.testing.assert_close(out, want, atol=1e-6, rtol=0)


def test_a_range_maps_to_0_1_and_crosses_half_the_bytes_of_float32():
    """Depth in millimetres, ``range=(0, 10000)``: x / 10000; image bytes 2 a pixel (float32's
    4), counted by the wrapped loader's stats; ``usual_bytes`` is wrap's: as they arrived."""
    depth = torch.randint(0, 10001, (8, 1, 12, 10), generator=torch.Generator().manual_seed(3))
    batches = [{"depth": depth.to(torch.uint16), "y": torch.arange(8)}]
    w = latecast.wrap(batches, device="cpu", fields={"depth": latecast.image16(range=(0, 10000))})
    (out,) = list(w)
    torch.testing.assert_close(out["depth"], depth.float() / 10000, atol=1e-6, rtol=0)
    s = w.stats
    assert s.image_bytes == depth.numel() * 2  # as stored
    assert s.usual_bytes - 8 * 8 == depth.numel() * 2  # as they arrived, beside int64 labels
    assert depth.float().numel() * 4 / s.image_bytes == 2.0  # float32's bytes, made on the host


def _plan(value, kind, **options):
    return latecast.Mover(device="cpu", fields={"ct": kind}, **options)({"ct": value})


GOOD = torch.zeros(2, 1, 6, 6, dtype=torch.int16)


@pytest.mark.parametrize(
    "value, kind, options, error, match",
    [
        (GOOD.float(), latecast.image16(), {}, BatchError, "'ct'.*uint16 or int16.*float32"),
        (GOOD.to(torch.uint8), latecast.image16(), {}, BatchError, "'ct'.*uint16 or int16"),
        (GOOD[None], latecast.image16(), {}, BatchError, r"'ct'.*\(1, 2, 1, 6, 6\)"),
        (GOOD[0, 0], latecast.image16(), {}, BatchError, "'ct'.*int16"),
        (GOOD - 1100, latecast.image16(range=(-1024, 3071)), {}, BatchError,
         "'ct': values -1100..-1100 outside the declared range -1024..3071"),
        (torch.zeros(2, 5, 6, 6, dtype=torch.int16), latecast.image16(), {}, BatchError,
         "'ct'.*ambiguous.*layout"),
        (GOOD, latecast.image16(channels=3, layout="NCHW"), {}, BatchError,
         "'ct': 1 channels.*declared 3"),
        (GOOD, latecast.image16(mean=(0, 0), std=(1, 1), layout="NCHW"), {}, BatchError,
         "'ct'.*2 mean/std"),
        (GOOD, latecast.image16(), {"augment": latecast.Augment(jitter=0.4)}, ConfigError,
         "'ct' is a 16-bit image.*colour jitter"),
        (GOOD, latecast.image16(), {"augment": latecast.Augment(cutout=2)}, ConfigError,
         "'ct' is a 16-bit image"),
        (GOOD, latecast.image16(), {"augment": lambda x, g: x}, ConfigError, "'ct'"),
    ],
    ids=["float", "uint8", "rank5", "rank2", "outside", "ambiguous", "channels", "means",
         "jitter", "cutout", "callable"],
)  # fmt: skip
def test_bad_input_is_one_error_naming_the_field(value, kind, options, error, match):
    with pytest.raises(error, match=match):
        _plan(value, kind, **options)


def test_wraps_mean_std_beside_only_16_bit_fields_are_refused_not_dropped():
    """wrap's own mean/std normalize 8-bit images only: beside a 16-bit field and no 8-bit one
    they were dropped without a word; now one ConfigError names the field and image16's."""
    says = r"field 'ct' is a 16-bit image.*latecast\.image16\(mean=, std=\)"
    with pytest.raises(ConfigError, match=says):
        _plan(GOOD, latecast.image16(), mean=(0.5,), std=(0.25,))
    dl = DataLoader(Tiles(*ct_slices(n=4)), batch_size=2)
    with pytest.raises(ConfigError, match=says.replace("ct", "image")):
        next(iter(latecast.wrap(dl, device="cpu", mean=(0.5,), std=(0.25,),
                                fields={"image": latecast.image16(), "mask": "mask"})))  # fmt: skip
    photo = torch.full((2, 6, 6, 1), 51, dtype=torch.uint8)  # an 8-bit image takes them
    out = _plan_batch({"ct": GOOD, "photo": photo}, {"ct": latecast.image16(), "photo": "image"},
                      mean=(0.1,), std=(0.5,))  # fmt: skip
    torch.testing.assert_close(out["photo"], torch.full((2, 1, 6, 6), 0.2))
    assert torch.equal(out["ct"], torch.zeros(2, 1, 6, 6))


@pytest.mark.parametrize("dtype, value", [(torch.uint16, 4000), (torch.int16, -1000)])
def test_16_bit_values_declared_image_are_refused_naming_image16(dtype, value):
    """``fields={"ct": "image"}`` on 16-bit values past 0..255: the error names the kind that
    takes them, ``latecast.image16``."""
    with pytest.raises(BatchError, match=r"field 'ct' is declared an image.*latecast\.image16"):
        _plan(torch.full((2, 6, 6, 1), value, dtype=dtype), "image")


@pytest.mark.parametrize("value", [[[1, 2], [3, 4]], None, "ct.png"], ids=["list", "None", "str"])
def test_a_16_bit_field_that_is_no_tensor_is_one_error_naming_the_field(value):
    """A list, None or a string where a 16-bit field is declared: one BatchError naming the
    field and what it was, not a raw AttributeError."""
    with pytest.raises(BatchError, match=r"^field 'ct' is declared a 16-bit image.*got a "):
        _plan(value, latecast.image16())


def test_values_inside_the_declared_range_and_a_window_pass():
    assert _plan(GOOD - 1024, latecast.image16(range=(-1024, 3071)))["ct"].min() == 0
    out = _plan(GOOD - 3000, latecast.image16(window=(-1000, 400)))["ct"]  # clamped, not refused
    assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(range=(5, 5)),
        dict(window=(400, -1000)),
        dict(window=(0, float("nan"))),
        dict(mean=(1, 2)),
        dict(mean=(1, 2), std=(1,)),
        dict(mean=0, std=0),
        dict(channels=0),
        dict(layout="CHW"),
    ],
    ids=str,
)
def test_bad_declarations_are_one_config_error(kwargs):
    with pytest.raises(ConfigError, match=r"latecast\.image16\("):
        latecast.image16(**kwargs)


@pytest.mark.parametrize("window", [(3100, 4000), (-3000, -1024), (3071, 4000)], ids=str)
def test_a_window_wholly_outside_the_range_is_one_config_error_naming_both(window):
    """Every value of the range would be clamped to one end of the window: every pixel came
    out the same (0) without a word; now refused where it is declared, naming both."""
    with pytest.raises(ConfigError, match=r"image16\(window=.*outside range=\(-1024, 3071\)"):
        latecast.image16(range=(-1024, 3071), window=window)
    assert latecast.image16(range=(-1024, 3071), window=(3000, 4000)).window == (3000, 4000)


def test_a_torchgeo_style_segmentation_loop_trains_as_the_float32_pipeline():
    """TorchGeo's datamodule shape (per-band normalize, flips of image and mask on the
    device, a per-pixel classifier): SGD on latecast's batches lands where float32's does."""
    rng = np.random.default_rng(5)
    tiles = rng.integers(0, 12000, (32, 13, 16, 16)).astype(np.uint16)
    masks = (tiles[:, 3] >= 6000).astype(np.int64)  # water or not, say: from band 4
    aug, std = latecast.Augment(flip=0.5), (1e4,) * 13

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(13, 16, 1), torch.nn.ReLU(),
                                   torch.nn.Conv2d(16, 2, 3, padding=1))  # fmt: skip

    def train(batches, prepare) -> tuple[list[float], torch.nn.Module]:
        net, losses = model(), []
        opt = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9)
        for epoch in range(3):
            for k, batch in enumerate(batches(epoch)):
                x, y = prepare(batch, epoch, k)
                loss = F.cross_entropy(net(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
        return losses, net

    usual = DataLoader(Tiles(tiles, masks, np.float32), batch_size=8)

    def by_hand(batch, epoch, k):
        draws = draws_of(aug, 0, k, batch["image"].permute(0, 2, 3, 1), epoch)
        x = float32_pipeline(batch["image"], draws, mean=(0.0,) * 13, std=std)
        return x, mask_pipeline(batch["mask"], draws)

    kinds = {"image": latecast.image16(mean=0, std=1e4, channels=13), "mask": "mask"}
    ours = latecast.wrap(DataLoader(Tiles(tiles, masks), batch_size=8), device="cpu", augment=aug,
                         fields=kinds)  # fmt: skip

    def epochs(epoch):
        ours.set_epoch(epoch)
        return ours

    want, net_a = train(lambda e: usual, by_hand)
    got, net_b = train(epochs, lambda b, e, k: (b["image"], b["mask"]))
    assert want[-1] < want[0] * 0.9  # it learns
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(net_a.parameters(), net_b.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert ours.stats.image_bytes == 3 * tiles.nbytes  # three epochs, 2 bytes a pixel


def test_erasing_and_mixing_run_on_the_16_bit_fields_output():
    """``erase=`` and ``mix=`` take the normalized floats, as they take 8-bit images'."""
    x = torch.full((4, 1, 8, 8), 30000, dtype=torch.uint16)
    batch = {"x": x, "y": torch.tensor([0, 1, 2, 3])}
    kind = {"x": latecast.image16(range=(0, 60000))}
    erased = _plan_batch(batch, kind, erase=latecast.Erasing(p=1.0, value=-7.0))
    assert (erased["x"] == -7.0).any() and (erased["x"] == 0.5).any()
    mixed = _plan_batch(batch, kind, mix=Mix(classes=4, mixup=1.0))
    assert mixed["y"].shape == (4, 4) and torch.allclose(
        mixed["x"], torch.full_like(mixed["x"], 0.5)
    )


def _plan_batch(batch, kinds, **options):
    return latecast.Mover(device="cpu", fields=kinds, **options)(batch)


def test_an_undeclared_16_bit_batch_is_said_to_be_images_of_image16():
    """Without a declaration a 4-dim int16 batch comes out int64 integers (8 bytes a pixel on
    the device, no normalize): wrap says so once, naming the field and ``image16``."""
    images, masks = ct_slices(n=8)
    dl = DataLoader(Tiles(images, masks), batch_size=4)
    with pytest.warns(UserWarning, match=r"field 'image' is torch.int16 .*latecast.image16"):
        batch = next(iter(latecast.wrap(dl, device="cpu")))
    assert batch["image"].dtype == torch.int64
