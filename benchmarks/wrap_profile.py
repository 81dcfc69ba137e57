"""Where the CPU time of ``wrap`` over a DataLoader of JPEG files goes, sampled by py-spy
(``pip install py-spy``) in the main process and in the DataLoader's workers: reading the
files, the collate, the hand-off (pickling in the workers, unpickling in the main process),
the field's plan, the headers, the packing into the pinned buffer, the decode, the
augmentation and the normalize.

    python benchmarks/wrap_profile.py FOLDER --batches 60 --workers 2 --reader folder

``FOLDER``: class subfolders of JPEG files (the CIFAR-10 copy). ``--reader folder``:
``latecast.jpeg_folder``; ``files``: the README's recipe before it, a Dataset returning
``path.read_bytes()`` (what a revision without ``jpeg_folder`` runs). 1 thread, batch 512,
crop (pad 4) + flip + normalize. The script runs itself under ``py-spy record --format raw
--subprocesses`` (250 samples a second, idle threads left out), then gives each sample to
the innermost frame it knows (``STAGES``) and scales the shares by each side's own CPU time
(``getrusage``): CPU-us per image, a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STAGES = {  # a frame's function name -> its stage (the innermost known frame wins)
    "jpeg_header": "headers",
    "_turbo": "decode",
    "_decode_cpu": "decode",
    "_pack": "pack",
    "plan_batch": "plan",
    "normalize": "normalize",
    "apply": "augment",
    "__getitem__": "read files",
    "default_collate": "collate",
    "collate": "collate",
    "_next_data": "hand-off",
    "put": "hand-off",
    "_launch": "starting the workers",
}


def child(args: argparse.Namespace) -> None:
    import torch
    from torch.utils.data import DataLoader, Dataset

    import latecast

    class Files(Dataset):
        """The README's recipe before ``jpeg_folder``: ``(path.read_bytes(), label)``."""

        def __init__(self, root: Path) -> None:
            names = sorted(p.name for p in root.iterdir() if p.is_dir())
            self.samples = [
                (f, i) for i, c in enumerate(names) for f in sorted((root / c).iterdir())
            ]

        def __len__(self) -> int:
            return len(self.samples)

        def __getitem__(self, i: int):
            path, label = self.samples[i]
            return path.read_bytes(), label

    torch.set_num_threads(1)
    ds = latecast.jpeg_folder(args.folder) if args.reader == "folder" else Files(args.folder)
    dl = DataLoader(ds, 512, shuffle=True, num_workers=args.workers)
    aug = latecast.Augment(crop=4, flip=0.5)
    w = latecast.wrap(dl, device="cpu", mean=(0.5,) * 3, std=(0.25,) * 3, augment=aug)
    sum(len(y) for _, y in itertools.islice(iter(w), 3))  # warm-up: the ring, page cache
    own, kids = (resource.getrusage(r) for r in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    t0 = time.perf_counter()
    n = sum(len(y) for _, y in itertools.islice(iter(w), args.batches))
    wall = time.perf_counter() - t0
    time.sleep(0.5)  # the workers are joined when the pass ends
    own2, kids2 = (resource.getrusage(r) for r in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))

    def cpu(a, b) -> float:
        return 1e6 * (b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime) / n

    out = {
        "images": n,
        "images_per_s": n / wall,
        "main": cpu(own, own2),
        "workers": cpu(kids, kids2),
    }
    print(json.dumps(out))


def stage_of(stack: list[str]) -> str:
    for frame in reversed(stack):  # innermost first: "Class.method (file:line)", "f.<locals>.g"
        for name in reversed(frame.split(" (")[0].split(".")):
            if name in STAGES:
                return STAGES[name]
    return "other"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--batches", type=int, default=60)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--reader", choices=("folder", "files"), default="folder")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "stacks.txt"
        cmd = [spy, "record", "--format", "raw", "--subprocesses", "--rate", "250", "-o", str(raw)]
        cmd += ["--", sys.executable, __file__, str(args.folder), "--child"]
        cmd += ["--batches", str(args.batches), "--workers", str(args.workers)]
        proc = subprocess.run([*cmd, "--reader", args.reader], capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"wrap_profile.py: {proc.stderr.strip()[-2000:]}")
        said = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        measured = json.loads(said[-1])  # py-spy's own lines follow it
        samples: dict[str, collections.Counter] = {"main": collections.Counter()}
        samples["workers"] = collections.Counter()
        for line in raw.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            frames = stack.split(";")
            side = "workers" if any("_worker_loop" in f for f in frames) else "main"
            passes = ("Wrapped.__iter__", "_decode_cpu")  # the latter: a decoding thread's
            if side == "main" and not any(f.startswith(passes) for f in frames):
                continue  # start-up and imports: outside the passes
            samples[side][stage_of(frames)] += int(count)
    print(f"{measured['images']} images, {measured['images_per_s']:,.0f} images/s under py-spy")
    print("| side | stage | CPU-us per image | share |\n|---|---|---|---|")
    stages = {}
    for side, counts in samples.items():
        total = sum(counts.values()) or 1
        for stage, k in counts.most_common():
            us = measured[side] * k / total
            stages[f"{side}: {stage}"] = us
            print(
                f"| {side} ({measured[side]:.1f} in all) | {stage} | {us:.1f} | {k / total:.0%} |"
            )
    print(
        json.dumps({"measured": measured, "stages_us": stages, "config": vars(args)}, default=str)
    )


if __name__ == "__main__":
    main()
