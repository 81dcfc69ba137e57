"""How far a reduced JPEG decode (libjpeg-turbo's 1/2, 1/4, 1/8 scaled IDCT, through
simplejpeg) + RandomResizedCrop lands from the full decode + the same crop, over many crops.

    python benchmarks/reduced_decode.py --photos 40 --crops 50 --side 2000

For each photo (``synthetic_photos.photo`` tiles, 4 x 4 of them resized into one
``--side`` x 3/4 ``--side`` JPEG at quality 90, so hard edges as objects give), ``--crops``
RandomResizedCrop(224, scale (0.08, 1)) boxes: the full decode cropped and resized to
224x224 (latecast's CPU path: torchvision's antialiased bilinear uint8 kernel) against the
largest reduction 1/s whose decode still covers the box at 224 or more (no upsampling),
the box divided by s and rounded to whole pixels; and "aligned", the box first moved to
multiples of s (a different crop from the one drawn) for both, which leaves the scaled
IDCT's own error. Prints, per s, how many crops qualify, the largest and mean grey-level
difference and the share of crops within 1 grey level everywhere, and the decode times;
the last line is JSON.
"""

from __future__ import annotations

import argparse
import io
import json
import time

import numpy as np
import simplejpeg
import torch
from PIL import Image
from synthetic_photos import photo

from latecast.transforms import crop_into, resized_crop_params

OUT = (224, 224)


def mosaic(seed: int, side: int) -> bytes:
    h, w = side * 3 // 4, side
    im = Image.new("RGB", (w, h))
    for k in range(16):
        tile = photo(seed * 16 + k).resize((w // 4, h // 4), Image.BILINEAR)
        im.paste(tile, ((k % 4) * (w // 4), (k // 4) * (h // 4)))
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=90)
    return buf.getvalue()


def resized(image: np.ndarray, box) -> torch.Tensor:
    out = torch.empty((*OUT, 3), dtype=torch.uint8)
    crop_into(torch.from_numpy(image), box, out)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--photos", type=int, default=40)
    p.add_argument("--crops", type=int, default=50, help="per photo")
    p.add_argument("--side", type=int, default=2000, help="photo width (height 3/4 of it)")
    args = p.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    rows = {s: {"crops": 0, "max": [], "mean": [], "ms": []} for s in (1, 2, 4, 8)}
    rows |= {f"{s} aligned": {"crops": 0, "max": [], "mean": [], "ms": []} for s in (2, 4, 8)}
    for k in range(args.photos):
        data = mosaic(k, args.side)
        t0 = time.process_time()
        full = simplejpeg.decode_jpeg(data, "RGB")
        rows[1]["ms"].append(1e3 * (time.process_time() - t0))
        h, w = full.shape[:2]
        boxes = resized_crop_params(torch.tensor([[h, w]] * args.crops), (0.08, 1.0), generator=g)
        scaled = {}
        for s in (2, 4, 8):
            t0 = time.process_time()
            scaled[s] = simplejpeg.decode_jpeg(
                data, "RGB", min_height=-(-h // s), min_width=-(-w // s), min_factor=s
            )
            rows[s]["ms"].append(1e3 * (time.process_time() - t0))
        for box in boxes.tolist():
            ref = resized(full, box).int()
            rows[1]["crops"] += 1
            fits = [s for s in (8, 4, 2) if min(box[2:]) // s >= OUT[0]]
            if not fits:
                continue
            s = fits[0]  # the largest reduction that still covers 224
            small = [round(v / s) for v in box]
            sh, sw = scaled[s].shape[:2]
            small[2], small[3] = min(small[2], sh - small[0]), min(small[3], sw - small[1])
            diff = (resized(scaled[s], small).int() - ref).abs()
            aligned = [v // s for v in box]
            ref_aligned = resized(full, [v * s for v in aligned]).int()
            for key, d in (
                (s, diff),
                (f"{s} aligned", (resized(scaled[s], aligned).int() - ref_aligned).abs()),
            ):
                rows[key]["crops"] += 1
                rows[key]["max"].append(int(d.max()))
                rows[key]["mean"].append(float(d.float().mean()))
    print(f"{args.photos} photos {args.side}x{args.side * 3 // 4}, {args.crops} crops each")
    print("| decode | crops | max grey-level diff | mean | crops within 1 | decode ms |")
    print("|---|---|---|---|---|---|")
    out = {}
    for s, r in rows.items():
        ms = float(np.median(r["ms"] or rows[int(str(s).split()[0])]["ms"]))
        if s == 1:
            print(f"| full | {r['crops']} | (reference) | | | {ms:.1f} |")
        elif r["crops"]:
            within = sum(m <= 1 for m in r["max"]) / r["crops"]
            print(
                f"| 1/{s} | {r['crops']} | {max(r['max'])} | {np.mean(r['mean']):.2f} | "
                f"{within:.0%} | {ms:.1f} |"
            )
        else:
            print(f"| 1/{s} | 0 | | | | {ms:.1f} |")
        out[s] = {"crops": r["crops"], "max": r["max"], "mean": r["mean"], "decode_ms": ms}
    print(json.dumps({"config": vars(args), "rows": out}))


if __name__ == "__main__":
    main()
