"""Encoded video: host CPU-ms and bytes host->device per clip, RGB decoded on the host (the
usual float32 pipeline; ``latecast.clip``) against YUV 4:2:0 decoded on the host and
converted on the device (``latecast.video``).

    python benchmarks/video_decode.py --videos 24 --frames 16 --source 256x340 --rounds 3

The videos are ``synthetic_videos.py``'s: H.264 (libx264) YUV 4:2:0 ``.mp4`` files of
``--source`` HxW (Kinetics-400 as usually prepared: short side 256), made in memory. Each
clip is the first ``--frames`` frames of a file, decoded by PyAV. Rows, per clip:

- ``float32, RGB on the host``: torchvision's video classification reference as its users
  run it now (PyAV, ``rgb24``), then its eval preset: ConvertImageDtype, Resize(``--resize``,
  antialias=False), Normalize, CenterCrop(``--crop``), ``(C, T, H, W)``; float32 crosses.
- ``latecast.clip, RGB on the host``: ``rgb24`` at ``--resize`` in the same swscale call
  (PyAV's ``to_ndarray(width=, height=)``), batches of ``--batch-size`` through ``wrap``
  with ``latecast.clip(size=crop)``: uint8 ``(T, H, W, C)`` crosses, cropped and
  normalized on the device.
- ``latecast.video, YUV 4:2:0 on the host``: the files' bytes, batched, through ``wrap``
  with ``latecast.video(frames, crop, start="start")``: its plan decodes the frames to
  their YUV 4:2:0 planes (no swscale), which cross; made RGB, resized (shorter side to the
  crop), cropped and normalized on the device.

Host CPU is this process's user + system time (``time.process_time``, all threads; torch
at one thread, as in a DataLoader worker; ``latecast.video``'s plan then decodes a clip at a
time), median of ``--rounds`` rounds, the rows taken in turn within a round; for the wrap
rows the host half (the workers' part, then ``send``: plan and pack) and the device half
(``finish``) apart. The device is this CPU: its column is the device's work done here, not
host time a GPU would cost. The stage profile times each step alone on the same clips: the
decode, the plane copy, swscale's RGB conversion at the source size and with the resize,
each of the reference's torch ops. Prints two tables, then one JSON line (``--cprofile``:
``latecast.video``'s host half by function first).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import time
from pathlib import Path

import av
import numpy as np
import torch
import torchvision.transforms as T
from synthetic_videos import CODEC, encoded, frames_of

import latecast
from latecast.integrations.plan import Options
from latecast.integrations.wrapped import Wrapped

MEAN, STD = (0.43216, 0.394666, 0.37645), (0.22803, 0.22145, 0.216989)  # the reference's


def decoded(data: bytes, frames: int) -> list[av.VideoFrame]:
    """The first ``frames`` frames of an encoded video, as PyAV decodes them."""
    out = []
    with av.open(io.BytesIO(data)) as container:
        for frame in container.decode(video=0):
            out.append(frame)
            if len(out) == frames:
                break
    return out


def rgb(frames: list[av.VideoFrame], hw: tuple[int, int] | None = None) -> torch.Tensor:
    """uint8 ``(T, H, W, 3)`` by swscale, resized to ``hw`` in the same call where given."""
    size = {} if hw is None else {"height": hw[0], "width": hw[1]}
    return torch.from_numpy(np.stack([f.to_ndarray(format="rgb24", **size) for f in frames]))


def tchw(frames: list[av.VideoFrame]) -> torch.Tensor:
    return rgb(frames).permute(0, 3, 1, 2)  # the reference's (T, C, H, W)


def planes(frames: list[av.VideoFrame]) -> torch.Tensor:
    """The frames' YUV 4:2:0 planes, uint8 ``(T, H * 3 / 2, W)``: Y, then U and V."""
    return torch.from_numpy(np.stack([f.to_ndarray(format="yuv420p") for f in frames]))


def reference(resize: tuple[int, int], crop: int) -> T.Compose:
    """VideoClassificationPresetEval on a uint8 ``(T, C, H, W)`` clip."""
    ops = [T.ConvertImageDtype(torch.float32), T.Resize(resize, antialias=False)]
    ops += [T.Normalize(MEAN, STD), T.CenterCrop(crop)]
    return T.Compose([*ops, to_cthw])


def to_cthw(x: torch.Tensor) -> torch.Tensor:
    return x.permute(1, 0, 2, 3)  # the reference's ConvertBCHWtoCBHW


def usual(files: list[bytes], frames: int, to_float: T.Compose) -> tuple[float, float, int]:
    """The float32 pipeline, a clip: host CPU-ms, device CPU-ms (none: ``.to`` only), bytes."""
    c, nbytes = time.process_time(), 0
    for data in files:
        nbytes += to_float(tchw(decoded(data, frames))).nbytes
    return (time.process_time() - c) * 1000 / len(files), 0.0, nbytes // len(files)


def through(spec, chunks: list[list[bytes]], make, profiler=None) -> tuple[float, float, int]:
    """Batches of ``make(chunk)`` and labels through ``wrap``'s host half (``make``, then
    ``send``: plan, pack; under ``profiler`` where given) and its device half (``finish``, on
    this CPU), timed apart; a clip: host CPU-ms, device CPU-ms, bytes across."""
    w = Wrapped(None, Options.of({"mean": MEAN, "std": STD, "fields": {0: spec}}), "cpu")
    w._start()
    host = device = 0.0
    for chunk in chunks:
        c = time.process_time()
        with profiler or contextlib.nullcontext():
            sent = w.send((make(chunk), torch.arange(len(chunk))))
        d = time.process_time()
        w.finish(sent)
        host, device = host + d - c, device + time.process_time() - d
    n = sum(map(len, chunks))
    return host * 1000 / n, device * 1000 / n, w.stats.image_bytes // n


def profile(files: list[bytes], frames: int, resize: tuple, to_float: T.Compose) -> dict:
    """CPU-ms a clip of each step alone (``time.process_time``: this process, all threads):
    the decode, the plane copy, swscale's RGB with and without the resize, each of the
    reference's ops on the RGB frames."""
    spent = collections.Counter()

    def step(name: str, work, *args):
        c = time.process_time()
        out = work(*args)
        spent[name] += time.process_time() - c
        return out

    for data in files:
        clip = step("decode (PyAV)", decoded, data, frames)
        step("copy the YUV planes (PyAV)", planes, clip)
        step("rgb24 + resize (swscale)", rgb, clip, resize)
        x = step("rgb24 at the source size (swscale)", tchw, clip)
        for op in to_float.transforms:
            x = step(f"{getattr(op, '__name__', type(op).__name__)} (torch)", op, x)
    return {name: s * 1000 / len(files) for name, s in spent.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--videos", type=int, default=24)
    p.add_argument("--frames", type=int, default=16, help="frames a clip")
    p.add_argument("--length", type=int, default=32, help="frames a file")
    p.add_argument("--source", default="256x340", help="the files' HxW")
    p.add_argument("--resize", default="128x171", help="the reference's Resize, HxW")
    p.add_argument("--crop", type=int, default=112)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cprofile", action="store_true", help="profile video()'s host half too")
    args = p.parse_args()
    torch.set_num_threads(1)  # as in a DataLoader worker, where PyTorch sets one thread
    src, resize = (tuple(map(int, s.split("x"))) for s in (args.source, args.resize))
    files = [encoded(frames_of(args.length, *src, seed)) for seed in range(args.videos)]
    to_float = reference(resize, args.crop)
    chunks = [files[i : i + args.batch_size] for i in range(0, len(files), args.batch_size)]

    def rgb_clips(chunk: list[bytes]) -> torch.Tensor:  # the DataLoader workers' part
        return torch.stack([rgb(decoded(d, args.frames), resize) for d in chunk])

    clip_spec = latecast.clip(args.frames, "NTHWC", size=args.crop)
    video_spec = latecast.video(args.frames, args.crop, start="start")
    rows = {
        "float32, RGB on the host": lambda: usual(files, args.frames, to_float),
        "latecast.clip, RGB on the host": lambda: through(clip_spec, chunks, rgb_clips),
        "latecast.video, YUV 4:2:0 on the host": lambda: through(video_spec, chunks, list),
    }
    runs = {name: [] for name in rows}
    stages = []
    for _ in range(args.rounds):
        for name, row in rows.items():
            runs[name].append(row())
        stages.append(profile(files, args.frames, resize, to_float))
    cpu = {name: [statistics.median(r[k] for r in rs) for k in (0, 1)] for name, rs in runs.items()}
    nbytes = {name: rs[0][2] for name, rs in runs.items()}
    steps = {name: statistics.median(r[name] for r in stages) for name in stages[0]}
    if args.cprofile:  # latecast.video's host half by function, once more
        profiler = cProfile.Profile()
        through(video_spec, chunks, list, profiler)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(8)
    clip = f"{args.frames} frames of {args.source}, {CODEC}"
    print(f"| per clip ({clip}) | host CPU-ms | device work, CPU-ms here | bytes across |")
    print("|---|---|---|---|")
    for name in rows:
        print(f"| {name} | {cpu[name][0]:.1f} | {cpu[name][1]:.1f} | {nbytes[name]:,} |")
    print("\n| stage, alone | CPU-ms a clip |\n|---|---|")
    for name, ms in steps.items():
        print(f"| {name} | {ms:.1f} |")
    git = ["git", "rev-parse", "--short", "HEAD"]
    rev = subprocess.run(git, capture_output=True, text=True, cwd=Path(__file__).parent)
    config = {**vars(args), "codec": CODEC, "git": rev.stdout.strip(), "load": os.getloadavg()}
    result = {"config": config, "cpu_ms": cpu, "rounds_ms": runs, "steps_ms": steps}
    print(json.dumps({**result, "bytes": nbytes}))


if __name__ == "__main__":
    main()
