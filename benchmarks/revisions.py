"""Loader throughput of two git revisions of latecast on this machine, run alternately.

A refactor should change no speed; on a shared machine the spread between runs of the same
code is often larger than any difference between two versions, so each round runs both
revisions one after the other (each its package from ``git archive``, in a fresh process,
``OMP_WAIT_POLICY`` as the caller has it) and the table shows every round.

    python benchmarks/revisions.py cfae759 HEAD --rounds 3

Each run: MNIST (the bundled copy, or ``--dataset``: a name or a store folder),
``Loader(train, BATCH, device="cpu", transfer=T, augment=A)``, best images/s of ``--epochs``
whole epochs per transfer (the first is a warm-up) and the process CPU seconds of that
epoch, at torch's default threads or ``--threads``. Uses only latecast's public API (and
``Augment.parse``: before issue 35 ``config.parse_augment``, before issue 15
``transforms``'). The CIFAR-10 row of
issue 21:

    python benchmarks/revisions.py 80a3fa1 HEAD --dataset STORE --augment crop=4,flip=0.5 \
        --threads 1 --batch-size 512 --transfers resident
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMING = """
import json, sys, time
import torch
import latecast
parse_augment = getattr(latecast.Augment, "parse", None)
if parse_augment is None:  # before issue 35
    try:
        from latecast.config import parse_augment
    except ImportError:  # before issue 15's layout
        from latecast.transforms import parse_augment
try:  # the usual pipeline left the core after a755c18: a Loader is given its class
    from latecast.trainer.baseline import Float32
    named = {"float32": Float32}
except ImportError:
    named = {}
transfers, batch, epochs, dataset, augment, threads = sys.argv[1:]
if int(threads):
    torch.set_num_threads(int(threads))
train = latecast.load_dataset(dataset, "train")
aug = parse_augment(augment) if augment else None
out = {}
for transfer in transfers.split(","):
    loader = latecast.Loader(
        train, int(batch), device="cpu", transfer=named.get(transfer, transfer), seed=0, augment=aug
    )
    best = (0.0, 0.0)
    for epoch in range(int(epochs) + 1):
        loader.set_epoch(epoch)
        t0, c0 = time.perf_counter(), time.process_time()
        n = sum(len(labels) for _, labels in loader)
        if epoch:
            best = max(best, (n / (time.perf_counter() - t0), time.process_time() - c0))
    out[transfer] = best
print(json.dumps(out))
"""


def package(rev: str, into: Path) -> Path:
    """``src/`` of revision ``rev``, extracted under ``into``."""
    archive = into / f"{rev}.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), rev, "src"], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / rev)  # our own history: trusted
    return into / rev / "src"


def run(src: Path, args: argparse.Namespace, cache: Path) -> dict[str, list[float]]:
    """``{transfer: [images/s, CPU seconds of that epoch]}``."""
    env = {**os.environ, "PYTHONPATH": str(src), "LATECAST_CACHE": str(cache)}
    cmd = [sys.executable, "-c", TIMING, args.transfers, str(args.batch_size), str(args.epochs)]
    cmd += [args.dataset, args.augment, str(args.threads)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"revisions.py: {src.parent.name} failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("revisions", nargs=2, help="two git revisions, e.g. cfae759 HEAD")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3, help="timed epochs per transfer")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--transfers", default="float32,uint8,prefetch,resident")
    p.add_argument("--dataset", default="mnist", help="a dataset name or a store folder")
    p.add_argument("--augment", default="", help='e.g. "crop=4,flip=0.5" (default: off)')
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: its default)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        srcs = {rev: package(rev, tmp) for rev in args.revisions}
        rows: dict[str, dict[str, list[float]]] = {}
        cpu: dict[str, dict[str, list[float]]] = {}
        for _ in range(args.rounds):
            for rev, src in srcs.items():  # each revision its own cache: formats may differ
                for transfer, (rate, secs) in run(src, args, tmp / f"cache-{rev}").items():
                    rows.setdefault(transfer, {}).setdefault(rev, []).append(rate)
                    cpu.setdefault(transfer, {}).setdefault(rev, []).append(secs)
    a, b = args.revisions
    print(f"| images/s (CPU-s) | {a}, rounds 1-{args.rounds} | {b}, rounds 1-{args.rounds} |")
    print("|---|---|---|")
    for transfer, by_rev in rows.items():
        cells = [
            " / ".join(f"{r:,.0f} ({s:.2f})" for r, s in zip(by_rev[rev], cpu[transfer][rev]))
            for rev in (a, b)
        ]
        print(f"| {transfer} | {cells[0]} | {cells[1]} |")
    out = {"revisions": args.revisions, "images_per_s": rows, "cpu_s_per_epoch": cpu}
    print(json.dumps({**out, "dataset": args.dataset, "augment": args.augment}))


if __name__ == "__main__":
    main()
