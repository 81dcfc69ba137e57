"""Photo augmentations (resized crop, colour jitter, alternating flip, batch mixing): each
op against torchvision v2's functional op with the same explicit parameters."""

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as TF
from _helpers import smooth

from latecast.data import from_arrays
from latecast.errors import ConfigError
from latecast.loader import Loader
from latecast.transforms import (
    Augment,
    Mix,
    alternating_flip_params,
    centre_boxes,
    color_jitter,
    color_jitter_params,
    resized_crop,
    resized_crop_params,
)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def photos(n, h, w, c=3, seed=0) -> torch.Tensor:
    """uint8 (n, h, w, c): ``smooth`` images with noise on them, so resampling errors show."""
    g = torch.Generator().manual_seed(seed)
    base = np.stack([smooth(h, w, seed + k, c).reshape(h, w, c) for k in range(n)])
    noise = torch.randint(-30, 31, (n, h, w, c), generator=g)
    return (torch.from_numpy(base) + noise).clamp(0, 255).to(torch.uint8)


def tv(image_hwc: torch.Tensor) -> torch.Tensor:
    return image_hwc.permute(2, 0, 1).contiguous()  # torchvision wants (C, H, W)


def close(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((a.int() - b.int()).abs().max())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("size", [(16, 16), (40, 24)])  # smaller: antialias; larger: upscale
def test_resized_crop_equals_torchvision(device, size):
    x = photos(6, 30, 36).to(device)
    boxes = torch.tensor(
        [
            [0, 0, 30, 36],
            [3, 5, 20, 11],
            [10, 0, 20, 36],
            [0, 20, 7, 16],
            [29, 35, 1, 1],
            [4, 4, 16, 16],
        ]
    )
    out = resized_crop(x, boxes, size)
    assert out.shape == (6, *size, 3) and out.dtype == torch.uint8 and out.device == x.device
    for i, (t, left, h, w) in enumerate(boxes.tolist()):
        ref = TF.resized_crop(tv(x[i]), t, left, h, w, list(size), antialias=True)
        assert close(out[i].permute(2, 0, 1), ref) <= 1, (i, (t, left, h, w))
    if device == "cpu":  # torchvision's own uint8 kernel: equal, not just close
        ref = TF.resized_crop(tv(x[1]), 3, 5, 20, 11, list(size), antialias=True)
        assert torch.equal(out[1].permute(2, 0, 1), ref)


def test_resized_crop_takes_images_of_different_sizes():
    images = [photos(1, h, w, c=1, seed=h)[0] for h, w in ((50, 70), (9, 12), (33, 33))]
    boxes = torch.tensor([[5, 10, 40, 50], [0, 0, 9, 12], [1, 2, 30, 31]])
    out = resized_crop(images, boxes, (20, 20))
    assert out.shape == (3, 20, 20, 1)
    for i, (t, left, h, w) in enumerate(boxes.tolist()):
        ref = TF.resized_crop(tv(images[i]), t, left, h, w, [20, 20], antialias=True)
        assert close(out[i].permute(2, 0, 1), ref) <= 1


@pytest.mark.parametrize("device", DEVICES)
def test_augment_draws_its_resized_crop_boxes_on_the_host(device):
    """One path, as Prepare takes it: the boxes drawn on a CPU generator (for a device
    generator: torch's default CPU one), then resized_crop; nothing is drawn on the device."""
    x, aug = photos(8, 20, 24).to(device), Augment(resized_crop=0.3)
    sizes, host = torch.tensor([[20, 24]]).expand(8, 2), torch.Generator().manual_seed(3)
    boxes = resized_crop_params(sizes, (0.3, 1.0), generator=host)
    g = torch.Generator(device=device).manual_seed(3)
    torch.manual_seed(3)
    before = g.get_state()
    assert torch.equal(aug(x, g), resized_crop(x, boxes, (20, 24)))
    assert device == "cpu" or torch.equal(g.get_state(), before)


def test_resized_crop_params_follow_torchvision_rules():
    n = 2000
    sizes = torch.tensor([[375, 500], [500, 375], [32, 32], [40, 400]]).repeat(n // 4, 1)
    boxes = resized_crop_params(sizes, (0.08, 1.0), generator=torch.Generator().manual_seed(0))
    top, left, h, w = boxes.T
    assert ((top >= 0) & (left >= 0) & (top + h <= sizes[:, 0]) & (left + w <= sizes[:, 1])).all()
    area, ratio = (h * w).double() / sizes.prod(1), w.double() / h
    tried = ratio.le(4 / 3 + 0.1) & ratio.ge(3 / 4 - 0.1)  # rounding moves a box a little
    assert tried.float().mean() > 0.95 and area.min() > 0.05 and area.max() <= 1
    assert len({tuple(b) for b in boxes[:8].tolist()}) == 8  # each image its own box
    again = resized_crop_params(sizes, (0.08, 1.0), generator=torch.Generator().manual_seed(0))
    assert torch.equal(boxes, again)


def test_resized_crop_params_fallback_is_the_centre_crop():
    # scale (1, 1) needs the whole area at a ratio within 3/4..4/3: impossible for 4:1 images,
    # so torchvision's fallback: full height, width clamped to height * 4/3, centred.
    sizes = torch.tensor([[30, 120], [120, 30]])
    boxes = resized_crop_params(sizes, (1.0, 1.0), generator=torch.Generator().manual_seed(1))
    assert boxes.tolist() == [[0, 40, 30, 40], [40, 0, 40, 30]]


def test_centre_boxes_cover_then_crop_the_centre():
    sizes = torch.tensor([[375, 500], [32, 32], [100, 50]])
    assert centre_boxes(sizes, (224, 224)).tolist() == [
        [0, 62, 375, 375],
        [0, 0, 32, 32],
        [25, 0, 50, 50],
    ]
    assert centre_boxes(sizes[:1], (100, 200)).tolist() == [[62, 0, 250, 500]]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("channels", [3, 1])
def test_color_jitter_equals_torchvision_adjust_ops(device, channels):
    x = photos(12, 9, 11, c=channels).to(device)
    factors = torch.tensor(
        [[1.0, 1.0, 1.0], [0.6, 1.0, 1.0], [1.4, 1.0, 1.0], [1.0, 0.5, 1.0], [1.0, 1.6, 1.0]]
        + [[1.0, 1.0, 0.3], [1.0, 1.0, 1.7], [0.7, 1.3, 0.6], [1.3, 0.7, 1.4], [0.0, 1.0, 1.0]]
        + [[1.0, 0.0, 0.0], [2.0, 2.0, 2.0]],
        device=device,
    )
    out = color_jitter(x, factors)
    for i, (b, c, s) in enumerate(factors.tolist()):
        ref = TF.adjust_saturation(TF.adjust_contrast(TF.adjust_brightness(tv(x[i]), b), c), s)
        assert close(out[i].permute(2, 0, 1), ref) <= 1, (i, b, c, s)


def test_color_jitter_params_ranges():
    x = torch.zeros(4000, 2, 2, 3, dtype=torch.uint8)
    f = color_jitter_params(x, 0.4, 1.5, 0.0, torch.Generator().manual_seed(0))
    assert f[:, 0].min() >= 0.6 and f[:, 0].max() <= 1.4 and f[:, 0].std() > 0.2
    assert f[:, 1].min() >= 0.0 and f[:, 1].max() <= 2.5  # 1 - 1.5 clamps at 0
    assert torch.equal(f[:, 2], torch.ones(4000))


def test_alternating_flip_alternates_per_sample_not_per_position():
    idx = torch.arange(10_000)
    e0, e1, e2 = (alternating_flip_params(idx, e, seed=3) for e in range(3))
    assert 0.45 < e0.float().mean() < 0.55  # half the images start flipped
    assert torch.equal(e1, ~e0) and torch.equal(e2, e0)  # then every image alternates
    shuffled = idx[torch.randperm(10_000)]
    assert torch.equal(alternating_flip_params(shuffled, 0, seed=3), e0[shuffled])
    assert not torch.equal(alternating_flip_params(idx, 0, seed=4), e0)  # the seed matters


def test_altflip_in_a_loader_flips_each_image_on_alternate_epochs():
    """Through the Loader (shuffled, so positions change): every image's orientation flips
    between consecutive epochs."""
    x = photos(40, 6, 5)
    ds = from_arrays(x, np.arange(40), mean=(0.0,) * 3, std=(1 / 255,) * 3)
    loader = Loader(ds, 16, device="cpu", augment=Augment(altflip=True), seed=1)
    seen = []
    for _ in range(3):
        by_label = {}
        for images, labels in loader:
            for img, lab in zip(images.round().to(torch.uint8).permute(0, 2, 3, 1), labels):
                by_label[int(lab)] = torch.equal(img, x[int(lab)].flip(1))  # flipped?
        seen.append(torch.tensor([by_label[i] for i in range(40)]))
    assert torch.equal(seen[1], ~seen[0]) and torch.equal(seen[2], seen[0])
    assert 5 < int(seen[0].sum()) < 35


def test_new_augment_names_parse_and_round_trip():
    aug = Augment.parse("resized_crop,flip,jitter")
    assert aug == Augment(resized_crop=0.35, flip=0.5, jitter=0.4)
    assert Augment.parse("resized_crop=0.08,altflip,jitter=0.2,cutout=4") == Augment(
        resized_crop=0.08, altflip=True, jitter=0.2, cutout=4
    )
    for a in (aug, Augment(altflip=True, crop=2, fill="reflect"), Augment(resized_crop=1.0)):
        assert Augment.parse(str(a)) == a
    with pytest.raises(ConfigError, match="choose flip or altflip"):
        Augment.parse("flip,altflip")
    with pytest.raises(ConfigError, match=r"altflip=\'yes\'.*not a valid bool"):
        Augment.parse("altflip=yes")
    with pytest.raises(ConfigError, match="resized_crop must be a number >= 0 and <= 1"):
        Augment(resized_crop=1.5)
    with pytest.raises(ConfigError, match="needs the samples' dataset indices"):
        Augment(altflip=True)(photos(2, 4, 4), torch.Generator())


def test_augment_with_the_new_ops_keeps_shape_and_is_deterministic():
    x = photos(16, 20, 24)
    aug = Augment(resized_crop=0.3, flip=0.5, jitter=0.4, cutout=4)
    a, b = aug(x, torch.Generator().manual_seed(5)), aug(x, torch.Generator().manual_seed(5))
    assert a.shape == x.shape and a.dtype == torch.uint8 and torch.equal(a, b)
    assert not torch.equal(a, aug(x, torch.Generator().manual_seed(6)))


def test_mix_is_torchvisions_mixup_and_cutmix():
    x, y = torch.randn(8, 3, 10, 12), torch.arange(8) % 5
    for mix in (Mix(classes=5, mixup=0.4), Mix(classes=5, cutmix=1.0)):
        for seed in range(5):
            images, soft = mix(x, y, torch.Generator().manual_seed(seed))
            assert soft.shape == (8, 5) and torch.allclose(soft.sum(1), torch.ones(8))
            lam = float(soft[0, int(y[0])])  # image 0 is mixed with image 7 (another class)
            if mix.mixup:
                assert torch.allclose(images, lam * x + (1 - lam) * x.roll(1, 0), atol=1e-6)
            else:  # the pasted box covers a (1 - lam) share of every image
                pasted = (images != x).any(1)  # (N, H, W)
                assert torch.allclose(pasted.float().mean((1, 2)), torch.full((8,), 1 - lam))
                assert torch.equal(images[:, :, ~pasted[0]], x[:, :, ~pasted[0]])
            again = mix(x, y, torch.Generator().manual_seed(seed))
            assert torch.equal(again[0], images) and torch.equal(again[1], soft)
    assert Mix.parse("none", 10) is None
    assert Mix.parse("mixup=0.2,cutmix", 10) == Mix(classes=10, mixup=0.2, cutmix=1.0)
    for mix in (Mix(10, mixup=0.2), Mix(10, cutmix=0.5), Mix(10, 1.0, 1.0), Mix(10)):
        assert Mix.parse(str(mix), 10) == mix
    with pytest.raises(ConfigError, match="unknown mix 'mosaic'"):
        Mix.parse("mosaic", 10)
    with pytest.raises(ConfigError, match="classes must be an integer >= 1, got 0"):
        Mix(classes=0)
    with pytest.raises(ConfigError, match="mixup must be a number >= 0, got -0.5"):
        Mix.parse("mixup=-0.5", 10)
    assert Mix(classes=np.int64(3), mixup=np.float32(0.5)) == Mix(classes=3, mixup=0.5)


def test_mix_hook_takes_torchvisions_mixup():
    """torchvision v2's MixUp goes in as ``lambda x, y, g: mixup(x, y)``; labels come out soft."""
    from torchvision.transforms import v2

    ds = from_arrays(photos(32, 8, 8), np.arange(32) % 4)
    mixup = v2.MixUp(num_classes=4)
    loader = Loader(ds, 8, device="cpu", mix=lambda x, y, g: mixup(x, y))
    images, labels = next(iter(loader))
    assert images.shape == (8, 3, 8, 8) and labels.shape == (8, 4)
    assert torch.allclose(labels.sum(1), torch.ones(8))
    runs = [
        [y for _, y in Loader(ds, 8, device="cpu", mix=Mix(classes=4, cutmix=1.0), seed=3)]
        for _ in range(2)
    ]
    assert all(torch.equal(a, b) for a, b in zip(*runs))  # seeded per batch: repeatable
