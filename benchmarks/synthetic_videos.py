"""Write a Kinetics-style folder of small encoded videos (for benchmarks and tests): class
folders of ``.mp4`` files, H.264 (libx264) YUV 4:2:0 where PyAV's wheel has it, else MPEG-4
Part 2, the same bytes for the same arguments.

    python benchmarks/synthetic_videos.py OUT --videos 32 --classes 4 --frames 32 --size 256x340

Writes OUT/<class>/NNNNN.mp4. Each frame is a smooth colour field with a few shapes moving
across it and a little grain: content an encoder keeps well and a decoder has real work on.
The pixels carry no class signal: use it to measure decoding, never accuracy.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import av
import numpy as np

CODEC = "libx264" if "libx264" in av.codecs_available else "mpeg4"


def frames_of(n: int, h: int, w: int, seed: int) -> np.ndarray:
    """``n`` deterministic RGB frames, uint8 ``(n, h, w, 3)``: a colour field drifting by a
    pixel a frame, two boxes moving across it, grain."""
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:h, 0:w] / max(h, w)
    fy, fx = rng.uniform(0.5, 3, 2)
    tint, base = rng.uniform(30, 70, 3), rng.uniform(70, 180, 3)
    boxes = rng.integers(0, 256, (2, 3))
    out = np.empty((n, h, w, 3), np.uint8)
    for t in range(n):
        wave = np.sin(2 * np.pi * (fy * ys + fx * (xs + t / max(h, w))))
        img = base + tint * wave[..., None] + rng.normal(0, 3, (h, w, 3))
        for k, colour in enumerate(boxes):  # hard edges moving right and down
            y0, x0 = (h // 4 + 2 * t * (k + 1)) % h, (w // 5 + 3 * t * (k + 1)) % w
            img[y0 : y0 + h // 4, x0 : x0 + w // 4] = colour
        out[t] = img.clip(0, 255)
    return out


def encoded(frames: np.ndarray, fps: int = 15, crf: int = 18) -> bytes:
    """``frames`` (uint8 ``(T, H, W, 3)``, H and W even) as an ``.mp4`` file's bytes, encoded
    by PyAV in YUV 4:2:0."""
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream(CODEC, rate=fps)
        stream.height, stream.width = frames.shape[1:3]
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": str(crf)} if CODEC == "libx264" else {"qscale": "3"}
        for f in frames:
            out.mux(stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")))
        out.mux(stream.encode())  # flush the encoder
    return buf.getvalue()


def kinetics_folder(
    out: Path, videos: int, classes: int, frames: int, hw: tuple[int, int], seed: int = 0
) -> list[tuple[Path, int]]:
    """``videos`` files under ``out/<class>/``, video ``i`` in class ``i % classes``; returns
    their (path, class index) in sorted order, as a folder dataset lists them."""
    names = [f"class{c:02d}" for c in range(classes)]
    for i in range(videos):
        path = out / names[i % classes] / f"{i:05d}.mp4"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(encoded(frames_of(frames, *hw, seed * 1_000_003 + i)))
    return [(p, names.index(p.parent.name)) for p in sorted(out.glob("*/*.mp4"))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--videos", type=int, default=32)
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--frames", type=int, default=32)
    p.add_argument("--size", default="256x340", help="HxW (even)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    hw = tuple(map(int, a.size.split("x")))
    files = kinetics_folder(a.out, a.videos, a.classes, a.frames, hw, a.seed)
    kb = sum(f.stat().st_size for f, _ in files) / len(files) / 1000
    print(f"{a.out}: {len(files)} {CODEC} videos of {a.frames} frames {a.size}, {kb:.0f} KB each")


if __name__ == "__main__":
    main()
