"""The jpeg mover and the decode step: JPEG files gathered on the host, decoded and cropped
to the training size by the prepare stage; compared with Pillow's decoding + the same crop."""

import dataclasses
import io
import itertools
from functools import partial

import _helpers
import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image

from latecast.errors import ConfigError, FormatError
from latecast.kinds.decode import decode
from latecast.kinds.jpeg import JpegStore
from latecast.kinds.jpegfiles import EncodedDataset
from latecast.loader import Loader
from latecast.movers import MOVERS, resolve
from latecast.transforms import Augment, Mix, centre_boxes, resized_crop_params

SIZES = [(40, 56), (32, 32), (61, 23), (32, 32), (90, 120), (33, 47), (32, 32), (50, 50)]


def photo(h: int, w: int, c: int, seed: int) -> np.ndarray:
    """Smooth colour fields + a bright rectangle: real JPEG content, not noise."""
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:h, 0:w]
    img = np.stack(
        [127 + 90 * np.sin(xs / rng.uniform(3, 9) + ys / rng.uniform(3, 9) + k) for k in range(c)],
        -1,
    )
    y0, x0 = rng.integers(0, h // 2), rng.integers(0, w // 2)
    img[y0 : y0 + h // 3, x0 : x0 + w // 3] = 230
    return img.clip(0, 255).astype(np.uint8)


jpeg_bytes = partial(_helpers.jpeg_bytes, quality=85)  # the damaged-file cases were found at 85


def encoded(files: list[bytes], sizes, size=(32, 32), channels=3, labels=None, name="photos"):
    """An EncodedDataset straight from JPEG bytes, as an encoded store holds them; mean 0
    and std 1/255, so the loader's output times 255 is the uint8 pixels."""
    offsets = np.concatenate([[0], np.cumsum([len(f) for f in files])]).astype(np.int64)
    labels = np.arange(len(files)) % 3 if labels is None else labels
    return EncodedDataset(
        name=name,
        split="train",
        data=np.frombuffer(b"".join(files), dtype=np.uint8),
        offsets=offsets,
        sizes=np.array(sizes, dtype=np.int32),
        labels=labels.astype(np.uint8),
        classes=("a", "b", "c"),
        mean=(0.0,) * channels,
        std=(1 / 255,) * channels,
        channels=channels,
        size=size,
    )


@pytest.fixture(scope="module")
def colour():
    images = [photo(h, w, 3, i) for i, (h, w) in enumerate(SIZES)]
    return images, encoded([jpeg_bytes(im) for im in images], SIZES)


def pillow(files_ds: EncodedDataset, i: int) -> torch.Tensor:
    """Pillow's decoding of file ``i``, (C, H, W) uint8."""
    a, b = files_ds.offsets[i], files_ds.offsets[i + 1]
    im = Image.open(io.BytesIO(files_ds.data[a:b].tobytes()))
    arr = np.asarray(im.convert("RGB" if files_ds.channels == 3 else "L"))
    return torch.from_numpy(arr.reshape(*arr.shape[:2], -1).copy()).permute(2, 0, 1)


def as_uint8(images: torch.Tensor) -> torch.Tensor:
    return images.mul(1.0).round().to(torch.uint8)  # mean 0, std 1/255: x255 undone


def test_jpeg_batches_equal_pillow_plus_the_centre_crop(colour):
    """Evaluation path: every file decoded and cropped (scale to cover, centre) to 32x32."""
    _, ds = colour
    loader = Loader(ds, 3, device="cpu", transfer="jpeg", shuffle=False, pad=False)
    got = torch.cat([as_uint8(x).cpu() for x, _ in loader])
    assert got.shape == (len(SIZES), 3, 32, 32) and loader.transfer == "jpeg"
    for i, box in enumerate(centre_boxes(torch.tensor(SIZES), (32, 32)).tolist()):
        ref = TF.resized_crop(pillow(ds, i), *box, [32, 32], antialias=True)
        assert int((got[i].int() - ref.int()).abs().max()) <= 1, i


def test_decode_with_random_boxes_equals_pillow_plus_the_same_crop(colour):
    _, ds = colour
    batch = next(
        JpegStore(ds, torch.device("cpu"), 8).batches([torch.arange(8)], lambda p, v, d: v)
    )[0]
    boxes = resized_crop_params(batch.sizes, (0.1, 1.0), generator=torch.Generator().manual_seed(0))
    out = decode(batch, (24, 20), boxes).cpu()
    assert out.shape == (8, 24, 20, 3) and out.dtype == torch.uint8
    for i, box in enumerate(boxes.tolist()):
        ref = TF.resized_crop(pillow(ds, i), *box, [24, 20], antialias=True)
        assert int((out[i].permute(2, 0, 1).int() - ref.int()).abs().max()) <= 1, (i, box)


def test_gray_stores_decode_to_one_channel():
    images = [photo(h, w, 1, i) for i, (h, w) in enumerate(SIZES[:4])]
    ds = encoded([jpeg_bytes(im) for im in images], SIZES[:4], size=(16, 16), channels=1)
    got = torch.cat([as_uint8(x) for x, _ in Loader(ds, 4, device="cpu", shuffle=False)])
    assert got.shape == (4, 1, 16, 16)
    for i, box in enumerate(centre_boxes(torch.tensor(SIZES[:4]), (16, 16)).tolist()):
        ref = TF.resized_crop(pillow(ds, i), *box, [16, 16], antialias=True)
        assert int((got[i].int() - ref.int()).abs().max()) <= 1


def test_threads_do_not_change_the_result(colour):
    _, ds = colour
    aug = Augment(resized_crop=0.2, jitter=0.3, flip=0.5)
    runs = []
    for threads in (1, 2, 3):
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            runs.append([x for x, _ in Loader(ds, 5, device="cpu", augment=aug, seed=2)])
        finally:
            torch.set_num_threads(before)
    assert all(torch.equal(a, b) for run in runs[1:] for a, b in zip(runs[0], run))


@pytest.mark.parametrize("plain", [False, True], ids=["headers-read", "plain-store"])
def test_files_at_the_training_size_are_stacked_as_decoded_and_a_bad_one_is_named(plain):
    """Files at 32x32 decode straight into the batch (3 threads); an EXIF turn is shown
    upright; a file that does not decode or differs from sizes.npy is named, a damaged one
    once."""
    from PIL import ImageOps

    files = [jpeg_bytes(photo(32, 32, 3, i)) for i in range(7)]
    if not plain:  # a file turned by EXIF orientation 8
        buf, exif = io.BytesIO(), Image.Exif()
        exif[0x0112] = 8
        Image.fromarray(photo(32, 32, 3, 3)).save(buf, "JPEG", quality=85, exif=exif.tobytes())
        files[3] = buf.getvalue()
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        ds = dataclasses.replace(encoded(files, [(32, 32)] * 7), plain=plain)
        got = torch.cat([as_uint8(x) for x, _ in Loader(ds, 7, device="cpu", shuffle=False)])
        for i, f in enumerate(files):
            ref = np.array(ImageOps.exif_transpose(Image.open(io.BytesIO(f))).convert("RGB"))
            assert int((got[i].int() - torch.from_numpy(ref).permute(2, 0, 1)).abs().max()) <= 1
        for k, bad, why in [
            (5, files[5][:300], "not a decodable JPEG"),
            (6, jpeg_bytes(photo(40, 32, 3, 0)), "the file is 40x32, sizes.npy says 32x32"),
            (4, jpeg_bytes(photo(24, 32, 3, 0)), "the file is 24x32, sizes.npy says 32x32"),
        ]:
            ds = dataclasses.replace(
                encoded(files[:k] + [bad] + files[k + 1 :], [(32, 32)] * 7), plain=plain
            )
            with pytest.raises(FormatError, match=f"sample {k}: {why}"):
                list(Loader(ds, 7, device="cpu", shuffle=False))
        data, mid = bytearray(files[1]), (files[1].index(b"\xff\xda") + len(files[1])) // 2
        data[mid : mid + 16] = bytes(b ^ 0xFF for b in data[mid : mid + 16])  # libjpeg warns
        ds = encoded([files[0], bytes(data), *files[2:]], [(32, 32)] * 7)
        with pytest.warns(UserWarning, match="photos/train: sample 1: damaged JPEG data") as said:
            list(Loader(dataclasses.replace(ds, plain=plain), 7, device="cpu", shuffle=False))
        assert len([w for w in said if "damaged" in str(w.message)]) == 1
    finally:
        torch.set_num_threads(before)


def test_a_batch_at_the_training_size_decodes_into_slots_off_32_byte_boundaries():
    """libjpeg-turbo's AVX2 colour conversion writes a row that starts on a 32-byte boundary
    with non-temporal stores, past the cache: CIFAR-10's 96-byte rows decode into a batch that
    starts 8 bytes past one, so none does (and each pixel is what it was)."""
    files = [jpeg_bytes(photo(32, 32, 3, i)) for i in range(4)]
    ds = dataclasses.replace(encoded(files, [(32, 32)] * 4), plain=True)
    (f, _), _ = ds.batch(np.arange(4))
    x = decode(f.view(torch.from_numpy(ds.data.copy()), torch.device("cpu")), (32, 32))
    assert x.data_ptr() % 32 == 8 and x.is_contiguous() and x.shape == (4, 32, 32, 3)
    for i, data in enumerate(files):
        ref = np.array(Image.open(io.BytesIO(data)).convert("RGB"))
        assert int((x[i].int() - torch.from_numpy(ref)).abs().max()) <= 1


def test_bytes_counted_are_the_compressed_files_beside_uint8(colour):
    _, ds = colour
    loader = Loader(ds, 3, device="cpu")  # auto: jpeg for an encoded store
    for _ in loader:
        pass
    s = loader.stats
    assert loader.transfer == "jpeg" and s.copies == len(loader) == 3
    assert s.image_bytes == int(ds.offsets[-1]) and s.label_bytes == len(SIZES)
    assert s.h2d_bytes == JpegStore.epoch_bytes(ds)["per_epoch"]
    assert s.decoded_bytes == len(SIZES) * 32 * 32 * 3  # what uint8 would have moved
    assert s.image_bytes < s.decoded_bytes


def test_augmented_jpeg_batches_resume_exactly(colour):
    """The crop boxes are drawn on the host from (seed, epoch, rank, batch): a loader that
    continues from a state gives the same batches as one that never stopped."""
    _, ds = colour
    aug = Augment(resized_crop=0.3, flip=0.5, jitter=0.2)
    whole = [x for x, _ in Loader(ds, 2, device="cpu", augment=aug, seed=7)]
    first = Loader(ds, 2, device="cpu", augment=aug, seed=7)
    list(itertools.islice(first, 2))
    later = Loader(ds, 2, device="cpu", augment=aug, seed=7)
    later.load_state_dict(first.state_dict())
    rest = [x for x, _ in later]
    assert len(rest) == 2 and all(torch.equal(a, b) for a, b in zip(whole[2:], rest))
    assert not torch.equal(whole[0], whole[1])


def test_other_transfers_refuse_encoded_stores_and_jpeg_refuses_pixels(colour):
    _, ds = colour
    for name in MOVERS:
        if name != "jpeg":
            with pytest.raises(ConfigError, match=r"does not move photos/train.*valid: auto, jpeg"):
                Loader(ds, 4, transfer=name)
    from latecast.data import from_arrays

    pixels = from_arrays(np.zeros((4, 8, 8, 3), np.uint8), np.zeros(4, int), name="px")
    with pytest.raises(ConfigError, match=r"'jpeg' does not move px/train.*valid: auto, uint8"):
        Loader(pixels, 4, transfer="jpeg")
    assert resolve("auto", ds, torch.device("cpu")).name == "jpeg"


def test_a_file_that_does_not_decode_is_named(colour):
    images, _ = colour
    files = [jpeg_bytes(im) for im in images[:4]]
    files[2] = files[2][: len(files[2]) // 3]  # cut short
    ds = encoded(files, SIZES[:4])
    with pytest.raises(FormatError, match="sample 2: not a decodable JPEG"):
        list(Loader(ds, 4, device="cpu", shuffle=False))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_nvjpeg_batches_are_close_to_pillow_and_repeatable(colour):
    """nvJPEG is not libjpeg-turbo: held to a mean error under a grey level; a seeded pass
    repeats exactly."""
    _, ds = colour
    loader = Loader(ds, 4, device="cuda", shuffle=False, pad=False)
    got = torch.cat([as_uint8(x).cpu() for x, _ in loader])
    boxes = centre_boxes(torch.tensor(SIZES), (32, 32)).tolist()
    ref = torch.stack([TF.resized_crop(pillow(ds, i), *b, [32, 32]) for i, b in enumerate(boxes)])
    diff = (got.int() - ref.int()).abs()
    assert loader.transfer == "jpeg" and diff.float().mean() < 1.0 and diff.max() <= 8
    aug, mix = Augment(resized_crop=0.3, altflip=True, jitter=0.2), Mix(classes=3, mixup=0.5)
    runs = [
        [(x.cpu(), y.cpu()) for x, y in Loader(ds, 3, device="cuda", augment=aug, mix=mix)]
        for _ in range(2)
    ]
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(*runs))


def test_a_damaged_file_is_named_once_and_other_text_on_fd2_is_passed_on(colour, capfd):
    from latecast.kinds.decode import Encoded, _named

    images, _ = colour
    files = [jpeg_bytes(im) for im in images[:4]]
    data, mid = bytearray(files[1]), (files[1].index(b"\xff\xda") + len(files[1])) // 2
    data[mid : mid + 16] = bytes(b ^ 0xFF for b in data[mid : mid + 16])  # scan data damaged
    files[1] = bytes(data)
    clean = encoded(files[:1] + files[2:], SIZES[:1] + SIZES[2:4])
    with pytest.warns(UserWarning, match="photos/train: sample 1: damaged JPEG data") as said:
        batches = list(Loader(encoded(files, SIZES[:4]), 2, device="cpu", shuffle=False))
    assert len(batches) == 2 and len([w for w in said if "damaged" in str(w.message)]) == 1
    assert "Corrupt JPEG" not in capfd.readouterr().err
    batch = Encoded(
        torch.from_numpy(np.array(clean.data)), clean.offsets.tolist(),
        torch.from_numpy(clean.sizes.astype(np.int64)), torch.arange(3), 3, torch.device("cpu"),
        "photos/train",
    )  # fmt: skip
    out = torch.zeros(1)
    assert _named("another thread's line\n", batch, out) is out  # no file repeats it: not libjpeg's
    assert capfd.readouterr().err == "another thread's line\n"
