"""CPU cost per JPEG image on a CPU device, 1 thread: the decoder alone (its floor) beside
latecast's ``decode`` step and its whole loader, for two git revisions run alternately.

    python benchmarks/jpeg_cpu.py 80a3fa1 HEAD --cifar STORE --photos FOLDER --rounds 3

``--cifar``: a JPEG store (``latecast convert cifar10-jpg/train STORE --encoding jpeg``),
loaded with crop(pad 4) + flip + normalize at 32x32; ``--photos``: a JPEG folder
(``benchmarks/synthetic_photos.py``), RandomResizedCrop(224, scale (0.08, 1)) + flip +
normalize. Each revision runs in a fresh process (its ``src/`` from ``git archive``,
``torch.set_num_threads(1)``); every number is CPU time of the whole process
(``time.process_time``, all threads) per image, the best of ``--repeats`` passes after a
warm-up: ``floor`` the decoder's op (TorchCodec's, under its ``decode_jpeg``) called once
per file in a tight loop, ``decode`` latecast's decode step on the mover's batches
(RandomResizedCrop boxes for photos), ``loader`` a ``Loader`` pass (images/s beside it,
wall clock).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from revisions import package

TIMING = """
import itertools, json, sys, time
from pathlib import Path
import numpy as np, torch
torch.set_num_threads(1)
from torchcodec.decoders._image_decoders import ImageReadMode, _decode_jpeg
from latecast.kinds.decode import Encoded
from latecast.kinds.decode import decode
from latecast.loader import Loader
from latecast.transforms import Augment
from latecast.transforms import resized_crop_params
kind, where, batches, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if kind == "cifar":
    from latecast.storage.store import open_store
    ds, bs, augment, size = open_store(where), 256, "crop,flip", (32, 32)
else:
    sys.path.insert(0, sys.argv[5])
    from jpeg_folder import encoded_folder
    size = (224, 224)
    ds, bs, augment = encoded_folder(Path(where), size), 64, "resized_crop=0.08,flip"
def best(run, n):
    run()  # warm-up
    times = []
    for _ in range(repeats):
        c, w = time.process_time(), time.perf_counter()
        run()
        times.append((time.process_time() - c, time.perf_counter() - w))
    c, w = min(times)
    return {"cpu_us": 1e6 * c / n, "images_per_s": n / w}
def batch(k):  # what the jpeg mover yields, in memory of its own
    idx = np.arange(k * bs, (k + 1) * bs) % len(ds)
    files = [ds.data[ds.offsets[i] : ds.offsets[i + 1]] for i in idx]
    offsets = np.cumsum([0] + [len(f) for f in files]).tolist()
    sizes = torch.from_numpy(ds.sizes[idx].astype(np.int64))
    data = torch.from_numpy(np.concatenate(files))
    return Encoded(data, offsets, sizes, torch.from_numpy(idx), ds.channels, torch.device("cpu"))
encoded, g = [batch(k) for k in range(batches)], torch.Generator().manual_seed(0)
boxes = [None if kind == "cifar" else resized_crop_params(b.sizes, (0.08, 1), generator=g)
         for b in encoded]
files = [f for b in encoded for f in b.files()]
mode = ImageReadMode[{1: "GRAY", 3: "RGB"}[ds.channels]]
n = bs * batches
loader = Loader(ds, bs, device="cpu", transfer="jpeg", augment=Augment.parse(augment), seed=0)
print(json.dumps({
    "floor": best(lambda: [_decode_jpeg(f, mode.value) for f in files], n),
    "decode": best(lambda: [decode(b, size, x) for b, x in zip(encoded, boxes)], n),
    "loader": best(lambda: sum(len(y) for _, y in itertools.islice(iter(loader), batches)), n),
}))
"""


def run(src: Path, kind: str, where: Path, args: argparse.Namespace) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    bench = str(Path(__file__).resolve().parent)
    cmd = [sys.executable, "-c", TIMING, kind, str(where), str(args.batches), str(args.repeats)]
    proc = subprocess.run([*cmd, bench], env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("revisions", nargs=2, help="two git revisions, e.g. 80a3fa1 HEAD")
    p.add_argument("--cifar", type=Path, help="a JPEG store of CIFAR-10 (32x32)")
    p.add_argument("--photos", type=Path, help="a folder of class folders of photos")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batches", type=int, default=20, help="batches per timed pass")
    p.add_argument("--repeats", type=int, default=3, help="timed passes (best taken)")
    args = p.parse_args()
    kinds = {k: v for k, v in (("cifar", args.cifar), ("photos", args.photos)) if v}
    rows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        srcs = {rev: package(rev, Path(tmp)) for rev in args.revisions}
        for _ in range(args.rounds):
            for kind, where in kinds.items():
                for rev, src in srcs.items():
                    for step, got in run(src, kind, where, args).items():
                        rows.setdefault(f"{kind} {step} | {rev}", []).append(got)
    print(f"uptime: {os.getloadavg()}\n| workload, step, revision | CPU-us per image | images/s |")
    print("|---|---|---|")
    for key, runs in rows.items():
        us = " / ".join(f"{r['cpu_us']:,.1f}" for r in runs)
        print(f"| {key} | {us} | " + " / ".join(f"{r['images_per_s']:,.0f}" for r in runs) + " |")
    print(json.dumps({"revisions": args.revisions, "rows": rows}))


if __name__ == "__main__":
    main()
