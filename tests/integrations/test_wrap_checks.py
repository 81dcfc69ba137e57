"""Issue 36's faults on wrap's path: a mask left undeclared under a geometric augmentation, the
masks' padding value, JPEG files given as strided views, a decompression bomb among them."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch
from _helpers import jpeg_bytes

import latecast
from latecast.errors import BatchError, ConfigError

AUG = latecast.Augment(crop=4, flip=0.5)


def segmentation(n: int = 8, h: int = 12, w: int = 12) -> dict:
    g = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (n, h, w, 3), dtype=torch.uint8, generator=g)
    masks = torch.randint(1, 4, (n, h, w), generator=g)  # labels 1..3: 0 only where padded
    return {"image": images, "mask": masks}


def jpeg_file(h: int = 16, w: int = 16) -> bytes:
    return jpeg_bytes(np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8))


def test_an_undeclared_per_pixel_field_under_a_geometric_augmentation_is_one_config_error():
    """torchvision's segmentation reference shape, its masks undeclared: the images were
    flipped and cropped and the masks not, silently."""
    for shape in ((8, 12, 12), (8, 1, 12, 12)):
        batch = {**segmentation(), "mask": torch.zeros(shape, dtype=torch.int64)}
        with pytest.raises(ConfigError, match=r"field 'mask' .* fields=\{'mask': 'mask'\}"):
            next(iter(latecast.wrap([batch], device="cpu", augment=AUG)))
    batch = segmentation()
    next(iter(latecast.wrap([batch], device="cpu")))  # no augmentation: nothing moves
    left = latecast.wrap([batch], device="cpu", augment=AUG, fields={"mask": torch.uint8})
    assert torch.equal(next(iter(left))["mask"], batch["mask"])  # declared: left as it is
    moved = latecast.wrap([batch], device="cpu", augment=AUG, fields={"mask": "mask"})
    next(iter(moved))


def test_masks_are_padded_with_mask_fill_where_the_crop_leaves_no_pixel():
    batch = segmentation()
    options = dict(device="cpu", augment=AUG, fields={"mask": "mask"})
    runs = {
        fill: next(iter(latecast.wrap([batch], **options, mask_fill=fill))) for fill in (0, 255)
    }
    assert torch.equal(runs[0]["image"], runs[255]["image"])
    padded = runs[0]["mask"] == 0  # the labels are 1..3: 0 is padding
    assert padded.any() and (~padded).any()
    assert torch.equal(runs[255]["mask"], runs[0]["mask"].masked_fill(padded, 255))
    with pytest.raises(ConfigError, match="mask_fill must be a number, got .255."):
        latecast.wrap([], mask_fill="255")


def test_jpeg_files_given_as_strided_views_cross_as_their_bytes():
    files = [jpeg_file(), jpeg_file(16, 16)]
    want = next(iter(latecast.wrap([{"jpg": files}], device="cpu")))["jpg"]
    strided = []
    for f in files:
        spread = np.zeros(2 * len(f), np.uint8)
        spread[::2] = np.frombuffer(f, np.uint8)
        strided.append(spread[::2])
    tensors = [torch.from_numpy(v.base)[::2] for v in strided]
    for given in (strided, tensors):
        got = next(iter(latecast.wrap([{"jpg": given}], device="cpu")))["jpg"]
        assert torch.equal(got, want)


def test_a_decompression_bomb_in_a_jpeg_field_is_named_before_any_pixel_is_decoded():
    """A small JPEG whose header says 60000x60000: decoding would allocate 10 GiB."""
    data = bytearray(jpeg_file())
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = (60000).to_bytes(2, "big") * 2  # height, width
    files = [jpeg_file(), bytes(data)]
    fields = {"jpg": latecast.jpeg(16)}
    with pytest.raises(BatchError, match=r"'jpg': the file at position 1 .* 60000x60000"):
        next(iter(latecast.wrap([{"jpg": files}], device="cpu", fields=fields)))


def test_jpeg_fields_resize_bicubic_as_torchvision_v2_within_one_grey_level():
    """A bicubic pipeline (OpenCLIP, timm) was 2 grey levels off on average (up to 29) with a
    bilinear resize; ``interpolation="bicubic"`` resizes as torchvision v2 does."""
    from torchvision.io import decode_jpeg
    from torchvision.transforms.v2 import InterpolationMode
    from torchvision.transforms.v2 import functional as F2

    from latecast.transforms import centre_boxes, resized_crop

    files = [jpeg_file(48, 64), jpeg_file(40, 30)]
    images = [decode_jpeg(torch.frombuffer(bytearray(f), dtype=torch.uint8)) for f in files]
    sizes = torch.tensor([im.shape[1:] for im in images])
    boxes = centre_boxes(sizes, (24, 24))
    hwc = [im.permute(1, 2, 0) for im in images]
    for how, mode in (
        ("bilinear", InterpolationMode.BILINEAR),
        ("bicubic", InterpolationMode.BICUBIC),
    ):
        crop = partial(F2.resized_crop, size=[24, 24], interpolation=mode, antialias=True)
        want = torch.stack([crop(im, *box) for im, box in zip(images, boxes.tolist())])
        got = resized_crop(hwc, boxes, (24, 24), interpolation=how).permute(0, 3, 1, 2)
        assert (got.int() - want.int()).abs().max() <= 1, how
        fields = {"jpg": latecast.jpeg(24, interpolation=how)}
        out = next(iter(latecast.wrap([{"jpg": files}], device="cpu", fields=fields)))["jpg"]
        assert ((out * 255).round().int() - want.int()).abs().max() <= 1, how
    bicubic, bilinear = (
        resized_crop(hwc, boxes, (24, 24), interpolation=h) for h in ("bicubic", "bilinear")
    )
    assert not torch.equal(bicubic, bilinear)  # the option does something
    with pytest.raises(ConfigError, match="interpolation=.... must be one of bilinear, bicubic"):
        latecast.jpeg(24, interpolation="nearest")
