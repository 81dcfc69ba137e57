"""Masks (issue 18): moved by their images' geometric draws, pixel for pixel (nearest
neighbour), never normalized, jittered or cut out."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _helpers import draw_of, lightning_hook
from PIL import Image

import latecast
from latecast.errors import BatchError, ConfigError
from latecast.transforms import centre_boxes, nearest_crop, resized_crop

N, H, W = 6, 10, 12
MASKS = {"mask": "mask", "mask1": "mask"}
CUDA = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def segmentation_batches(count: int = 3) -> list[dict]:
    """Images (N, 3, H, W) whose channel 0 is their mask (values 1..200; 0 the padding),
    and the masks (N, H, W) int64 and (N, 1, H, W) uint8: moved alike, they stay equal."""
    g = torch.Generator().manual_seed(3)
    out = []
    for _ in range(count):
        mask = torch.randint(1, 201, (N, H, W), generator=g)
        image = torch.randint(0, 256, (N, 3, H, W), generator=g, dtype=torch.uint8)
        image[:, 0] = mask.to(torch.uint8)
        out.append({"image": image, "mask": mask, "mask1": mask[:, None].to(torch.uint8)})
    return out


def as_uint8(images: torch.Tensor) -> torch.Tensor:
    return (images * 255).round().to(torch.uint8)  # no mean/std: ToTensor()'s x / 255


@pytest.mark.parametrize(
    "aug",
    [
        latecast.Augment(crop=3),
        latecast.Augment(crop=4, fill="reflect"),
        latecast.Augment(flip=0.5),
        latecast.Augment(flip=1.0),
        latecast.Augment(crop=2, flip=0.5),
    ],
    ids=str,
)
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_every_exact_geometric_op_moves_the_mask_with_the_image_pixel_by_pixel(aug, device):
    batches = segmentation_batches()
    got = list(latecast.wrap(batches, device=device, augment=aug, fields=MASKS, seed=5))
    moved = 0
    for before, after in zip(batches, got):
        image, mask, mask1 = (after[k].cpu() for k in ("image", "mask", "mask1"))
        assert mask.dtype == mask1.dtype == torch.int64
        assert mask.shape == (N, H, W) and mask1.shape == (N, 1, H, W)
        assert torch.equal(as_uint8(image[:, 0]).long(), mask)  # aligned, pixel by pixel
        assert torch.equal(mask1[:, 0], mask)
        assert set(mask.unique().tolist()) <= set(before["mask"].unique().tolist()) | {0}
        moved += int((mask != before["mask"]).flatten(1).any(1).sum())
    assert moved > 0  # the op did move something


def test_resized_crop_moves_the_mask_by_nearest_neighbour_with_the_images_own_boxes():
    """The boxes drawn once for the batch: the images resized bilinear by them, the masks by
    nearest neighbour (F.interpolate's), every value one of the mask's own."""
    aug = latecast.Augment(resized_crop=0.2, crop=2, flip=0.5)
    batches = segmentation_batches(2)
    got = list(latecast.wrap(batches, device="cpu", augment=aug, fields=MASKS, seed=7))
    for k, (before, after) in enumerate(zip(batches, got)):
        nhwc = before["image"].permute(0, 2, 3, 1)
        moves = draw_of(aug, 7, (0, 0, k), nhwc)  # the same seeds: (7, 0, 0, k)
        assert moves.boxes is not None and (moves.boxes[:, 2:] < torch.tensor([H, W])).any()
        images = moves.shift_and_flip(resized_crop(nhwc, moves.boxes, (H, W)))
        assert torch.equal(as_uint8(after["image"]), images.permute(0, 3, 1, 2))
        want = []
        for m, (top, left, h, w) in zip(before["mask"], moves.boxes.tolist()):
            crop = m[top : top + h, left : left + w].double()[None, None]
            want.append(F.interpolate(crop, (H, W), mode="nearest")[0, :, :, :, None].long())
        want = moves.shift_and_flip(torch.cat(want))[..., 0]
        assert torch.equal(after["mask"], want) and torch.equal(after["mask1"][:, 0], want)


def test_nearest_crop_equals_interpolate_nearest_for_any_box_and_dtype():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 50, (20, 13, 17, 2), generator=g)
    boxes = []
    for _ in range(20):
        h, w = int(torch.randint(1, 14, (1,), generator=g)), int(torch.randint(1, 18, (1,)))
        top, left = int(torch.randint(0, 14 - h, (1,))), int(torch.randint(0, 18 - w, (1,)))
        boxes.append([top, left, h, w])
    boxes = torch.tensor(boxes)
    for size in [(13, 17), (5, 31), (1, 1)]:
        got = nearest_crop(x, boxes, size)
        for i, (top, left, h, w) in enumerate(boxes.tolist()):
            crop = x[i, top : top + h, left : left + w].permute(2, 0, 1)[None].double()
            want = F.interpolate(crop, size, mode="nearest")[0].permute(1, 2, 0).long()
            assert torch.equal(got[i], want), (size, i)
    assert nearest_crop(x.bool(), boxes, (4, 4)).dtype == torch.bool


def test_a_mask_is_never_normalized_jittered_or_cut_out():
    """Colour jitter and cutout touch the images only: the masks are those of the same
    geometric draw without them; with mean/std given a uint8 mask keeps its values."""
    geometric = latecast.Augment(resized_crop=0.3, crop=2, flip=0.5)
    every = latecast.Augment(resized_crop=0.3, crop=2, flip=0.5, jitter=0.5, cutout=5)
    mean, std = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)
    batches = segmentation_batches()
    kwargs = dict(device="cpu", fields=MASKS, mean=mean, std=std, seed=1)
    plain = list(latecast.wrap(batches, augment=geometric, **kwargs))
    full = list(latecast.wrap(batches, augment=every, **kwargs))
    for a, b in zip(plain, full):
        assert torch.equal(a["mask"], b["mask"]) and torch.equal(a["mask1"], b["mask1"])
        assert not torch.equal(a["image"], b["image"])  # the colour ops did run
    bare = list(latecast.wrap(batches, fields=MASKS, mean=mean, std=std))
    for before, after in zip(batches, bare):
        assert torch.equal(after["mask"], before["mask"])
        assert torch.equal(after["mask1"], before["mask1"].long())


def test_masks_cross_narrow_and_count_as_integers():
    batch = segmentation_batches(1)[0]
    wrapped = latecast.wrap([batch], device="cpu", fields=MASKS)
    list(wrapped)
    s = wrapped.stats  # the int64 mask's values 1..200 cross as one byte, as the uint8 one
    assert (s.image_bytes, s.label_bytes) == (N * 3 * H * W, 2 * N * H * W)
    assert s.usual_bytes == N * 3 * H * W + N * H * W * (8 + 1)  # as they arrived


def test_a_uint8_mask_is_never_taken_for_an_image():
    batch = segmentation_batches(1)[0]
    with pytest.raises(BatchError, match=r"'image', 'mask1' are all uint8.*'mask1': 'mask'"):
        next(iter(latecast.wrap([batch], device="cpu")))
    alone = {"image": batch["image"][:, :1], "mask1": batch["mask1"]}  # gray image + mask
    with pytest.raises(BatchError, match="all uint8"):
        next(iter(latecast.wrap([alone], device="cpu", mean=(0.5,), std=(0.2,))))
    one = {"mask1": batch["mask1"]}
    with pytest.raises(BatchError, match=r"'mask1': 1 channels.*a mask\? declare it"):
        next(iter(latecast.wrap([one], device="cpu", mean=(0.5,) * 3, std=(0.2,) * 3)))
    out = next(iter(latecast.wrap([one], device="cpu", fields={"mask1": "mask"})))
    assert torch.equal(out["mask1"], batch["mask1"].long())


@pytest.mark.parametrize(
    "batch,match",
    [
        (
            {"image": torch.zeros(2, 3, 8, 8, dtype=torch.uint8), "mask": torch.zeros(2, 8, 9)},
            r"one \(N, H, W\).*'image': \(2, 8, 8\).*'mask': \(2, 8, 9\)",
        ),
        ({"mask": torch.zeros(2, 8)}, "'mask' is declared a mask and must be"),
        ({"mask": torch.zeros(2, 3, 8, 8, 1)}, "'mask' is declared a mask"),
    ],
)
def test_masks_of_another_size_or_shape_are_one_clear_error(batch, match):
    with pytest.raises(BatchError, match=match):
        next(iter(latecast.wrap([batch], device="cpu", fields={"mask": "mask"})))


def test_a_mask_with_an_augmentation_that_cannot_move_it_is_refused_at_once():
    with pytest.raises(ConfigError, match="augment must be a latecast.Augment where fields="):
        latecast.wrap([], augment=lambda x, g: x.flip(2), fields={"mask": "mask"})


def test_masks_through_the_lightning_hook_are_moved_as_wraps_are():
    """The hooks make what ``wrap`` makes; a batch another ``transfer_batch_to_device``
    moved is refused (one path)."""
    aug = latecast.Augment(resized_crop=0.3, crop=2, flip=0.5, jitter=0.2)
    batch = segmentation_batches(1)[0]
    want = next(iter(latecast.wrap([batch], device="cpu", augment=aug, fields=MASKS, seed=2)))
    got = lightning_hook(batch, (0, 0, 0), augment=aug, fields=MASKS, seed=2)
    for name in batch:
        assert torch.equal(got[name], want[name]), name
    with pytest.raises(BatchError, match="this dict came from another one: leave the move"):
        lightning_hook(batch, moved=True, augment=aug, fields=MASKS)


# -- issue 27: masks beside a JPEG field at another training size ----------------------------

PALETTE = torch.tensor([[250, 20, 20], [20, 250, 20], [20, 20, 250], [250, 250, 250]])


def jpeg_segmentation(n: int = 6, h: int = 48, w: int = 64) -> dict:
    """``n`` JPEG files of ``h x w`` and their masks (int64 labels 0..3 in 16x16 blocks): each
    file is its mask painted in ``PALETTE``, so a pixel's colour says which label it shows."""
    g = torch.Generator().manual_seed(4)
    masks = torch.randint(0, 4, (n, h // 16, w // 16), generator=g)
    masks = masks.repeat_interleave(16, 1).repeat_interleave(16, 2)  # (n, h, w)
    files = []
    for m in masks:
        buf = io.BytesIO()
        Image.fromarray(PALETTE[m].to(torch.uint8).numpy()).save(
            buf, "JPEG", quality=95, subsampling=0
        )
        files.append(buf.getvalue())
    return {"image": files, "mask": masks}


def reference(batch: dict, aug, size, seed: int, k: int):
    """What wrap must give for batch ``k``: Pillow's decoding of each file cropped by the
    boxes that batch draws (its seeds), bilinear; its mask by the same boxes, nearest."""
    files = [np.asarray(Image.open(io.BytesIO(f)).convert("RGB")) for f in batch["image"]]
    pixels = torch.from_numpy(np.stack(files))  # (N, H, W, 3), what the decoders give
    n, h, w = batch["mask"].shape
    moves = draw_of(aug, seed, (0, 0, k), pixels) if aug else None
    boxes = centre_boxes(torch.tensor([[h, w]]).expand(n, 2), size)
    boxes = boxes if moves is None or moves.boxes is None else moves.boxes
    images, masks = resized_crop(pixels, boxes, size), []
    for m, (top, left, bh, bw) in zip(batch["mask"], boxes.tolist()):
        crop = m[top : top + bh, left : left + bw].double()[None, None]
        masks.append(F.interpolate(crop, size, mode="nearest")[0, :, :, :, None].long())
    masks = torch.cat(masks)
    if moves is not None:
        images, masks = moves.shift_and_flip(images), moves.shift_and_flip(masks)
    return images.permute(0, 3, 1, 2), masks[..., 0]


@pytest.mark.parametrize(
    "aug",
    [None, latecast.Augment(flip=1.0), latecast.Augment(resized_crop=0.3, flip=0.5, crop=2)],
    ids=str,
)
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_masks_beside_a_jpeg_field_are_cropped_resized_and_flipped_as_its_images(
    decoder, aug, device
):
    """48x64 files trained at 24x32 (their masks once came out unmoved): each mask follows
    its image's decode box by nearest neighbour and flips alike (against Pillow); the decoded
    colours say the labels wherever a 5x5 neighbourhood is one label (bilinear blur)."""
    batches = [jpeg_segmentation() for _ in range(2)]
    fields = {"image": latecast.jpeg(size=(24, 32)), "mask": "mask"}
    got = list(latecast.wrap(batches, device=device, augment=aug, fields=fields, seed=3))
    for k, (before, after) in enumerate(zip(batches, got)):
        image, mask = as_uint8(after["image"].cpu()), after["mask"].cpu()
        assert image.shape == (6, 3, 24, 32) and mask.shape == (6, 24, 32)
        if device == "cpu":
            images, masks = reference(before, aug, (24, 32), 3, k)
            assert torch.equal(mask, masks) and (image.int() - images.int()).abs().max() <= 1
        seen = (image.permute(0, 2, 3, 1)[..., None, :].int() - PALETTE).abs().sum(-1).argmin(-1)
        m = mask.double()[:, None]  # seen: (N, 24, 32), the label each pixel shows
        inner = (F.max_pool2d(m, 5, 1, 2) == -F.max_pool2d(-m, 5, 1, 2))[:, 0]  # 5x5 one label
        assert inner.float().mean() > 0.25 and torch.equal(seen[inner], mask[inner])


def test_masks_that_cannot_follow_their_jpeg_images_are_one_clear_error():
    batch = jpeg_segmentation(n=3)
    fields = {"image": latecast.jpeg(size=(24, 32)), "mask": "mask"}
    with pytest.raises(
        BatchError, match=r"'mask': masks \(3, 40, 64\) .* 'image' .* position 0 is 48x64"
    ):
        first = {"image": batch["image"], "mask": batch["mask"][:, :40]}
        next(iter(latecast.wrap([first], device="cpu", fields=fields)))
    with pytest.raises(BatchError, match="but it holds 2 files"):
        next(iter(latecast.wrap([{**batch, "image": batch["image"][:2]}], fields=fields)))
    raw = {**batch, "raw": torch.zeros(3, 48, 64, 3, dtype=torch.uint8)}  # comes out 48x64
    with pytest.raises(BatchError, match=r"one size, got \[\(24, 32\), \(48, 64\)\]"):
        next(iter(latecast.wrap([raw], device="cpu", fields={**fields, "raw": "image"})))


def test_random_erasing_reaches_jpeg_fields_too():
    """``erase=`` was silently left out for JPEG fields (only uint8 image fields got it)."""
    batch = jpeg_segmentation(n=4)
    erase = latecast.Erasing(p=1.0, value=9.0)
    out = next(iter(latecast.wrap([{"image": batch["image"]}], device="cpu", erase=erase)))["image"]
    assert out.shape == (4, 3, 48, 64) and ((out == 9.0).flatten(1).sum(1) > 0).all()


IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def cat_list(images, fill_value=0):
    """torchvision's references/segmentation/utils.py ``cat_list``, as it is."""
    max_size = tuple(max(s) for s in zip(*[img.shape for img in images]))
    batch_shape = (len(images),) + max_size
    batched_imgs = images[0].new(*batch_shape).fill_(fill_value)
    for img, pad_img in zip(images, batched_imgs):
        pad_img[..., : img.shape[-2], : img.shape[-1]].copy_(img)
    return batched_imgs


def cat_list_per_channel(images, fill_value=0):
    """``cat_list`` with its one fill line rewritten (docs/dataloader.md) so that
    ``fill_value`` may be one value per channel: the mean in uint8 units for uint8 images."""
    max_size = tuple(max(s) for s in zip(*[img.shape for img in images]))
    batch_shape = (len(images),) + max_size
    batched_imgs = images[0].new_tensor(fill_value).view(-1, 1, 1).expand(batch_shape).clone()
    for img, pad_img in zip(images, batched_imgs):
        pad_img[..., : img.shape[-2], : img.shape[-1]].copy_(img)
    return batched_imgs


def test_torchvisions_segmentation_padding_converted_pads_uint8_with_the_mean():
    """torchvision's reference pads after normalizing (0 is the mean); converted, its
    ``collate_fn`` pads uint8 with black (-mean/std, 2.1 off): padded with ``round(255 *
    mean)`` it comes out within 0.5/255/std of 0; masks padded with 255 both ways."""
    g = torch.Generator().manual_seed(47)
    sizes = [(10, 12), (7, 12), (10, 9), (6, 5), (9, 11), (8, 8)]
    samples = []
    for h, w in sizes:
        image = torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8)
        samples.append((image, torch.randint(0, 21, (h, w), generator=g)))
    mean, std = (
        torch.tensor(IMAGENET_MEAN)[:, None, None],
        torch.tensor(IMAGENET_STD)[:, None, None],
    )

    def reference_collate(batch):  # its transforms: PILToTensor, ToDtype(scale), Normalize
        images, targets = zip(*batch)
        images = [(img.float() / 255 - mean) / std for img in images]
        return cat_list(images, fill_value=0), cat_list(targets, fill_value=255)

    def converted_collate(cat, fill):  # its transforms: PILToTensor only
        def collate(batch):
            images, targets = zip(*batch)
            return cat(images, fill_value=fill), cat(targets, fill_value=255)

        return collate

    def run(collate_fn, wrapped=True):
        dl = torch.utils.data.DataLoader(samples, batch_size=3, collate_fn=collate_fn)
        if not wrapped:
            return list(dl)
        kwargs = dict(mean=IMAGENET_MEAN, std=IMAGENET_STD, fields={1: "mask"}, mask_fill=255)
        return list(latecast.wrap(dl, device="cpu", **kwargs))  # as docs/dataloader.md says

    fill = [round(255 * m) for m in IMAGENET_MEAN]  # (124, 116, 104)
    reference = run(reference_collate, wrapped=False)
    as_docs_said = run(converted_collate(cat_list, 0))
    fixed = run(converted_collate(cat_list_per_channel, fill))
    bound = 0.5 / 255 / std  # per channel, 0.0087 at most
    for k, (want, want_masks) in enumerate(reference):
        batch = sizes[3 * k : 3 * k + 3]
        inside = torch.zeros(want.shape[0], 1, *want.shape[2:], dtype=torch.bool)
        for i, (h, w) in enumerate(batch):
            inside[i, :, :h, :w] = True
        padded = ~inside.expand_as(want)
        assert padded.any() and (want[padded] == 0).all()
        for got, got_masks in (as_docs_said[k], fixed[k]):
            assert got.dtype == torch.float32 and got.shape == want.shape
            torch.testing.assert_close(got[~padded], want[~padded], rtol=0, atol=1e-6)
            assert torch.equal(got_masks, want_masks) and (want_masks[padded[:, 0]] == 255).all()
        black = as_docs_said[k][0]
        assert torch.allclose(black[padded], (-mean / std).expand_as(want)[padded], atol=1e-6)
        assert (black[padded] - want[padded]).abs().min() > 1.7  # -mean/std: 1.80 to 2.12
        assert ((fixed[k][0][padded] - want[padded]).abs() <= bound.expand_as(want)[padded]).all()
