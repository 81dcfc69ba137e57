"""latecast's CPU paths at 1 and 2 threads, with and without a busy process beside them, for
two git revisions run alternately (issue 21: OpenMP threads that spin-wait collapsed them).

    latecast convert CIFAR10_FOLDER /tmp/cifar-raw --encoding raw    # train/ and test/ inside
    latecast convert CIFAR10_FOLDER /tmp/cifar-jpeg --encoding jpeg  # (or synthetic_store.py)
    python benchmarks/threads.py main HEAD --raw /tmp/cifar-raw --jpeg /tmp/cifar-jpeg

CIFAR10_FOLDER: /work/shared/datasets/cifar10-jpg's tarball extracted (its README). Each
cell is a fresh process (each revision's ``src/`` from ``git archive``, ``device="cpu"``,
``torch.set_num_threads(T)``, ``OMP_WAIT_POLICY`` as the caller has it): the median of
``--epochs`` epochs after a warm-up one, images/s and the process's CPU-seconds per epoch
(all its threads). Workloads: the raw store through ``resident`` and ``uint8`` with
crop(pad 4)+flip+normalize, the JPEG store (decode + the same), the bundled MNIST through
``resident`` (normalize). "busy": another process running ``while True: pass`` meanwhile
(``--pin``: pinned to the last CPU). ``--batches K`` times K batches per epoch instead
(a quick look on a loaded machine). Prints one table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from revisions import package  # benchmarks/revisions.py: a revision's src/ from git archive

TIMING = """
import itertools, json, sys, time
import torch, latecast
store, transfer, threads, batch, epochs, batches = sys.argv[1:]
torch.set_num_threads(int(threads))
mnist = store == "mnist"
ds = latecast.load_dataset("mnist") if mnist else latecast.open_store(store, "train")
aug = None if mnist else latecast.Augment(crop=4, flip=0.5)
loader = latecast.Loader(ds, int(batch), device="cpu", transfer=transfer, augment=aug)
runs = []
for epoch in range(int(epochs) + 1):
    loader.set_epoch(epoch)
    c0, t0 = time.process_time(), time.perf_counter()
    n = sum(len(y) for _, y in itertools.islice(loader, int(batches) or None))
    runs.append((n / (time.perf_counter() - t0), time.process_time() - c0))
print(json.dumps(runs[1:]))
"""
BUSY = "import os, sys\nif sys.argv[1:]: os.sched_setaffinity(0, {int(sys.argv[1])})\nwhile 1: pass"


def workloads(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(name, store, transfer) for the stores given."""
    rows = [("mnist resident, normalize", "mnist", "resident")]
    if args.raw:
        rows += [
            (f"CIFAR raw {t}, crop+flip+normalize", args.raw, t) for t in ("resident", "uint8")
        ]
    if args.jpeg:
        rows += [("CIFAR JPEG store, decode+crop+flip+normalize", args.jpeg, "jpeg")]
    return rows


def cell(src: Path, cache: Path, store: str, transfer: str, threads: int, args) -> list:
    env = {**os.environ, "PYTHONPATH": str(src), "LATECAST_CACHE": str(cache)}
    argv = [store, transfer, threads, args.batch_size, args.epochs, args.batches]
    cmd = [sys.executable, "-c", TIMING, *map(str, argv)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("revisions", nargs=2, help="old and new git revision, e.g. main HEAD")
    p.add_argument("--raw", help="a raw CIFAR-shaped store (latecast convert --encoding raw)")
    p.add_argument("--jpeg", help="a JPEG store of the same images (--encoding jpeg)")
    p.add_argument("--epochs", type=int, default=3, help="timed epochs per cell")
    p.add_argument("--batches", type=int, default=0, help="batches per epoch (0: all)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--pin", action="store_true", help="pin the busy process to the last CPU")
    args = p.parse_args()
    old, new = args.revisions
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        srcs = {rev: package(rev, tmp) for rev in args.revisions}
        for busy in (False, True):
            pin = [str(max(os.sched_getaffinity(0)))] if args.pin else []
            hog = subprocess.Popen([sys.executable, "-c", BUSY, *pin]) if busy else None
            try:
                for name, store, transfer in workloads(args):
                    for threads in (1, 2):
                        runs = {
                            rev: cell(src, tmp / f"cache-{rev}", store, transfer, threads, args)
                            for rev, src in srcs.items()  # each its own cache: formats may differ
                        }
                        results.append((name, threads, busy, runs))
            finally:
                if hog is not None:
                    hog.kill()
                    hog.wait()
    med = lambda runs, k: statistics.median(r[k] for r in runs)  # noqa: E731
    print(f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}, {os.cpu_count()} CPUs")
    print(
        f"| workload | threads | busy process | images/s {old} | images/s {new} | new/old "
        f"| CPU-s/epoch {old} | CPU-s/epoch {new} |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, threads, busy, runs in results:
        a, b = med(runs[old], 0), med(runs[new], 0)
        print(
            f"| {name} | {threads} | {'yes' if busy else 'no'} | {a:,.0f} | {b:,.0f} | "
            f"{b / a:.2f}x | {med(runs[old], 1):.2f} | {med(runs[new], 1):.2f} |"
        )
    rows = [dict(workload=n, threads=t, busy=b, runs=r) for n, t, b, r in results]
    print(json.dumps({"revisions": args.revisions, "batch_size": args.batch_size, "rows": rows}))


if __name__ == "__main__":
    main()
