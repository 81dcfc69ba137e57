"""Loader throughput of two git revisions of latecast on this machine, run alternately.

A refactor should change no speed; on a shared machine the spread between runs of the same
code is often larger than any difference between two versions, so each round runs both
revisions one after the other (each its package from ``git archive``, in a fresh process,
``OMP_WAIT_POLICY`` as the caller has it) and the table shows every round.

    python benchmarks/revisions.py cfae759 HEAD --rounds 3

Each run: MNIST (the bundled copy), ``Loader(train, BATCH, device="cpu", transfer=T)``,
best images/s of ``--epochs`` whole epochs per transfer (the first is a warm-up).
Uses only latecast's public API, which both revisions must have.
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
import latecast
train = latecast.load_dataset("mnist", "train")
out = {}
for transfer in sys.argv[1].split(","):
    loader = latecast.Loader(train, int(sys.argv[2]), device="cpu", transfer=transfer, seed=0)
    best = 0.0
    for epoch in range(int(sys.argv[3]) + 1):
        loader.set_epoch(epoch)
        t0 = time.perf_counter()
        n = sum(len(labels) for _, labels in loader)
        if epoch:
            best = max(best, n / (time.perf_counter() - t0))
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


def run(src: Path, args: argparse.Namespace, cache: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src), "LATECAST_CACHE": str(cache)}
    cmd = [sys.executable, "-c", TIMING, args.transfers, str(args.batch_size), str(args.epochs)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("revisions", nargs=2, help="two git revisions, e.g. cfae759 HEAD")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3, help="timed epochs per transfer")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--transfers", default="float32,uint8,prefetch,resident")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        srcs = {rev: package(rev, tmp) for rev in args.revisions}
        rows: dict[str, dict[str, list[float]]] = {}
        for _ in range(args.rounds):
            for rev, src in srcs.items():  # each revision its own cache: formats may differ
                for transfer, rate in run(src, args, tmp / f"cache-{rev}").items():
                    rows.setdefault(transfer, {}).setdefault(rev, []).append(rate)
    a, b = args.revisions
    print(f"| images/s | {a}, rounds 1-{args.rounds} | {b}, rounds 1-{args.rounds} |")
    print("|---|---|---|")
    for transfer, by_rev in rows.items():
        cells = [" / ".join(f"{r:,.0f}" for r in by_rev[rev]) for rev in (a, b)]
        print(f"| {transfer} | {cells[0]} | {cells[1]} |")
    print(json.dumps({"revisions": args.revisions, "images_per_s": rows}))


if __name__ == "__main__":
    main()
