"""Random vs block order on a store whose pages are not in the page cache: loader images/s
for each order (pages dropped with ``posix_fadvise(POSIX_FADV_DONTNEED)`` before every
pass, and the share still cached checked with ``mincore``), then optionally the test
accuracy ``latecast train`` reaches with each order.

    python benchmarks/order_bench.py STORE [--repeats 3] [--order block:32:256]
    python benchmarks/order_bench.py STORE --train "--epochs 8"   # + accuracy per order

STORE is a ``latecast convert`` output (a raw store; an encoded one once convert writes
them: the jpeg mover then reads and decodes). A pass reads one epoch in the loader's
order on the CPU (source + move: the reads are what the order changes); nothing else.
The effect shows on a store larger than the free RAM or on a disk, not on tmpfs (whose
pages cannot be dropped) or a store that fits in the cache between passes anyway. The
accuracy runs use ``latecast train`` (its preset for the store) with the same ``--order``;
the last stdout line is JSON.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import mmap
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from latecast.loader import Loader
from latecast.storage.datasets import load_dataset
from latecast.tools.measure import run_info


def store_files(store: Path) -> list[Path]:
    return [p for p in sorted(store.rglob("*")) if p.is_file() and p.stat().st_size]


def drop_pages(files: list[Path]) -> None:
    """Ask the kernel to drop the files' pages (it cannot while they are mapped; dirty pages
    are written back first, or they would stay)."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cached_share(files: list[Path]) -> float:
    """Share of the files' pages in the page cache (``mincore`` on a private mapping, which
    reads nothing)."""
    libc = ctypes.CDLL(None, use_errno=True)
    page, cached, total = os.sysconf("SC_PAGE_SIZE"), 0, 0
    for path in files:
        size = path.stat().st_size
        with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            buf = ctypes.c_char.from_buffer(m)
            if libc.mincore(ctypes.c_void_p(ctypes.addressof(buf)), ctypes.c_size_t(size), vec):
                raise OSError(ctypes.get_errno(), "mincore failed")
            del buf  # release the buffer before the mapping closes
            cached += sum(b & 1 for b in vec)
            total += pages
    return cached / max(total, 1)


def one_pass(store: Path, order: str, args, epoch: int) -> tuple[float, float]:
    """(images/s, cached share before) of one epoch in ``order``, from cold pages."""
    files = store_files(store)
    drop_pages(files)
    before = cached_share(files)
    ds = load_dataset(str(store), "train")
    loader = Loader(ds, args.batch_size, device="cpu", order=order)
    loader.set_epoch(epoch)
    t0, n = time.perf_counter(), 0
    for _, labels in loader:
        n += len(labels)
    rate = n / (time.perf_counter() - t0)
    del loader, ds
    gc.collect()  # unmap the store, so the next drop can evict it
    return rate, before


def accuracy(store: Path, name: str, order: str, args) -> dict:
    folder = Path(args.output_dir) / name
    cmd = [sys.executable, "-m", "latecast", "train", str(store), "--order", order]
    cmd += ["--no-progress", "--json", "--output-dir", str(folder), *shlex.split(args.train)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    summary = json.loads(out.strip().splitlines()[-1])
    metrics = folder / "metrics.jsonl"
    per_epoch = [json.loads(line)["test_accuracy"] for line in metrics.read_text().splitlines()]
    return {"test_accuracy": summary["test_accuracy"], "per_epoch": per_epoch}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("store", type=Path)
    p.add_argument("--repeats", type=int, default=3, help="cold passes per order")
    p.add_argument("-b", "--batch-size", type=int, default=256)
    p.add_argument("--order", default="block:32:256", help="the block order set against random")
    p.add_argument("--train", default="", help='latecast train flags, e.g. "--epochs 8"')
    p.add_argument("--output-dir", default="runs/order-bench")
    args = p.parse_args()
    train = args.store / "train" if (args.store / "train").is_dir() else args.store
    result: dict = {**run_info(__import__("torch").device("cpu")), "config": vars(args)}
    result["config"]["store"] = str(args.store)
    for name, order in (("random", "random"), ("block", args.order)):
        runs = [one_pass(train, order, args, epoch) for epoch in range(args.repeats)]
        rates, cached = zip(*runs)
        result[name] = {"images_per_s": float(np.median(rates)), "runs": rates}
        result[name]["cached_before"] = max(cached)
        print(
            f"{name:>6}: {np.median(rates):,.0f} images/s (median of {len(rates)} cold "
            f"passes; at most {max(cached):.1%} of the store cached before a pass)",
            flush=True,
        )
        if args.train:
            result[name].update(accuracy(args.store, name, order, args))
            print(f"{name:>6}: test accuracy {result[name]['per_epoch']}", flush=True)
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
