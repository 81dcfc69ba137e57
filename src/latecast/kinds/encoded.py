"""The encoded video kind: a field of mp4/mkv/webm files (``bytes``, 1-D uint8 arrays or
tensors, Hugging Face ``{"bytes": ...}`` dicts, or paths), declared ``fields={"video":
latecast.video(16, size=112)}``. Each clip's ``frames`` are picked from a start drawn on the
host from the batch's seeded generator (``Planning``: the same seed, the same frames, a
resumed run's too), then, on a CUDA device where TorchCodec imports, its file crosses and
NVDEC decodes it there (``VideoFiles``); else the host decodes those frames with PyAV to their
YUV 4:2:0 planes and stops (no colour conversion, no resize): the planes cross, 1.5 bytes a
pixel against RGB's 3 (``VideoPlanes``). On the device: YUV to RGB by the stream's own matrix
and range; resized to ``resize`` and cropped to ``size`` as the clip kind crops (random under
an ``Augment``, else the centre: ``video.crop_clip``), or without ``resize`` the clip's one
resized crop (else its shorter side resized to ``size`` and its centre cropped); then the clip
kind's flip, jitter and normalize (``video.finished``).
"""

from __future__ import annotations

import functools
import io
import math
import numbers
import os
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from ..errors import BatchError, ConfigError, check, numbers_of, refuse
from ..fields import Context, Field, Name, Planning, check_channels, one_size
from ..threads import count, pool
from ..transforms import crop_into
from .jpeg import files_of
from .video import OUTS, check_options, crop_clip, finished

STARTS = ("random", "start", "centre")
MAX_PIXELS = 2**28  # frames x height x width of one clip (16 frames of 4K: 2**27)
BT601 = (0.299, 0.114)  # (Kr, Kb); swscale's for an unspecified matrix
MATRICES = {1: (0.2126, 0.0722), 4: (0.30, 0.11), 7: (0.212, 0.087), 9: (0.2627, 0.0593)}
FULL_RANGE = 2  # AVCOL_RANGE_JPEG (yuvj formats too)
LEFT_SITED = ("h264", "hevc")  # FFmpeg sites their 4:2:0 chroma left unless the stream says
YUV420 = {"yuv420p": 8, "yuvj420p": 8, "yuv420p10le": 10, "yuv420p12le": 12}  # -> bits


@dataclass(frozen=True)
class VideoSpec:
    """A video field's declaration (``video``); ``plan`` opens each file on the host, picks its
    frames and decodes them (or leaves them to NVDEC), one BatchError naming the field and the
    clip for a file it cannot take."""

    frames: int = 16  # T of every clip
    size: tuple[int, int] | None = None  # the (H, W) out; None: the frames' own
    step: int = 1  # frames apart
    start: str = "random"
    out: str = "NCTHW"
    pad: bool = False  # a shorter clip: its last frame repeated (else a BatchError)
    max_pixels: int = MAX_PIXELS
    nvdec: bool | None = None  # None: on a CUDA device where TorchCodec decodes there
    resize: int | tuple[int, int] | None = None  # Resize's: the shorter side, or (H, W)
    antialias: bool = True  # the resizes' (torchvision's Resize(antialias=...))

    draws = True  # plan takes ``at``: the batch's host generator and its device

    def plan(self, name: Name, value: Any, options: Any, batch: dict, at: Planning) -> Field:
        files = files_of(_paths_read(name, value), name)
        if files is None:
            raise BatchError(
                f"field {name!r} is declared video but is {type(value).__name__}: give a list of "
                "mp4/mkv/webm files as bytes, 1-D uint8 tensors or arrays, {'bytes': ...} dicts, "
                "or paths"
            )
        check_channels(name, 3, len(options.mean or (0,)))
        check_options(name, options)
        u = torch.rand(len(files), generator=at.generator, dtype=torch.float64).tolist()
        nvdec = self.nvdec if self.nvdec is not None else _nvdec(at.device)

        where = [_source(name, i, value) for i in range(len(files))]
        work = functools.partial(self._picked, nvdec=nvdec)
        threads = min(count(), len(files))  # PyAV decodes without the GIL: a clip a thread
        heads = list((pool(threads).map if threads > 1 else map)(work, where, files, u))
        sizes = torch.tensor([h.size for h in heads], dtype=torch.int64)
        framed = [resized(h.size, self.resize) if self.resize else h.size for h in heads]
        size = self.size or one_size(name, framed, "clips", "video")
        small = [i for i, (h, w) in enumerate(framed) if h < size[0] or w < size[1]]
        if self.resize and small:
            i, (h, w) = small[0], framed[small[0]]
            raise BatchError(
                f"{where[i]}: resized to {h}x{w} (resize={self.resize}), smaller than the "
                f"{size[0]}x{size[1]} cropped from it; declare latecast.video(resize=...) at "
                "least size"
            )
        kind = VideoFiles if nvdec else VideoPlanes
        return kind.of(name, heads, files, sizes, tuple(size), self)

    def evaluated(self) -> VideoSpec:
        """This declaration for evaluation: the centre frames, nothing drawn."""
        return replace(self, start="centre" if self.start == "random" else self.start)

    def _picked(self, at: str, data: np.ndarray | bytes, u: float, nvdec: bool) -> _Clip:
        """Clip ``at``'s header checked, its frames picked (``u``: its draw in [0, 1)) and,
        unless the device decodes it, decoded to its planes."""
        import av

        try:
            with av.open(io.BytesIO(data), metadata_errors="ignore") as container:
                clip = self._demuxed(at, container)
                clip.indices = self._indices(at, clip.count, u)
                if not nvdec:
                    clip.planes = _decoded(at, clip, container.streams.video[0].codec_context)
                clip.packets = []
        except av.error.FFmpegError as err:
            raise BatchError(f"{at}: does not decode ({err}); is it a whole video file?") from None
        return clip

    def _demuxed(self, at: str, container: Any) -> _Clip:
        """The stream's header (its size, refused past ``max_pixels`` before any frame is
        decoded) and its packets, read without decoding: how many frames, at one rate."""
        if not container.streams.video:
            raise BatchError(f"{at}: no video stream (an audio file?)")
        stream = container.streams.video[0]
        h, w = stream.codec_context.height, stream.codec_context.width
        if h * w * self.frames > self.max_pixels or not h * w:
            raise BatchError(
                f"{at}: its header says frames of {w}x{h}, {self.frames} of them past "
                f"max_pixels={self.max_pixels} (a decompression bomb?); raise "
                "latecast.video(max_pixels=...) for videos this large"
            )
        packets = [p for p in container.demux(stream) if p.size]
        pts = sorted(p.pts for p in packets if p.pts is not None)
        steps = np.diff(pts)
        if len(steps) and steps.max() - steps.min() > max(1, 0.05 * np.median(steps)):
            raise BatchError(
                f"{at}: variable frame rate (frames {steps.min()} to {steps.max()} of "
                f"{stream.time_base} s apart): re-encode it at one rate, ffmpeg -i in.mp4 "
                "-fps_mode cfr out.mp4"
            )
        _check_whole(at, container, stream, packets)
        clip = _Clip((h, w), len(packets), pts if len(pts) == len(packets) else None, packets)
        clip.left = stream.codec_context.name in LEFT_SITED
        return clip

    def _indices(self, at: str, count: int, u: float) -> list[int]:
        """The frames taken: ``frames`` of them ``step`` apart from the start (``u``: its
        draw); a clip too short for them is a BatchError, or with ``pad`` its last frame
        repeated."""
        span = self.step * (self.frames - 1) + 1
        spare = count - span
        if spare < 0 and not self.pad:
            raise BatchError(
                f"{at}: {count} frames, fewer than the {span} that {self.frames} frames "
                f"{self.step} apart take; declare latecast.video(pad=True) to repeat its last"
            )
        spare = max(spare, 0)
        start = {"random": min(int(u * (spare + 1)), spare), "centre": spare // 2}
        first = start.get(self.start, 0)
        return [min(first + self.step * k, count - 1) for k in range(self.frames)]


def _source(name: Name, i: int, value: Any) -> str:
    """Clip ``i`` of field ``name`` in messages (its path, where it came as one)."""
    item = value[i]
    path = item.get("path") if isinstance(item, dict) else item
    path = f" ({os.fspath(path)})" if isinstance(path, (str, os.PathLike)) else ""
    return f"field {name!r}: the clip at position {i} in the batch{path}"


@dataclass
class _Clip:
    """One clip as planned: its frame size, frame count, the frames taken and their planes."""

    size: tuple[int, int]  # (H, W) from the header
    count: int  # frames (packets) in the stream
    pts: list | None  # each frame's timestamp, in presentation order
    packets: list = field(default_factory=list, repr=False)  # in decode order, while planned
    indices: list[int] = field(default_factory=list)
    planes: np.ndarray | None = None  # Y, U, V of each frame, back to back, flat
    bits: int = 8
    matrix: tuple[float, float] = BT601
    full: bool = False  # full range (else limited: 16-235)
    left: bool = False  # chroma sited left (H.264, HEVC: FFmpeg's default for them)


def _check_whole(at: str, container: Any, stream: Any, packets: list) -> None:
    """A BatchError where the video's packets end more than two frames before the duration
    its header gives (the stream's, else the file's where it holds the video alone)."""
    tb = float(stream.time_base)
    step = float(np.median([p.duration or 0 for p in packets])) if packets else 0
    said = stream.duration * tb if stream.duration else None
    if said is None and container.duration and len(container.streams) == 1:
        said = container.duration / 1e6  # microseconds
    ends = [(p.pts + (p.duration or 0)) * tb for p in packets if p.pts is not None]
    if said and ends and max(ends) < said - 2 * step * tb:
        raise BatchError(
            f"{at}: the file is cut short, its frames end at {max(ends):.2f} s of the "
            f"{said:.2f} s its header says"
        )


def resized(hw: tuple[int, int], to: int | tuple[int, int]) -> tuple[int, int]:
    """Frames of ``hw`` (H, W) resized as torchvision's ``Resize(to)``: ``(H, W)`` as given, an
    int the shorter side (the longer scaled to it, rounded down)."""
    if not isinstance(to, int):
        return tuple(to)
    h, w = hw
    return (to, to * w // h) if h <= w else (to * h // w, to)


def _paths_read(name: Name, value: Any) -> Any:
    """``value`` with each path (str, PathLike) read to its bytes (a BatchError naming it)."""
    if not isinstance(value, (list, tuple)):
        return value
    out = []
    for i, item in enumerate(value):
        if isinstance(item, (str, os.PathLike)):
            try:
                item = np.fromfile(os.fspath(item), np.uint8)
            except OSError as err:
                raise BatchError(f"{_source(name, i, value)}: {err.strerror}") from None
        out.append(item)
    return out


def _decoded(at: str, clip: _Clip, codec: Any) -> np.ndarray:
    """The clip's frames ``clip.indices`` decoded by ``codec`` to 4:2:0 planes, flat: each
    frame's Y (H, W) then U and V (ceil(H/2), ceil(W/2)), uint8 or uint16 (deep video); from
    the last keyframe at or before the first frame taken, frames known by their timestamps
    (else counted from the start). BatchError for a file cut short or whose frame size
    changes."""
    want = sorted(set(clip.indices))
    keys = {p: k for k, p in enumerate(clip.pts)} if clip.pts else None
    packets = clip.packets
    if keys:
        first = clip.pts[want[0]]
        starts = [k for k, p in enumerate(packets) if p.is_keyframe and p.pts <= first]
        packets = packets[starts[-1] if starts else 0 :]
    got: dict[int, list] = {}
    n = -1
    for frame in (f for p in [*packets, None] for f in codec.decode(p)):  # None: the flush
        n = keys.get(frame.pts, n + 1) if keys else n + 1
        if (frame.height, frame.width) != clip.size:
            h, w = clip.size
            raise BatchError(
                f"{at}: its frame size changes mid-stream, {w}x{h} to {frame.width}x"
                f"{frame.height}; cut it into clips of one size"
            )
        if n in want:
            got[n] = _planes(frame, clip)
        if n >= want[-1]:
            break
    missing = [k for k in want if k not in got]
    if missing:
        raise BatchError(
            f"{at}: frame {missing[0]} of {clip.count} did not decode (the file is cut short "
            "or damaged)"
        )
    return np.concatenate([p for k in clip.indices for p in got[k]])


def _planes(frame: Any, clip: _Clip) -> list[np.ndarray]:
    """A frame's Y, U, V planes, flat (a 4:2:0 one's as decoded; another's made 4:2:0 by
    swscale first); sets ``clip``'s depth, matrix and range from it."""
    name = frame.format.name
    bits = YUV420.get(name) or (10 if "10" in name or "12" in name else 8)
    if name not in YUV420:
        frame = frame.reformat(format="yuv420p" if bits == 8 else "yuv420p10le")
    clip.bits, clip.full = bits, name == "yuvj420p" or frame.color_range == FULL_RANGE
    clip.matrix = MATRICES.get(frame.colorspace, BT601)
    dtype = np.uint8 if bits == 8 else np.uint16
    out = []
    for plane in frame.planes:
        rows = np.frombuffer(plane, dtype).reshape(plane.height, -1)  # line_size: padded
        out.append(rows[:, : plane.width].reshape(-1))
    return out


def _nvdec(device: torch.device) -> bool:
    """Whether clips for ``device`` cross as their files, for TorchCodec to decode there."""
    return device.type == "cuda" and _decodes_on(str(device))


@functools.cache
def _decodes_on(device: str) -> bool:
    """TorchCodec decodes a 2-frame H.264 clip on ``device`` (NVDEC on CUDA): it imports, its
    FFmpeg loads, the device takes it."""
    import av

    buf = io.BytesIO()
    try:
        from torchcodec.decoders import VideoDecoder

        with av.open(buf, "w", format="mp4") as out:
            stream = out.add_stream("libx264" if "libx264" in av.codecs_available else "mpeg4")
            stream.width = stream.height = 64
            for _ in range(2):
                out.mux(stream.encode(av.VideoFrame(64, 64, "yuv420p")))
            out.mux(stream.encode())
        VideoDecoder(buf.getvalue(), device=device).get_frame_at(1)
    except Exception:  # absent, its FFmpeg not loaded, no NVDEC: the host's planes then
        return False
    return True


@dataclass(frozen=True)
class VideoPlanes(Field):
    """Clips that cross as their frames' YUV 4:2:0 planes (each clip's back to back), made
    RGB on the device by the stream's matrix and range, then resized, cropped and finished
    as clips."""

    clips: list = field(default_factory=list, repr=False)  # _Clip of each
    sizes: torch.Tensor | None = None  # (N, 2) int64 each clip's (H, W)
    size: tuple[int, int] = (0, 0)  # out
    spec: VideoSpec = VideoSpec()  # out, resize, antialias

    category, what = "image", "video"
    pixels = True

    @classmethod
    def of(cls, name, heads, files, sizes, size, spec) -> VideoPlanes:
        deep = any(c.bits > 8 for c in heads)
        dtype = torch.uint16 if deep else torch.uint8
        return cls(name, dtype, (len(heads),), None, heads, sizes, size, spec)

    @property
    def crops(self) -> bool:  # resized first: a random crop of size, as clip()'s
        return self.spec.resize is not None

    @property
    def frames(self) -> int:
        return len(self.clips[0].indices)

    @functools.cached_property
    def nbytes(self) -> int:
        return sum(len(c.planes) for c in self.clips) * self.dtype.itemsize

    @property
    def usual_bytes(self) -> int:  # decoded to RGB float32 at the size out, the usual way
        return 4 * 3 * len(self.clips) * self.frames * math.prod(self.size)

    def pack(self, dst: torch.Tensor, value: Any) -> None:
        out = dst.numpy().view(np.uint16 if self.dtype == torch.uint16 else np.uint8)
        np.concatenate([c.planes for c in self.clips], out=out, casting="unsafe")

    def view(self, raw: torch.Tensor, device: torch.device) -> list:
        """Each clip's ``(Y, U, V)``: ``(T, H, W)`` and twice ``(T, ceil(H/2), ceil(W/2))``
        (deep video as int16: 10 or 12 bits fit it, and torch 2.4 has few uint16 ops)."""
        x = raw.view(torch.int16) if self.dtype == torch.uint16 else raw
        t, out, at = self.frames, [], 0
        for (h, w), clip in zip(self.sizes.tolist(), self.clips):
            hw, half = h * w, ((h + 1) // 2, (w + 1) // 2)
            frames = x[at : at + len(clip.planes)].view(t, -1)  # (T, H*W + 2*h*w)
            y, u, v = frames.split([hw, *[math.prod(half)] * 2], 1)
            out.append((y.view(t, h, w), u.view(t, *half), v.view(t, *half)))
            at += len(clip.planes)
        return out

    def sizes_of(self, x: Any) -> torch.Tensor:
        """Each clip's (H, W) the draw is made for: resized, where ``resize`` is declared."""
        if self.spec.resize is None:
            return self.sizes
        return torch.tensor([resized(c.size, self.spec.resize) for c in self.clips])

    def finish(self, x: list, ctx: Context) -> torch.Tensor:
        """Each clip RGB (``rgb``) into its slot: resized to ``resize`` (torchvision's Resize),
        then cropped as clips are (``video.crop_clip``: the draw's box, else the centre);
        without ``resize``, resized by the draw's box (RandomResizedCrop), else its shorter
        side resized to ``size`` and its centre cropped (Resize and CenterCrop: the crop's
        border pixels weigh their neighbours outside it); antialiased unless declared not;
        then ``video.finished``."""
        boxes, (th, tw) = ctx.draw.boxes, self.size
        out = torch.empty(
            (len(x), self.frames, th, tw, 3), dtype=torch.uint8, device=ctx.generator.device
        )
        for i, clip in enumerate(self.clips):
            frames, box = self.rgb(x[i], clip), None if boxes is None else boxes[i].tolist()
            if box is None or self.spec.resize is not None:  # the whole frames resized first
                whole = frames.new_empty((self.frames, *self._resized(clip.size), 3))
                crop_into(frames, (0, 0, *clip.size), whole, antialias=self.spec.antialias)
                frames = whole
            crop_clip(frames, box, out[i], self.spec.antialias)
        return finished(out, ctx, self.spec.out)

    def _resized(self, hw: tuple[int, int]) -> tuple[int, int]:
        """What frames of ``hw`` are resized to before their crop: ``resize``'s size, else
        the smallest covering ``size`` at their aspect."""
        if self.spec.resize is not None:
            return resized(hw, self.spec.resize)
        (h, w), (th, tw) = hw, self.size
        return (th, th * w // h) if th * w >= tw * h else (tw * h // w, tw)

    @staticmethod
    def rgb(yuv: tuple, clip: _Clip) -> torch.Tensor:
        """``(Y, U, V)`` planes -> uint8 ``(T, H, W, 3)`` RGB by the clip's matrix (Kr, Kb) and
        range, in float32, rounded once; the chroma upsampled as swscale's rgb24 (``_chroma``)."""
        y, u, v = (p.float() * 2.0 ** (8 - clip.bits) for p in yuv)
        u, v = (_chroma(c, *y.shape[1:], clip) - 128 for c in (u, v))
        if not clip.full:  # limited range: Y 16..235, U and V 16..240
            y, u, v = (y - 16) * (255 / 219), u * (255 / 224), v * (255 / 224)
        kr, kb = clip.matrix
        kg = 1 - kr - kb
        r = y + 2 * (1 - kr) * v
        b = y + 2 * (1 - kb) * u
        g = y - (2 * kb * (1 - kb) * u + 2 * kr * (1 - kr) * v) / kg
        return torch.stack([r, g, b], -1).round_().clamp_(0, 255).to(torch.uint8)


def _chroma(c: torch.Tensor, h: int, w: int, clip: _Clip) -> torch.Tensor:
    """Float chroma ``(T, ceil(H/2), ceil(W/2))`` -> ``(T, H, W)`` as swscale (FFmpeg 8) makes
    rgb24, measured one sample at a time: each sample repeated for 8-bit frames of even height;
    else rows interpolated (bilinear, centred) and columns resampled where the stream sites
    its chroma left (H.264, HEVC: a quarter sample) or the width is odd (then interpolated)."""
    m, n = c.shape[1:]
    if clip.bits == 8 and h % 2 == 0:  # swscale's unscaled converter
        rows, cols = (torch.arange(k, device=c.device) // 2 for k in (h, w))
        return c[:, rows][:, :, cols]
    left = 0.25 if clip.left else 0.0
    i, j = (torch.arange(k, device=c.device, dtype=torch.float64) for k in (h, w))
    cols = (j + 0.5) * n / w - 0.5 + left if w % 2 else (j // 2) + left  # even: pairs
    return _at(_at(c, 1, (i + 0.5) * m / h - 0.5), 2, cols)


def _at(c: torch.Tensor, axis: int, at: torch.Tensor) -> torch.Tensor:
    """``c`` sampled at positions ``at`` along ``axis``, linearly between its samples (a
    whole position: that sample), clamped to its ends."""
    at = at.clamp(0, c.shape[axis] - 1)
    low = at.floor().long()
    high = (low + 1).clamp(max=c.shape[axis] - 1)
    f = (at - low).float().view([len(at) if k == axis else 1 for k in range(c.ndim)])
    return c.index_select(axis, low) * (1 - f) + c.index_select(axis, high) * f


@dataclass(frozen=True)
class VideoFiles(VideoPlanes):
    """Clips that cross as their files, left in the pinned slot for TorchCodec, whose NVDEC
    decoder takes the frames picked on the host (``indices``) on the device, RGB."""

    files: list = field(default_factory=list, repr=False)

    on_host = True

    @classmethod
    def of(cls, name, heads, files, sizes, size, spec) -> VideoFiles:
        return cls(name, torch.uint8, (len(heads),), None, heads, sizes, size, spec, files)

    @functools.cached_property
    def nbytes(self) -> int:
        return sum(len(f) for f in self.files)

    decoded_bytes = property(lambda self: self.usual_bytes // 4)  # uint8 RGB at the size out

    def decoder(self, device: torch.device) -> str:
        return "torchcodec nvdec"

    def pack(self, dst: torch.Tensor, value: Any) -> None:
        np.concatenate([np.frombuffer(f, np.uint8) for f in self.files], out=dst.numpy())

    def view(self, raw: torch.Tensor, device: torch.device) -> list:
        """Each clip's file (host bytes) and the device it decodes on."""
        ends = np.cumsum([0, *map(len, self.files)]).tolist()
        return [(raw[a:b], device) for a, b in zip(ends, ends[1:])]

    @staticmethod
    def rgb(source: tuple, clip: _Clip) -> torch.Tensor:  # pragma: no cover - needs CUDA
        """The clip's frames ``clip.indices`` decoded by NVDEC: uint8 ``(T, H, W, 3)``."""
        from torchcodec.decoders import VideoDecoder

        data, device = source
        decoder = VideoDecoder(data, device=device, dimension_order="NHWC")
        return decoder.get_frames_at(clip.indices).data


def video(
    frames: int = 16,
    size: int | tuple[int, int] | None = None,
    step: int = 1,
    start: str = "random",
    out: str = "NCTHW",
    *,
    pad: bool = False,
    max_pixels: int = MAX_PIXELS,
    nvdec: bool | None = None,
    resize: int | tuple[int, int] | None = None,
    antialias: bool = True,
) -> VideoSpec:
    """Declare a field of encoded video files for ``wrap(fields={name: latecast.video(...)})``.

    Args:
        frames: the frames of every clip out.
        size: the ``(H, W)`` out, or one int. With ``resize``, cropped as ``latecast.clip``
            crops: under an ``Augment`` with ``resized_crop`` RandomResizedCrop to it, under
            another ``Augment`` a random crop of it (RandomCrop), without one the centre
            crop (CenterCrop); the same box for all frames of a clip. Without ``resize``:
            RandomResizedCrop under an ``Augment`` with ``resized_crop`` (one box per clip),
            else the shorter side resized to it and the centre cropped. None: the frames'
            own size (resized), all alike.
        step: frames apart (2: every other frame).
        start: where in the clip its frames start: ``"random"`` (per clip, drawn from the
            batch's seeded generator: a resumed run draws the same), ``"start"``,
            ``"centre"`` (evaluation: ``PrepareOnDevice`` takes centre for random).
        out: ``"NCTHW"`` (torchvision's video models) or ``"NTCHW"`` (VideoMAE, TimeSformer).
        pad: a clip with fewer frames than taken gets its last frame repeated; else a
            BatchError naming it.
        max_pixels: frames x height x width of a clip, read from its header before decoding;
            a file past it is a BatchError (a decompression bomb), as Pillow's
            ``MAX_IMAGE_PIXELS``.
        nvdec: True: the files cross and TorchCodec decodes them where the batch is
            finished (NVDEC on CUDA); False: the host decodes to YUV 4:2:0 planes, which
            cross. None: NVDEC on a CUDA device where TorchCodec decodes there (checked once).
        resize: what torchvision's ``Resize`` takes, done on the device to the RGB frames
            before the crop (bilinear): an int (or ``[int]``) the shorter side, or ``(H,
            W)``. torchvision's video reference is ``video(16, size=112, resize=(128, 171),
            antialias=False)`` under ``Augment(flip=0.5)``: its Resize((128, 171),
            antialias=False), RandomCrop(112), flip (its eval: CenterCrop, no Augment).
        antialias: the frames' resizes antialiased (torchvision v2's default), as Resize's
            ``antialias``; False: bilinear without, as the video reference's presets.

    Example:
        >>> dl = DataLoader(mp4_bytes_and_labels, batch_size=24, num_workers=8)
        >>> train = latecast.wrap(dl, mean=MEAN, std=STD, augment=latecast.Augment(flip=0.5),
        ...                       fields={0: latecast.video(16, size=112)})
    """
    hw = numbers_of((size, size) if isinstance(size, numbers.Integral) else size, int)
    to = numbers_of((resize,) if isinstance(resize, numbers.Integral) else resize, int)
    refuse(
        [
            (
                size is None or (hw and len(hw) == 2 and min(hw) >= 1),
                "latecast.video(size=...)",
                size,
                "an integer N or (H, W) of integers >= 1 (None: the frames' own)",
            ),
            (
                resize is None or (to and len(to) in (1, 2) and min(to) >= 1),
                "latecast.video(resize=...)",
                resize,
                "an integer N (the shorter side) or (H, W) of integers >= 1, or None",
            ),
            (
                nvdec in (None, True, False),
                "latecast.video(nvdec=...)",
                nvdec,
                "True, False or None",
            ),
        ]
    )
    frames = check(frames, "latecast.video(frames=...)", int, 1)
    step = check(step, "latecast.video(step=...)", int, 1)
    max_pixels = check(max_pixels, "latecast.video(max_pixels=...)", int, 1)
    start = check(start, "latecast.video(start=...)", STARTS)
    out = check(out, "latecast.video(out=...)", OUTS)
    pad = check(pad, "latecast.video(pad=...)", bool)
    antialias = check(antialias, "latecast.video(antialias=...)", bool)
    resize = to if resize is None or len(to) == 2 else to[0]
    try:
        import av  # noqa: F401  (the host reads every file with it, NVDEC or not)
    except ImportError:
        raise ConfigError(
            "latecast.video reads video files with PyAV: pip install 'latecast[video]'"
        ) from None
    return VideoSpec(frames, hw, step, start, out, pad, max_pixels, nvdec, resize, antialias)
