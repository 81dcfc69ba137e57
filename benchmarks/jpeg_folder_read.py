"""What ``latecast.jpeg_folder`` costs to read and hand over, in CPU-s (the machine is shared:
CPU time, not wall time, is what compares).

    python benchmarks/jpeg_folder_read.py FOLDER --rounds 3

``FOLDER``: class subfolders of JPEG files (the CIFAR-10 copy that ``peers.py`` unpacks).
Two tables, each variant once a round, the rounds alternated:

- **reads**: CPU-us per file of reading a batch of 512 shuffled files: ``stat`` by path then
  open, fstat, read, close and each header walked (``read_file`` at a755c18); open, fstat,
  read, close (b931d8b's ``__getitem__``); the same opened without blocking, no stat by path,
  the headers walked as a batch (``read_files`` now); open, read into one preallocated
  buffer, close (sizes known before: no fstat); Python's ``open().read()``; the batch on 4
  threads.
- **hand-off**: CPU-s of one DataLoader epoch (batch 512, 2 persistent workers, no ``wrap``),
  the main process's and the workers': each sample read alone and collated (``per-sample``);
  the batch read as one buffer crossing by value (``batch``, what ``jpeg_folder`` does); the
  same crossing as shared tensors, one file descriptor each (``shared``).

Prints the tables, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import stat
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from peers import cpu_seconds, git_revision


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def reads(paths: list[str]) -> dict:
    """Each way to read ``paths`` in batches of 512: CPU-us per file (after a warm pass)."""
    from latecast.kinds.jpegheader import jpeg_header
    from latecast.storage.folder import read_files

    def old(batch):  # a755c18's read_file
        for p in batch:
            stat.S_ISREG(os.stat(p).st_mode)
            fd = os.open(p, os.O_RDONLY)
            try:
                data = os.read(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
            jpeg_header(data)

    def plain(batch):  # b931d8b's __getitem__
        for p in batch:
            fd = os.open(p, os.O_RDONLY)
            try:
                os.read(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)

    sizes = {p: os.path.getsize(p) for p in paths}
    buffer = memoryview(bytearray(512 * max(sizes.values())))

    def readinto(batch):  # sizes known before: no fstat, read into one buffer
        at = 0
        for p in batch:
            fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
            try:
                at += os.readv(fd, [buffer[at : at + sizes[p]]])
            finally:
                os.close(fd)

    def builtin(batch):
        for p in batch:
            with open(p, "rb") as f:
                f.read()

    pool = ThreadPoolExecutor(4)
    threads = lambda batch: list(pool.map(read_files, [batch[k::4] for k in range(4)]))  # noqa: E731
    ways = {"stat, open, fstat, read, header (a755c18)": old, "open, fstat, read (b931d8b)": plain}
    ways |= {"open without blocking, fstat, read, headers together (now)": read_files}
    ways |= {"open, read into one buffer (sizes known: no fstat)": readinto}
    ways |= {"open().read()": builtin, "now, on 4 threads": threads}
    batches = [paths[k : k + 512] for k in range(0, len(paths), 512)]
    out = {}
    for name, read in ways.items():
        for batch in batches[:2]:  # the page cache, the pool started
            read(batch)
        t0 = own_cpu()
        for batch in batches:
            read(batch)
        out[name] = 1e6 * (own_cpu() - t0) / len(paths)
    return out


def hand_off(folder: str, way: str, epochs: int = 2) -> dict:
    """CPU-s of the main process and of all (workers included) for one DataLoader epoch."""
    from torch.utils.data import DataLoader, default_collate

    from latecast.storage.folder import JpegFolder  # registers its collate

    class OneByOne(JpegFolder):
        __getitems__ = None

    ds = (OneByOne if way == "per-sample" else JpegFolder)(folder)
    shared = {"collate_fn": lambda s: list(default_collate(s))} if way == "shared" else {}
    dl = DataLoader(ds, 512, shuffle=True, num_workers=2, persistent_workers=True, **shared)
    for _ in zip(range(3), dl):
        pass
    runs = []
    for _ in range(epochs):
        own, every = own_cpu(), cpu_seconds()
        images = sum(len(labels) for _, labels in dl)
        runs.append({"main": own_cpu() - own, "all": cpu_seconds() - every, "images": images})
    return min(runs, key=lambda r: r["all"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:  # one hand-off way in a fresh process
        print(json.dumps(hand_off(str(args.folder), args.child)))
        return
    import latecast

    paths = [path for path, _ in latecast.jpeg_folder(args.folder).samples]
    random.Random(0).shuffle(paths)
    load, started = os.getloadavg(), time.time()
    ways = ("per-sample", "batch", "shared")
    got = {"reads": [], **{w: [] for w in ways}}
    for r in range(args.rounds):
        got["reads"].append(reads(paths[:10240]))
        for way in ways:
            cmd = [sys.executable, __file__, str(args.folder), "--child", way]
            line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            got[way].append(json.loads(line.splitlines()[-1]))
            print(f"round {r + 1}: {way}: {got[way][-1]}", file=sys.stderr)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started))
    loads = f"load average {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after"
    print(f"\n{args.rounds} rounds, medians; git {git_revision()}; {loads}; {when}\n")
    print("| read | CPU-us per file |\n|---|---|")
    for name in got["reads"][0]:
        print(f"| {name} | {statistics.median(r[name] for r in got['reads']):.2f} |")
    print("\n| hand-off | CPU-s an epoch, all | main process |\n|---|---|---|")
    for way in ways:
        med = {k: statistics.median(r[k] for r in got[way]) for k in ("all", "main")}
        print(f"| {way} | {med['all']:.2f} | {med['main']:.2f} |")
    print(json.dumps({"git": git_revision(), "load": [load, os.getloadavg()], **got}))


if __name__ == "__main__":
    main()
