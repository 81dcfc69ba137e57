"""The encoded video kind (``latecast.video``): mp4/mkv/webm files, encoded here by PyAV,
come out as the usual pipeline makes them (PyAV's rgb24 decode, torchvision v2's resize and
centre crop on float, Normalize), their frames picked from a seeded start; each bad file is
one BatchError naming the field and the clip."""

from __future__ import annotations

import io
import itertools
import re
import sys
from fractions import Fraction

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

import latecast
from latecast.errors import BatchError, ConfigError

av = pytest.importorskip("av")
v2 = pytest.importorskip("torchvision.transforms.v2")

MEAN, STD = (0.43216, 0.394666, 0.37645), (0.22803, 0.22145, 0.216989)
# (codec, container, pixel format, width, height, colorspace, colour range): H.264 and VP9,
# 8 and 10 bits (libx264, ffv1), odd sizes (VP9, ffv1: libx264 and libx265 take even ones
# only), BT.601 (unspecified) and BT.709, limited and full range
CODECS = {
    "h264": ("libx264", "mp4", "yuv420p", 64, 48, None, None),
    "h264-709-full": ("libx264", "mp4", "yuv420p", 64, 48, 1, 2),
    "h264-10bit-709": ("libx264", "mp4", "yuv420p10le", 64, 48, 1, None),
    "vp9-odd": ("libvpx-vp9", "webm", "yuv420p", 47, 33, None, None),
    "ffv1-10bit-odd": ("ffv1", "matroska", "yuv420p10le", 47, 33, None, None),
}


def picture(h: int, w: int, k: int) -> np.ndarray:
    """Frame ``k``: smooth colour gradients moving with ``k``, a little texture, and ``k``
    written in the brightness of a 12x12 block at the centre (which frame it is, decoded)."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    rgb = np.stack(
        [
            128 + 100 * np.sin((xx + 3 * k) / 7),
            128 + 90 * np.cos((yy - 2 * k) / 5),
            (xx * 3 + yy * 2 + 9 * k) % 256,
        ],
        -1,
    )
    rgb += np.random.default_rng(k).normal(0, 8, rgb.shape)
    rgb[h // 2 - 6 : h // 2 + 6, w // 2 - 6 : w // 2 + 6] = 10 + 20 * k
    return rgb.clip(0, 255).astype(np.uint8)


def encode(
    codec="libx264",
    container="mp4",
    pix="yuv420p",
    w=64,
    h=48,
    colorspace=None,
    colour_range=None,
    frames=10,
    pts=None,
    first=0,
    audio=False,
) -> bytes:
    """A video file made by PyAV: ``frames`` frames at 25 fps (``pts``: each frame's own, in
    1/1000 s; ``first``: the first frame's number); ``audio``: an Opus stream alone."""
    buf = io.BytesIO()
    with av.open(buf, "w", format=container) as out:
        if audio:
            s = out.add_stream("libopus", rate=48000)
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 960), np.int16), "s16", "mono")
            frame.sample_rate = 48000
            for p in [*s.encode(frame), *s.encode()]:
                out.mux(p)
            frames = 0
        else:
            s = out.add_stream(codec, rate=25)
            s.width, s.height, s.pix_fmt = w, h, pix
            if pts is not None:
                s.codec_context.time_base = Fraction(1, 1000)
        for key, value in (("colorspace", colorspace), ("color_range", colour_range)):
            if value is not None:
                setattr(s.codec_context, key, value)
        for k in range(frames):
            f = av.VideoFrame.from_ndarray(picture(h, w, k), format="rgb24")
            f = f.reformat(format=pix, dst_colorspace=colorspace, dst_color_range=colour_range)
            if pts is not None:
                f.pts, f.time_base = pts[k], Fraction(1, 1000)
            elif first:
                f.pts, f.time_base = first + k, Fraction(1, 25)
            for p in s.encode(f):
                out.mux(p)
        for p in s.encode() if frames else ():
            out.mux(p)
    return buf.getvalue()


def claimed(data: bytes, w: int, h: int) -> bytes:
    """A Matroska file of 64x48 frames whose header says ``w``x``h`` (PixelWidth and
    PixelHeight rewritten as 4-byte numbers, the sizes of the elements around them grown by
    the 6 bytes; FFV1 takes its frame size from the container)."""
    b = bytearray(data)
    at = b.find(b"\xb0\x81\x40\xba\x81\x30")  # PixelWidth 64, PixelHeight 48
    assert at > 0 and b[at - 2] == 0xE0  # the first children of Video
    b[at : at + 6] = b"\xb0\x84" + w.to_bytes(4, "big") + b"\xba\x84" + h.to_bytes(4, "big")
    b[at - 1] += 6  # Video's size
    segment, tracks = b.find(b"\x18\x53\x80\x67") + 4, b.rfind(b"\x16\x54\xae\x6b", 0, at) + 4
    entry = tracks + grown(b, tracks)
    entry += 6 * (b[entry] == 0xBF)  # a CRC-32 element first (FFmpeg checks none by default)
    for size in (segment, entry + 1):
        grown(b, size)
    return bytes(b)


def grown(b: bytearray, at: int) -> int:
    """The EBML size at ``at`` grown by 6 in place (an unknown size kept); its length."""
    n = 1 + next(k for k in range(8) if b[at] & (0x80 >> k))
    value = int.from_bytes(b[at : at + n], "big") & ((1 << 7 * n) - 1)
    if value != (1 << 7 * n) - 1:
        b[at : at + n] = (value + 6 | 1 << 7 * n).to_bytes(n, "big")
    return n


def resized_midway() -> bytes:
    """H.264 in MPEG-TS, 2 frames of 64x48 then 8 of 32x24: two encodings, one stream."""
    parts = [
        encode("libx264", "mpegts", w=64, h=48, frames=2),
        encode("libx264", "mpegts", w=32, h=24, frames=8, first=2),
    ]
    return b"".join(parts)


def usual(
    data: bytes, indices: list[int], size: int, accurate=False, resize=None, antialias=True
) -> torch.Tensor:
    """The usual pipeline's clip: PyAV's rgb24 frames (``accurate``: swscale's exact
    arithmetic and full chroma), then torchvision v2's Resize (``resize``, else the shorter
    side to ``size``) and CenterCrop on float, Normalize: ``(C, T, H, W)``."""
    how = av.video.reformatter.Interpolation
    flags = how.BILINEAR | how.ACCURATE_RND | how.FULL_CHR_H_INT if accurate else None
    with av.open(io.BytesIO(data)) as c:
        frames = [f.to_ndarray(format="rgb24", interpolation=flags) for f in c.decode(video=0)]
    x = torch.from_numpy(np.stack([frames[i] for i in indices])).permute(0, 3, 1, 2)
    ops = v2.Compose(
        [
            v2.ToDtype(torch.float32, scale=True),
            v2.Resize(resize or size, antialias=antialias),
            v2.CenterCrop(size),
            v2.Normalize(MEAN, STD),
        ]
    )
    return ops(x).permute(1, 0, 2, 3)


def grey_levels(x: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """|x - want| of normalized ``(N, C, ...)`` clips in grey levels (0..255 units)."""
    std = torch.tensor(STD).view(1, 3, *[1] * (x.ndim - 2))
    return (x - want).abs() * std * 255


def wrapped(files: list, **fields) -> latecast.wrap:
    """One batch of ``files``, field 0 declared ``latecast.video(**fields)``."""
    return latecast.wrap(
        [(files,)], device="cpu", mean=MEAN, std=STD, fields={0: latecast.video(**fields)}
    )


def clips(files: list, **fields) -> torch.Tensor:
    ((x,),) = list(wrapped(files, **fields))
    return x


@pytest.mark.parametrize("case", CODECS)
def test_clips_equal_the_usual_pipeline(case):
    """Measured (PyAV 18.1, FFmpeg 8; grey levels, mean/max): h264 1.27/3.0, h264-709-full
    0.81/2.6, vp9-odd 0.30/1.2, ffv1-10bit-odd 0.28/1.1, h264-10bit-709 2.03/3.8. What is left
    is swscale's own fixed-point error (its 10-bit rgb24 path makes Y=940 253, not 255):
    against its exact arithmetic h264-10bit-709 is 0.45/5.7."""
    codec, container, pix, w, h, space, rng = CODECS[case]
    if codec not in av.codecs_available:
        pytest.skip(f"this PyAV has no {codec} encoder")
    data = encode(codec, container, pix, w, h, space, rng)
    x = clips([data, data], frames=4, size=24, step=2, start="centre")
    assert x.shape == (2, 3, 4, 24, 24) and x.dtype == torch.float32
    deep = "10bit" in case  # held to swscale's exact arithmetic too, and its default near 2
    for accurate, bound in [(False, 2.5 if deep else 2)] + [(True, 2)] * deep:
        want = usual(data, [1, 3, 5, 7], 24, accurate)  # 10 frames, 7 spanned: from 1
        err = grey_levels(x, torch.stack([want, want]))
        assert err.mean() < bound, f"{case}: mean {err.mean():.2f}, max {err.max():.1f}"


def frame_numbers(x: torch.Tensor) -> list[list[int]]:
    """Which frames each clip ``(N, C, T, H, W)`` holds, read from the block at the centre."""
    std, mean = torch.tensor(STD).view(1, 3, 1), torch.tensor(MEAN).view(1, 3, 1)
    h, w = x.shape[-2:]
    block = x[..., h // 2 - 1 : h // 2 + 1, w // 2 - 1 : w // 2 + 1].flatten(3).mean(3)
    grey = (block * std + mean).mean(1) * 255  # (N, T)
    return ((grey - 10) / 20).round().long().tolist()


class Files(Dataset):
    def __init__(self, files):
        self.files = files

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        return self.files[i], i


def collate(items):
    return [f for f, _ in items], torch.tensor([i for _, i in items])


def test_random_starts_are_seeded_and_a_resumed_run_draws_the_same():
    tdl = pytest.importorskip("torchdata.stateful_dataloader")
    files = [encode(frames=12)] * 8

    def make(seed=0):
        dl = tdl.StatefulDataLoader(Files(files), batch_size=2, collate_fn=collate)
        return latecast.wrap(
            dl,
            device="cpu",
            mean=MEAN,
            std=STD,
            seed=seed,
            fields={0: latecast.video(4, size=16, step=2)},
        )

    unbroken = [frame_numbers(x) for x, _ in make()]
    starts = [clip[0] for batch in unbroken for clip in batch]
    assert all(clip == list(range(clip[0], clip[0] + 8, 2)) for b in unbroken for clip in b)
    assert len(set(starts)) > 1 and set(starts) <= set(range(6))  # 12 frames, 7 spanned
    assert [frame_numbers(x) for x, _ in make()] == unbroken
    assert [frame_numbers(x) for x, _ in make(seed=1)] != unbroken
    first = make()
    head = [frame_numbers(x) for x, _ in itertools.islice(first, 2)]
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    assert head + [frame_numbers(x) for x, _ in resumed] == unbroken
    evaluation = latecast.video(4, size=16, step=2).evaluated()  # PrepareOnDevice's, not training
    x = latecast.wrap([(files[:2],)], device="cpu", mean=MEAN, std=STD, fields={0: evaluation})
    assert frame_numbers(next(iter(x))[0]) == [[2, 4, 6, 8]] * 2  # the centre: 12 frames, 7 spanned


def test_paths_rows_and_augment_ntchw(tmp_path):
    """Paths and Hugging Face rows are read; under an Augment each clip gets one resized
    crop and flip for all its frames; NTCHW out."""
    path = tmp_path / "a.webm"
    path.write_bytes(encode("libvpx-vp9", "webm", w=47, h=33))
    row = {"bytes": encode(), "path": "b.mp4"}
    aug = latecast.Augment(resized_crop=0.5, flip=0.5, jitter=0.2)
    dl = latecast.wrap(
        [([str(path), row], 0)],
        device="cpu",
        mean=MEAN,
        std=STD,
        augment=aug,
        fields={0: latecast.video(3, size=(16, 20), out="NTCHW")},
    )
    (x, _), *_ = list(dl)
    assert x.shape == (2, 3, 3, 16, 20) and torch.isfinite(x).all()
    assert not torch.equal(x[:, 0], x[:, 1])  # the frames differ, each moved alike
    with pytest.raises(BatchError, match=r"position 0 in the batch \(.*gone\.mp4\): No such"):
        clips([str(tmp_path / "gone.mp4")])


def test_the_host_sends_yuv_planes_of_the_frames_taken():
    data = encode(frames=10)
    w = wrapped([data] * 3, frames=4, size=24)
    list(w)
    assert w.stats.image_bytes == 3 * 4 * (64 * 48 * 3 // 2)  # 1.5 bytes a pixel
    x = clips([encode(pix="yuv420p10le")], frames=2)  # uint16 planes, its own size
    assert x.shape == (1, 3, 2, 48, 64)


def cut(data: bytes) -> bytes:
    return data[: len(data) * 2 // 3]


BAD = {  # what, the file, the declaration's options, what the error says
    "no video file": (lambda: b"\x00" * 500, {}, "does not decode"),
    "cut short": (lambda: cut(encode("libx264", "matroska")), {}, "cut short, its frames end"),
    "too short": (lambda: encode(frames=3), {}, "3 frames, fewer than the 4"),
    "audio only": (lambda: encode(container="webm", audio=True), {}, "no video stream"),
    "variable rate": (
        lambda: encode(container="matroska", pts=[0, 40, 80, 200, 240, 400], frames=6),
        {},
        "variable frame rate",
    ),
    "size changes": (resized_midway, {}, "frame size changes mid-stream, 64x48 to 32x24"),
    "bomb": (
        lambda: claimed(encode("ffv1", "matroska"), 9000, 9000),
        {},
        "frames of 9000x9000, 4 of them past max_pixels=268435456",
    ),
    "bomb by the limit": (
        lambda: encode(w=640, h=480),
        {"max_pixels": 10**6},
        "decompression bomb",
    ),
}


@pytest.mark.parametrize("what", BAD)
def test_a_bad_file_is_one_error_naming_the_field_and_the_clip(what):
    make, options, says = BAD[what]
    good = encode(frames=6)
    with pytest.raises(BatchError, match=f"field 0: the clip at position 1 in the batch.*{says}"):
        clips([good, make()], frames=4, **options)


def test_clips_of_two_sizes_and_no_size_declared_are_one_error_asking_for_it():
    other = encode("libvpx-vp9", "webm", w=47, h=33, frames=6)
    with pytest.raises(BatchError, match=r"field 0: clips of 2 sizes \(33x47, 48x64.*video\("):
        clips([encode(frames=6), other], frames=4)


def test_resize_is_torchvisions_then_the_crop_is_the_clip_kinds():
    """``resize=`` is v2's Resize (an int the shorter side, or (H, W); antialias or not), then
    ``size`` cropped as ``latecast.clip`` crops: the centre without an Augment, under one a
    random box (clips of other sizes too, the first's the crop's own); a resize smaller than
    the crop is one BatchError naming the clip."""
    data = encode(frames=10)  # 64x48
    for resize, antialias in [(30, True), ((36, 40), False), ((36, 40), True)]:
        options = dict(start="centre", resize=resize, antialias=antialias)
        x = clips([data], frames=4, size=24, step=2, **options)
        for aa in (True, False):
            err = grey_levels(x, usual(data, [1, 3, 5, 7], 24, False, resize, aa)[None]).mean()
            assert (err < 2) == (aa == antialias), f"{resize}, antialias={aa}: {err:.2f}"
    square = encode(w=48, h=48)  # resized to 24x24, the crop's size; the other to 32x24
    video = latecast.video(4, size=24, resize=24, start="start")
    got = []
    for seed in range(4):
        options = dict(mean=MEAN, std=STD, seed=seed, fields={0: video})
        w = latecast.wrap([([square, data],)], device="cpu", augment=latecast.Augment(), **options)
        got.append(next(iter(w))[0])  # Augment(): RandomCrop alone
    assert all(torch.equal(g[0], got[0][0]) for g in got)
    assert len({g[1].sum().item() for g in got}) > 1  # the 24 of 32 columns, drawn
    with pytest.raises(BatchError, match=r"position 0 .* resized to 20x26 \(resize=20\)"):
        clips([data], frames=4, size=24, resize=20)


@pytest.mark.parametrize(
    "options, says",
    [
        ({"resize": 0}, "resize=...) must be an integer N"),
        ({"resize": (1, 2, 3)}, "resize=...) must be an integer N"),
        ({"resize": True}, "resize=...) must be an integer N"),
        ({"antialias": "no"}, "antialias=...)"),
    ],
)
def test_a_bad_resize_or_antialias_is_one_config_error(options, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        latecast.video(4, size=16, **options)


def test_pad_repeats_the_last_frame_of_a_short_clip():
    x = clips([encode(frames=3)], frames=5, size=16, start="start", pad=True)
    assert frame_numbers(x) == [[0, 1, 2, 2, 2]]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_clips_are_the_cpus_and_nvdec_decodes_the_frames_the_host_would():
    """The planes made RGB and resized on CUDA (float, rounded) equal the CPU's (torch's uint8
    kernel) within half a grey level on average; where TorchCodec decodes on CUDA (NVDEC, its
    own RGB), the files cross instead and come out within 2 grey levels of the planes."""
    from latecast.kinds.encoded import _decodes_on

    data = encode(frames=10)

    def run(device, nvdec):
        w = latecast.wrap(
            [([data, data],)],
            device=device,
            mean=MEAN,
            std=STD,
            fields={0: latecast.video(4, size=24, start="centre", nvdec=nvdec)},
        )
        ((x,),) = list(w)
        return x.cpu(), w.stats

    (cpu, _), (planes, stats) = run("cpu", False), run("cuda", False)
    assert stats.image_bytes == 2 * 4 * 64 * 48 * 3 // 2 and grey_levels(planes, cpu).mean() < 0.5
    if not _decodes_on("cuda"):
        pytest.skip("TorchCodec does not decode video on CUDA here (absent, or no FFmpeg)")
    files, stats = run("cuda", None)  # the default where NVDEC decodes
    assert stats.image_bytes == 2 * len(data) and stats.decoder == "torchcodec nvdec"
    assert grey_levels(files, planes).mean() < 2


def test_without_pyav_a_video_declaration_is_one_config_error_naming_the_extra(monkeypatch):
    """Where PyAV is not installed (None in sys.modules: its import fails, as it does there),
    the declaration says what to install, not a ModuleNotFoundError at the first batch."""
    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(
        ConfigError, match=r"^latecast.video .*PyAV: pip install 'latecast\[video\]'"
    ):
        latecast.video(4)


def test_the_same_clips_through_wrap_a_mover_and_the_lightning_hook_under_a_trainer():
    """The starts (drawn as each batch is sent) and the flips are the batch's draws on every
    way in: ``wrap``, a ``Mover`` called per batch and ``PrepareOnDevice`` under a real
    ``Trainer`` give the same clips."""
    from _helpers import hooked_fit
    from torch.utils.data import DataLoader

    data = encode(frames=12)
    batches = [([data, data, data],), ([data, data, data],)]
    fields = {0: latecast.video(4, size=24)}
    options = dict(mean=MEAN, std=STD, augment=latecast.Augment(flip=0.5), seed=3, fields=fields)
    want = [x for (x,) in latecast.wrap(batches, device="cpu", **options)]
    mover = latecast.Mover(device="cpu", **options)
    loader = DataLoader(batches, batch_size=None)  # each batch as it is
    seen = hooked_fit(loader, trainer=dict(max_steps=2), **options).trained
    assert len(seen) == len(want) == 2 and not torch.equal(want[0], want[1])  # drawn per batch
    for x, (moved,), (hooked,) in zip(want, map(mover, batches), seen):
        assert torch.equal(x, moved) and torch.equal(x, hooked)
