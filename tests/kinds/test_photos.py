"""Photos from anywhere (issue 16): the decoder chosen once (TorchCodec, else torchvision),
EXIF orientation applied the same way on every path (decoders, ``latecast convert``, stores)."""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from _helpers import damage_scan, lightning_hook, smooth
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageOps

from latecast.kinds import decode
from latecast.kinds.decode import Encoded
from latecast.kinds.jpegheader import jpeg_header, jpeg_headers
from latecast.loader import Loader
from latecast.storage.convert import convert_folder
from latecast.storage.store import open_store


def jpeg(pixels: np.ndarray, orientation: int = 1, fmt: str = "JPEG") -> bytes:
    buf, exif = io.BytesIO(), Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(pixels).save(buf, fmt, quality=90, exif=exif.tobytes())
    return buf.getvalue()


def upright(data: bytes, mode: str = "RGB") -> torch.Tensor:
    """Pillow's reading, EXIF orientation applied: (C, H, W) uint8, the reference."""
    a = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert(mode))
    return torch.from_numpy(a.reshape(*a.shape[:2], -1).copy()).permute(2, 0, 1)


def as_uint8(images: torch.Tensor) -> torch.Tensor:
    """wrap's output without mean/std (ToTensor's x / 255) as the uint8 pixels again."""
    return images.mul(255).round().to(torch.uint8)


def test_each_exif_orientation_decodes_as_pillow_shows_it(decoder):
    """Orientations 1-8 of a 24x40 photo: the pixels Pillow's exif_transpose shows, exactly
    (the same libjpeg underneath), one file at a time and as a CPU batch at its own size
    (each image decoded into its slot), and the header read gives the upright size."""
    files = [jpeg(smooth(24, 40, o), o) for o in range(1, 9)]
    for o, f in enumerate(files, 1):
        got = decode.read([torch.frombuffer(bytearray(f), dtype=torch.uint8)], 3, "cpu")[0]
        ref = upright(f)
        assert torch.equal(got, ref), (decoder, o)
        assert jpeg_header(f) == (*ref.shape[1:], 3, o)
    for size in [(24, 40), (40, 24)]:  # upright as stored (1-4), turned (5-8)
        some = [f for f in files if jpeg_header(f)[:2] == size]
        sizes = torch.tensor([size] * len(some))
        offsets = np.cumsum([0] + list(map(len, some))).tolist()
        data = torch.frombuffer(bytearray(b"".join(some)), dtype=torch.uint8)
        batch = Encoded(data, offsets, sizes, torch.arange(4), 3, torch.device("cpu"))
        got = decode.decode(batch, size)  # (4, H, W, 3)
        assert torch.equal(got, torch.stack([upright(f).permute(1, 2, 0) for f in some]))


def test_the_header_reader_refuses_what_is_not_a_jpeg():
    png = jpeg(smooth(8, 8, 0), fmt="PNG")
    assert jpeg_header(png) is None and jpeg_header(b"\xff\xd8") is None
    assert jpeg_header(jpeg(smooth(8, 8, 0))[:20]) is None  # cut before the frame


def _frame_at(f: bytes) -> int:
    return f.index(b"\xff\xc0")  # Pillow writes a baseline frame (SOF0)


def _pool() -> list[bytes]:
    """Files that share a start up to their frame header and files that do not: one
    encoder's at other sizes, turned (an EXIF block), grey, another quality (other tables),
    a fill byte before the frame, cut around the frame's fields, a PNG."""
    one = [jpeg(smooth(h, w, h + w)) for h, w in [(32, 32), (32, 48), (48, 32)]]
    turned = [jpeg(smooth(24, 40, o), o) for o in (1, 6, 8)]
    grey = [jpeg(smooth(32, 32, 5, channels=1))]
    buf = io.BytesIO()
    Image.fromarray(smooth(32, 32, 0)).save(buf, "JPEG", quality=50)
    f, at = one[0], _frame_at(one[0])
    filled = f[:at] + b"\xff" + f[at:]
    cut = [f[: at + k] for k in (9, 10, 11)]
    return one + turned + grey + [buf.getvalue(), filled, *cut, jpeg(smooth(8, 8, 0), fmt="PNG")]


POOL = _pool()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(range(len(POOL))), st.booleans()), max_size=10))
def test_a_batch_s_headers_read_at_the_last_frame_s_place_are_each_file_s_own(picks):
    """``jpeg_headers`` reads a file that starts as the last one walked at that one's frame
    header, unwalked: the answers are ``jpeg_header``'s for any mix, bytes or arrays."""
    files = [POOL[k] if as_bytes else np.frombuffer(POOL[k], np.uint8) for k, as_bytes in picks]
    assert jpeg_headers(files) == [jpeg_header(f) for f in files]


def test_the_pool_of_headers_covers_the_cases():
    """The pool above holds what ``jpeg_headers`` must tell apart: files of one start at
    other sizes (read unwalked), a cut file long enough for the frame's fields (10 bytes
    past its marker) and one that is not, turned files (another start)."""
    heads = [jpeg_header(f) for f in POOL]
    assert heads[:3] == [(32, 32, 3, 1), (32, 48, 3, 1), (48, 32, 3, 1)]
    assert heads[4:7] == [(40, 24, 3, 6), (40, 24, 3, 8), (32, 32, 1, 1)]
    assert heads[9] is None and heads[10] == heads[11] == (32, 32, 3, 1) and heads[-1] is None
    assert POOL[1][: _frame_at(POOL[1])] == POOL[0][: _frame_at(POOL[0])]


def test_the_decoder_is_chosen_once_and_a_bad_choice_is_one_error(monkeypatch):
    decode.decoder.cache_clear()
    try:
        monkeypatch.setenv("LATECAST_DECODER", "pillow")
        with pytest.raises(decode.ConfigError, match="LATECAST_DECODER='pillow'"):
            decode.decoder()
        monkeypatch.delenv("LATECAST_DECODER")
        decode.decoder.cache_clear()
        name = decode.decoder()
        monkeypatch.setenv("LATECAST_DECODER", "torchvision")  # read at the first call only
        assert decode.decoder() == name and name.split()[0] in decode.DECODERS
    finally:
        decode.decoder.cache_clear()


@pytest.mark.parametrize("encoding", ["raw", "jpeg"])
def test_convert_and_the_store_show_rotated_files_upright(tmp_path, decoder, encoding):
    """Files stored 24x40 with orientation 6 or 8 beside upright 40x24 ones: every image is
    40x24 in the store (raw: Pillow's pixels; jpeg: the files kept, turned by the decoder),
    and the loader's batches are Pillow's upright pixels exactly."""
    files = {}
    for i in range(6):
        o = (1, 6, 8)[i % 3]
        pixels = smooth(40, 24, i) if o == 1 else smooth(24, 40, i)
        files[f"{'ab'[i % 2]}/{i}.jpg"] = jpeg(pixels, o)
    for name, data in files.items():
        (tmp_path / "in" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "in" / name).write_bytes(data)
    out, _ = convert_folder(
        tmp_path / "in", tmp_path / encoding, encoding=encoding, test_fraction=0, workers=1
    )
    ds = open_store(out)
    assert ds.image_shape == (40, 24, 3)
    loader = Loader(ds, 3, device="cpu", shuffle=False, pad=False)
    got = torch.cat([x for x, _ in loader]) * torch.tensor(ds.std)[:, None, None]
    got = (got + torch.tensor(ds.mean)[:, None, None]).mul(255).round().to(torch.uint8)
    refs = {tuple(upright(d).flatten().tolist()): n for n, d in files.items()}
    seen = {refs.get(tuple(im.flatten().tolist())) for im in got}
    assert seen == set(files), (decoder, encoding)
    assert loader.stats.decoder == (decode.cpu_decoder() if encoding == "jpeg" else "")


def test_a_store_from_before_exif_turns_is_refused_naming_the_sample(decoder):
    """A jpeg store written when convert ignored EXIF recorded a turned file's size as its
    pixels lie (24x40); decoded upright (40x24) it no longer fits its crop box: one error."""
    from latecast.kinds.jpegfiles import EncodedDataset

    files = [jpeg(smooth(24, 40, 0)), jpeg(smooth(24, 40, 1), 6)]
    ds = EncodedDataset(
        name="old", split="train", data=np.frombuffer(b"".join(files), np.uint8),
        offsets=np.cumsum([0] + [len(f) for f in files]), sizes=np.array([(24, 40)] * 2),
        labels=np.zeros(2, np.uint8), classes=("a",), mean=(0.5,) * 3, std=(0.2,) * 3,
        channels=3, size=(24, 40),
    )  # fmt: skip
    with pytest.raises(
        decode.FormatError, match=r"sample 1: the file is 40x24, sizes.npy says 24x40"
    ):
        list(Loader(ds, 2, device="cpu", shuffle=False))


# ---- JPEG fields in wrap ---------------------------------------------------------------------

MEAN, STD = (0.45, 0.5, 0.4), (0.25, 0.2, 0.3)
SHAPES = [(40, 56, 1), (32, 32, 6), (61, 23, 1), (30, 50, 8), (48, 48, 3), (33, 47, 1)]


@pytest.fixture(scope="module")
def mixed_files() -> list[bytes]:
    """Photos of several sizes, two of them stored turned (EXIF 6 and 8) and one upside down."""
    return [jpeg(smooth(h, w, i), o) for i, (h, w, o) in enumerate(SHAPES)]


def store_of(files: list[bytes], size, channels=3):
    """The JPEG store ``latecast convert`` would write of these files (upright sizes)."""
    from latecast.kinds.jpegfiles import EncodedDataset

    sizes = [tuple(upright(f).shape[1:]) for f in files]
    return EncodedDataset(
        name="same", split="train", data=np.frombuffer(b"".join(files), np.uint8),
        offsets=np.cumsum([0] + [len(f) for f in files]), sizes=np.array(sizes),
        labels=np.arange(len(files), dtype=np.uint8) % 3, classes=("a", "b", "c"),
        mean=MEAN[:channels], std=STD[:channels], channels=channels, size=size,
    )  # fmt: skip


@pytest.mark.parametrize("augment", [None, "train"])
def test_wrap_and_a_store_give_the_same_pixels_for_the_same_files(decoder, mixed_files, augment):
    """The same files, seed and batch number, so the same crop boxes: a JPEG field through
    ``wrap`` equals a JPEG store's batch bitwise (train: RandomResizedCrop + flip + jitter;
    eval: resize to cover + centre crop), EXIF-turned files included, on either decoder."""
    import latecast

    aug = augment and latecast.Augment(resized_crop=0.25, flip=0.5, jitter=0.3)
    ds = store_of(mixed_files, (24, 28))
    loader = Loader(ds, 3, device="cpu", augment=aug, seed=5, shuffle=False, pad=False)
    labels = torch.arange(len(mixed_files)) % 3
    batches = [(mixed_files[k : k + 3], labels[k : k + 3]) for k in (0, 3)]
    jpg = latecast.jpeg(size=(24, 28))
    wrapped = latecast.wrap(batches, mean=MEAN, std=STD, device="cpu", augment=aug, seed=5,
                            fields={0: jpg})  # fmt: skip
    for (a, ya), (b, yb) in zip(loader, wrapped, strict=True):
        assert a.shape == (3, 3, 24, 28) and torch.equal(a, b) and torch.equal(ya, yb)
    s = wrapped.stats
    assert s.image_bytes == sum(map(len, mixed_files)) and s.decoder == decode.cpu_decoder()
    assert s.decoded_bytes == 6 * 24 * 28 * 3 and s.usual_bytes == 4 * s.decoded_bytes + 6 * 8


def test_every_form_of_a_jpeg_field_comes_out_alike(mixed_files):
    """bytes, a tuple, 1-D uint8 tensors and arrays, Hugging Face dicts, a numpy object
    array: the same images; undeclared (recognised by the signature) at their one size."""
    import latecast

    files = [jpeg(smooth(20, 30, i)) for i in range(4)]
    forms = [
        files,
        tuple(files),
        [torch.frombuffer(bytearray(f), dtype=torch.uint8) for f in files],
        [np.frombuffer(f, np.uint8) for f in files],
        [{"bytes": f, "path": f"{i}.jpg"} for i, f in enumerate(files)],
        np.array(files + [b""], dtype=object)[:4],
    ]
    outs = [next(iter(latecast.wrap([{"jpg": x, "n": 7}], device="cpu")))["jpg"] for x in forms]
    ref = torch.stack([upright(f) for f in files])
    assert outs[0].shape == (4, 3, 20, 30) and torch.equal(as_uint8(outs[0]), ref)
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_hugging_face_rows_of_files_on_disk_are_read_from_their_path(tmp_path):
    """``Image(decode=False)`` of files on disk gives ``{"bytes": None, "path": p}``: they were
    passed on as a list of dicts without a word (refused when declared). Read from ``p``, as
    ``datasets`` reads them; a path that does not read is one error naming it."""
    import datasets
    from torch.utils.data import DataLoader

    import latecast
    from latecast.errors import BatchError

    files = [jpeg(smooth(20, 30, i)) for i in range(4)]
    for i, f in enumerate(files):
        (tmp_path / f"{i}.jpg").write_bytes(f)
    paths = [str(tmp_path / f"{i}.jpg") for i in range(4)]
    ds = datasets.Dataset.from_dict({"image": paths, "label": [0, 1, 2, 3]})
    ds = ds.cast_column("image", datasets.Image(decode=False))
    assert ds[0]["image"] == {"bytes": None, "path": paths[0]}

    def rows(batch):  # the batch as it is, as examples/hf_photos.py collates it
        return [r["image"] for r in batch], torch.tensor([r["label"] for r in batch])

    ref = torch.stack([upright(f) for f in files])
    for fields in (None, {0: latecast.jpeg()}):
        dl = DataLoader(ds, batch_size=4, collate_fn=rows)
        images, labels = next(iter(latecast.wrap(dl, device="cpu", fields=fields)))
        assert torch.equal(as_uint8(images), ref) and labels.tolist() == [0, 1, 2, 3]
    gone = [{"bytes": None, "path": p} for p in paths[:2] + [str(tmp_path / "gone.jpg")]]
    for fields in (None, {0: latecast.jpeg()}):
        with pytest.raises(
            BatchError, match=r"field 0: the file at position 2 .* path '.*/gone.jpg' does not read"
        ):
            next(iter(latecast.wrap([(gone,)], device="cpu", fields=fields)))


def test_rows_of_files_on_disk_are_each_read_once_a_batch(tmp_path):
    """An undeclared field of ``{"bytes": None, "path": p}`` rows: recognised as JPEG by its
    first file, then every file read once (they were read twice a batch: the recognising read
    all of them, and the plan again), as Python's ``open`` audit events count them."""
    import sys

    import latecast

    paths = [tmp_path / f"{i}.jpg" for i in range(4)]
    for i, p in enumerate(paths):
        p.write_bytes(jpeg(smooth(20, 30, i)))
    opened: list[str] = []
    here = str(tmp_path)
    sys.addaudithook(  # for good (hooks cannot be removed): it counts only this test's files
        lambda event, args: (
            opened.append(str(args[0]))
            if event == "open" and str(args[0]).startswith(here)
            else None
        )
    )
    rows = [{"bytes": None, "path": str(p)} for p in paths]
    images, _ = next(iter(latecast.wrap([(rows, torch.arange(4))], device="cpu")))
    assert images.shape == (4, 3, 20, 30)
    assert sorted(opened) == sorted([str(paths[0])] + [str(p) for p in paths])  # the first twice


def test_files_of_mixed_sizes_need_a_declared_size(mixed_files):
    import latecast
    from latecast.errors import BatchError

    with pytest.raises(BatchError, match=r"field 'jpg': JPEG files of 6 sizes .*latecast.jpeg\("):
        next(iter(latecast.wrap([{"jpg": mixed_files}], device="cpu")))


def test_grey_and_colour_files_come_out_with_the_channels_asked_for():
    import latecast

    files = [jpeg(smooth(16, 16, 0, channels=1)), jpeg(smooth(16, 16, 1))]
    grey = [jpeg(smooth(16, 16, 2, channels=1))] * 2
    for batch, fields, channels, mode in [
        (files, None, 3, "RGB"),  # undeclared: colour wins
        (files, {0: latecast.jpeg(channels=1)}, 1, "L"),
        (grey, None, 1, "L"),  # every file grey
    ]:
        out = next(iter(latecast.wrap([(batch,)], device="cpu", fields=fields)))[0]
        ref = torch.stack([upright(f, mode) for f in batch])
        assert out.shape == (2, channels, 16, 16) and torch.equal(as_uint8(out), ref), mode


def test_grey_files_beside_3_mean_std_values_come_out_rgb_as_imagefolder_gives_them():
    """A batch whose files are all grey, with 3 mean/std values (ImageNet's): refused before
    ("1 channels but 3 mean/std values"); undeclared, the files now decode to 3 channels, as
    ImageFolder's ``convert("RGB")`` gives them, normalized per channel."""
    import latecast

    grey = [jpeg(smooth(16, 16, 2, channels=1)), jpeg(smooth(16, 16, 3, channels=1))]
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    for fields in (None, {0: latecast.jpeg()}):
        out = next(iter(latecast.wrap([(grey,)], device="cpu", mean=mean, std=std, fields=fields)))
        ref = torch.stack([upright(f, "RGB") for f in grey]).float() / 255
        want = (ref - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
        assert out[0].shape == (2, 3, 16, 16)
        torch.testing.assert_close(out[0], want, atol=1e-5, rtol=0)
    one = latecast.wrap([(grey,)], device="cpu", mean=(0.5,), std=(0.25,))
    assert next(iter(one))[0].shape == (2, 1, 16, 16)  # one value: grey stays grey
    with pytest.raises(latecast.errors.BatchError, match="1 channels but 3 mean/std"):
        next(iter(latecast.wrap([(grey,)], device="cpu", mean=mean, std=std,
                                fields={0: latecast.jpeg(channels=1)})))  # fmt: skip


def test_a_file_that_is_no_jpeg_is_decoded_on_the_host_and_said_once(recwarn):
    """A PNG among JPEGs: decoded on the host (one warning for the field, not per batch),
    the same pixels as Pillow's."""
    import latecast

    png = jpeg(smooth(16, 16, 3), fmt="PNG")
    files = [jpeg(smooth(16, 16, 0)), png, jpeg(smooth(16, 16, 1))]
    out = [b["x"] for b in latecast.wrap([{"x": files}] * 3, device="cpu")]
    said = [w for w in recwarn.list if "is decoded on the host" in str(w.message)]
    assert len(said) == 1 and "field 'x'" in str(said[0].message)
    assert torch.equal(as_uint8(out[2][1]), upright(png)) and torch.equal(out[0], out[2])


@pytest.mark.filterwarnings("ignore:.*decoded on the host")
def test_a_file_decoded_on_the_host_fills_its_slot_under_every_cpu_decoder(decoder):
    """A PNG among JPEGs, every file at the training size and uncropped (each decoded file
    only copied into its slot): the PNG's slot holds Pillow's pixels, the others each
    decoder's, under each CPU decoder."""
    import latecast

    files = [jpeg(smooth(16, 16, 0)), jpeg(smooth(16, 16, 1), fmt="PNG"), jpeg(smooth(16, 16, 2))]
    out = next(iter(latecast.wrap([{"slots": files}], device="cpu")))["slots"]  # said per name
    jpegs = decode.read(
        [torch.frombuffer(bytearray(f), dtype=torch.uint8) for f in files[::2]], 3, "cpu"
    )
    want = torch.stack([jpegs[0], upright(files[1]), jpegs[1]])
    assert torch.equal(as_uint8(out), want)


def test_a_corrupt_file_is_one_error_naming_the_field_and_the_position():
    import latecast
    from latecast.errors import BatchError

    good = [jpeg(smooth(16, 16, i)) for i in range(4)]
    cut, junk = good[:2] + [good[2][: len(good[2]) // 2], good[3]], good[:3] + [b"\xff\xd8junk"]
    with pytest.raises(BatchError, match=r"field 'img': the file at position 2 in the batch"):
        next(iter(latecast.wrap([{"img": cut}], device="cpu")))
    with pytest.raises(BatchError, match=r"field 'img': the file at position 3 in the batch"):
        next(iter(latecast.wrap([{"img": junk}], device="cpu")))


def test_a_damaged_file_of_a_field_is_named_by_the_field_and_its_position(decoder):
    """libjpeg's warning about a wrap field's file names it as its errors do (the field and
    the position in the batch), under each CPU decoder."""
    import latecast

    files = [jpeg(smooth(64, 64, i)) for i in range(3)]
    files[1] = damage_scan(files[1])
    said = r"field 'img': the file at position 1 in the batch: damaged JPEG data"
    with pytest.warns(UserWarning, match=said):
        next(iter(latecast.wrap([{"img": files}], device="cpu")))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_wrap_equals_the_store_and_turned_files_are_upright(mixed_files):
    """nvJPEG on the device: a JPEG field through wrap equals the store's batch bitwise (same
    files, same boxes), and the EXIF-turned files come out as Pillow shows them upright
    (nvJPEG's IDCT is not libjpeg's: mean error under a grey level)."""
    import latecast

    ds = store_of(mixed_files, (24, 28))
    aug = latecast.Augment(resized_crop=0.25, flip=0.5)
    loader = Loader(ds, 6, device="cuda", augment=aug, seed=5, shuffle=False, pad=False)
    batches = [(mixed_files, torch.arange(6) % 3)]
    wrapped = latecast.wrap(batches, mean=MEAN, std=STD, device="cuda", augment=aug, seed=5,
                            fields={0: latecast.jpeg(size=(24, 28))})  # fmt: skip
    (a, _), (b, _) = next(iter(loader)), next(iter(wrapped))
    assert a.device.type == "cuda" and torch.equal(a, b)
    files = [torch.frombuffer(bytearray(f), dtype=torch.uint8) for f in mixed_files]
    for f, got in zip(mixed_files, decode.read(files, 3, torch.device("cuda"))):
        ref = upright(f)
        assert got.shape == ref.shape, (decode.decoder(), got.shape, ref.shape)
        assert (got.cpu().int() - ref.int()).abs().float().mean() < 1.0


def test_jpeg_files_through_the_lightning_hook_declared_or_recognised_as_through_wrap():
    """Lightning's hook (``PrepareOnDevice``) plans as ``wrap`` does: JPEG files declared, or
    undeclared and recognised by their signature, are decoded on the device alike."""
    import latecast

    batch = {"jpg": [jpeg(smooth(16, 16, k)) for k in range(3)], "y": torch.tensor([1, 0, 2])}
    want = next(iter(latecast.wrap([batch], device="cpu")))
    for options in ({"fields": {"jpg": latecast.jpeg(16)}}, {}):  # declared, and recognised
        got = lightning_hook(batch, (0, 0, 0), **options)
        assert got["jpg"].shape == (3, 3, 16, 16) and torch.equal(got["jpg"], want["jpg"])


def test_a_bad_decoder_setting_is_that_one_error_not_an_unreadable_file(
    tmp_path, run_cli, monkeypatch
):
    """``LATECAST_DECODER=bogus``: convert skipped every JPEG as unreadable (``--skip-bad``,
    exit 0, a store of the PNGs only) or blamed the first JPEG; wrap said so at the batch."""
    import latecast

    for i in range(4):
        path = tmp_path / "in" / "ab"[i % 2] / (f"{i}.jpg" if i < 2 else f"{i}.png")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(jpeg(smooth(8, 8, i), fmt="JPEG" if i < 2 else "PNG"))
    monkeypatch.setenv("LATECAST_DECODER", "bogus")
    decode.decoder.cache_clear()
    try:
        for skip in ([], ["--skip-bad"]):
            args = ["convert", tmp_path / "in", tmp_path / "out", "--test-fraction", "0", *skip]
            proc = run_cli(*args, "--workers", "1")
            assert proc.rc == 1 and proc.err == (
                "latecast: error: LATECAST_DECODER='bogus': give one of torchcodec, torchvision\n"
            )
            assert not (tmp_path / "out").exists()
        with pytest.raises(decode.ConfigError, match="LATECAST_DECODER='bogus'"):
            latecast.wrap([], fields={0: latecast.jpeg(8)})  # when made, not at a batch
    finally:
        decode.decoder.cache_clear()


def test_jpeg_folder_is_image_folder_with_the_files_left_encoded(tmp_path):
    """``latecast.jpeg_folder``: ImageFolder's classes, samples and targets, each sample the
    file's bytes; through a DataLoader with a worker and ``wrap``, every image comes out as
    Pillow shows it (upright; a PNG among them decoded on the host); a missing folder is one
    error naming it."""
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    import latecast

    for i, (cls, o) in enumerate([("cat", 1), ("cat", 6), ("dog", 3), ("dog", 1), ("emu", 1)]):
        (tmp_path / cls).mkdir(exist_ok=True)
        pixels = smooth(20, 20, i)
        (tmp_path / cls / f"{i}.jpg").write_bytes(jpeg(pixels, o))
    (tmp_path / "emu" / "5.png").write_bytes(jpeg(smooth(20, 20, 5), fmt="PNG"))
    folder, ref = latecast.jpeg_folder(tmp_path), ImageFolder(str(tmp_path))
    assert (folder.classes, folder.class_to_idx) == (ref.classes, ref.class_to_idx)
    assert folder.samples == ref.samples and folder.targets == ref.targets
    assert folder[1] == ((tmp_path / "cat" / "1.jpg").read_bytes(), 0)
    dl = DataLoader(folder, 4, num_workers=1)
    with pytest.warns(UserWarning, match="no JPEG .* decoded on the host"):
        images, labels = zip(*latecast.wrap(dl, device="cpu"))
    assert torch.cat(labels).tolist() == ref.targets
    want = [upright(Path(path).read_bytes()) for path, _ in ref.samples]
    assert torch.equal(as_uint8(torch.cat(images)), torch.stack(want))
    order = [5, 0, 1, 2, 3, 4]  # the PNG first in its batch: still a JPEG field (was passed on)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the PNG, said above
        images, _ = zip(*latecast.wrap(DataLoader(folder, 2, sampler=order), device="cpu"))
    assert torch.equal(as_uint8(torch.cat(images)), torch.stack([want[i] for i in order]))
    # the README's way: workers forked once for every epoch; each file once an epoch
    dl = DataLoader(folder, 2, shuffle=True, num_workers=1, persistent_workers=True)
    wrapped, key = latecast.wrap(dl, device="cpu"), lambda im: im.flatten().tolist()
    for epoch in range(2):
        wrapped.set_epoch(epoch)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the PNG, said above
            images, labels = zip(*wrapped)
        assert sorted(torch.cat(labels).tolist()) == sorted(ref.targets)
        assert sorted(map(key, as_uint8(torch.cat(images)))) == sorted(map(key, want))
    with pytest.raises(latecast.LatecastError, match="nowhere: no such folder"):
        latecast.jpeg_folder(tmp_path / "nowhere")
    (tmp_path / "cat" / "empty").mkdir()  # no class folders with images in it
    with pytest.raises(latecast.LatecastError, match="empty: class folders missing"):
        latecast.jpeg_folder(tmp_path / "cat" / "empty")


def test_cmyk_files_on_a_cpu_device_come_out_as_torchcodec_decodes_them():
    """simplejpeg converts CMYK to RGB its own way (1-2 grey levels from TorchCodec's), so
    a CPU batch leaves 4-channel files to TorchCodec: the same pixels on every path."""
    tc = pytest.importorskip("torchcodec.decoders")
    assert decode.cpu_decoder().startswith("simplejpeg")
    buf = io.BytesIO()
    Image.fromarray(smooth(24, 40, 0)).convert("CMYK").save(buf, "JPEG", subsampling=0)
    files = [buf.getvalue(), jpeg(smooth(24, 40, 1))]
    offsets = np.cumsum([0] + list(map(len, files))).tolist()
    data = torch.frombuffer(bytearray(b"".join(files)), dtype=torch.uint8)
    cpu = torch.device("cpu")
    batch = Encoded(data, offsets, torch.tensor([[24, 40]] * 2), torch.arange(2), 3, cpu)
    want = [tc.decode_jpeg(torch.frombuffer(bytearray(f), dtype=torch.uint8)) for f in files]
    assert torch.equal(decode.decode(batch, (24, 40)), torch.stack(want).permute(0, 2, 3, 1))
