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
  (PyAV's ``to_ndarray(width=, height=)``); uint8 ``(T, H, W, C)`` crosses, cropped and
  normalized on the device.
- ``YUV 4:2:0 planes``: the decoded frames' own planes copied out, no swscale; the bytes
  ``latecast.video`` sends.

Host CPU is this process's user + system time (``getrusage``, all threads) over each row's
work on every clip, median of ``--rounds`` rounds, the rows taken in turn within a round. The
stage profile times each step alone on the same clips: the decode, the plane copy, swscale's
RGB conversion at the source size and with the resize, and the torch float work. Prints two
tables, then one JSON line.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
from pathlib import Path

import av
import numpy as np
import torch
import torchvision.transforms as T
from peers import cpu_seconds
from synthetic_videos import CODEC, encoded, frames_of

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
    return T.Compose([*ops, lambda x: x.permute(1, 0, 2, 3)])  # (C, T, H, W)


def cpu_ms(work, items) -> tuple[float, int]:
    """CPU-ms per item of ``work`` over ``items``, and the bytes of the tensors it made, per
    item."""
    c, nbytes = cpu_seconds(), 0
    for item in items:
        nbytes += getattr(work(item), "nbytes", 0)
    return (cpu_seconds() - c) * 1000 / len(items), nbytes // len(items)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--videos", type=int, default=24)
    p.add_argument("--frames", type=int, default=16, help="frames a clip")
    p.add_argument("--length", type=int, default=32, help="frames a file")
    p.add_argument("--source", default="256x340", help="the files' HxW")
    p.add_argument("--resize", default="128x171", help="the reference's Resize, HxW")
    p.add_argument("--crop", type=int, default=112)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)  # as in a DataLoader worker, where PyTorch sets one thread
    src, resize = (tuple(map(int, s.split("x"))) for s in (args.source, args.resize))
    files = [encoded(frames_of(args.length, *src, seed)) for seed in range(args.videos)]
    to_float = reference(resize, args.crop)
    rows = {
        "float32, RGB on the host": lambda d: to_float(tchw(decoded(d, args.frames))),
        "latecast.clip, RGB on the host": lambda d: rgb(decoded(d, args.frames), resize),
        "YUV 4:2:0 planes": lambda d: planes(decoded(d, args.frames)),
    }
    clips = [decoded(d, args.frames) for d in files]
    frames_rgb = [tchw(c) for c in clips]
    stages = {
        "decode (PyAV)": (lambda d: decoded(d, args.frames), files),
        "copy the YUV planes": (planes, clips),
        "rgb24 at the source size (swscale)": (rgb, clips),
        "rgb24 + resize (swscale)": (lambda c: rgb(c, resize), clips),
        "float, Resize, Normalize, crop (torch)": (to_float, frames_rgb),
    }
    runs = {name: [] for name in [*rows, *stages]}
    nbytes = {}
    for _ in range(args.rounds):
        for name, work in rows.items():
            ms, nbytes[name] = cpu_ms(work, files)
            runs[name].append(ms)
        for name, (work, items) in stages.items():
            runs[name].append(cpu_ms(work, items)[0])
    cpu = {name: statistics.median(ms) for name, ms in runs.items()}
    clip = f"{args.frames} frames of {args.source}, {CODEC}"
    print(f"| per clip ({clip}) | host CPU-ms | bytes across |")
    print("|---|---|---|")
    for name in rows:
        print(f"| {name} | {cpu[name]:.1f} | {nbytes[name]:,} |")
    print("\n| stage, alone | CPU-ms a clip |\n|---|---|")
    for name in stages:
        print(f"| {name} | {cpu[name]:.1f} |")
    git = ["git", "rev-parse", "--short", "HEAD"]
    rev = subprocess.run(git, capture_output=True, text=True, cwd=Path(__file__).parent)
    config = {**vars(args), "codec": CODEC, "git": rev.stdout.strip(), "load": os.getloadavg()}
    print(json.dumps({"config": config, "cpu_ms": cpu, "rounds_ms": runs, "bytes": nbytes}))


if __name__ == "__main__":
    main()
