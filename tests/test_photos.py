"""Photos from anywhere (issue 16): the decoder chosen once (TorchCodec, else torchvision),
EXIF orientation applied the same way on every path (decoders, ``latecast convert``, stores)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from latecast import decode
from latecast.loader import Loader
from latecast.storage.convert import convert_folder
from latecast.storage.store import open_store


@pytest.fixture(params=["torchcodec", "torchvision"])
def decoder(request, monkeypatch):
    """Each test once per decoder: TorchCodec's, and torchvision's fallback (the one the GPU
    machine, without TorchCodec, runs)."""
    if request.param == "torchcodec":
        pytest.importorskip("torchcodec")
    monkeypatch.setenv("LATECAST_DECODER", request.param)
    decode.decoder.cache_clear()
    assert decode.decoder().startswith(request.param)
    yield request.param
    decode.decoder.cache_clear()


def smooth(h: int, w: int, seed: int, grey: bool = False) -> np.ndarray:
    """A photo-like image JPEG keeps well: a coloured gradient with a bright corner block."""
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:h, 0:w]
    img = np.stack([40 + 160 * (xs * rng.uniform() + ys * rng.uniform()) / (h + w)] * 3, -1)
    img = img * rng.uniform(0.6, 1, 3)
    img[: h // 3, : w // 4] = 240
    img = img.clip(0, 255).astype(np.uint8)
    return img[..., 0] if grey else img


def jpeg(pixels: np.ndarray, orientation: int = 1, fmt: str = "JPEG") -> bytes:
    buf, exif = io.BytesIO(), Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(pixels).save(buf, fmt, quality=90, exif=exif.tobytes())
    return buf.getvalue()


def upright(data: bytes, mode: str = "RGB") -> torch.Tensor:
    """Pillow's reading, EXIF orientation applied: (C, H, W) uint8, the reference."""
    a = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert(mode))
    return torch.from_numpy(a.reshape(*a.shape[:2], -1).copy()).permute(2, 0, 1)


def test_each_exif_orientation_decodes_as_pillow_shows_it(decoder):
    """Orientations 1-8 of a 24x40 photo: the pixels Pillow's exif_transpose shows, exactly
    (the same libjpeg underneath), and the header read gives the upright size."""
    for o in range(1, 9):
        f = jpeg(smooth(24, 40, o), o)
        got = decode.read([torch.frombuffer(bytearray(f), dtype=torch.uint8)], 3, "cpu")[0]
        ref = upright(f)
        assert torch.equal(got, ref), (decoder, o)
        assert decode.jpeg_header(f) == (*ref.shape[1:], 3, o)


def test_the_header_reader_refuses_what_is_not_a_jpeg():
    png = jpeg(smooth(8, 8, 0), fmt="PNG")
    assert decode.jpeg_header(png) is None and decode.jpeg_header(b"\xff\xd8") is None
    assert decode.jpeg_header(jpeg(smooth(8, 8, 0))[:20]) is None  # cut before the frame


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
    assert loader.stats.decoder == (decode.decoder() if encoding == "jpeg" else "")


def test_a_store_from_before_exif_turns_is_refused_naming_the_sample(decoder):
    """A jpeg store written when convert ignored EXIF recorded a turned file's size as its
    pixels lie (24x40); decoded upright (40x24) it no longer fits its crop box: one error."""
    from latecast.data import EncodedDataset

    files = [jpeg(smooth(24, 40, 0)), jpeg(smooth(24, 40, 1), 6)]
    ds = EncodedDataset(
        name="old", split="train", data=np.frombuffer(b"".join(files), np.uint8),
        offsets=np.cumsum([0] + [len(f) for f in files]), sizes=np.array([(24, 40)] * 2),
        labels=np.zeros(2, np.uint8), classes=("a",), mean=(0.5,) * 3, std=(0.2,) * 3,
        channels=3, size=(24, 40),
    )  # fmt: skip
    with pytest.raises(decode.FormatError, match=r"sample 1: decodes to \(40, 24\), stored as"):
        list(Loader(ds, 2, device="cpu", shuffle=False))
