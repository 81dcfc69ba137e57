"""Peak memory while a loader walks a store larger than it ever holds (issue: store).

    python benchmarks/store_rss.py STORE [--batches N] [--transfer uint8]

Reads /proc/self/status after every batch: RssAnon is the process's own memory (what a
store read whole would inflate), RssFile the store's pages mapped in from the page cache
(reclaimable: the kernel drops them under pressure; they are not a copy). Prints one JSON
line. Linux only.
"""

from __future__ import annotations

import argparse
import json
import time

import latecast


def rss() -> dict[str, int]:
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "RssAnon", "RssFile"):
                fields[key] = int(value.split()[0]) * 1024  # kB -> bytes
    return fields


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("store")
    p.add_argument("--batches", type=int, default=0, help="0: one whole epoch")
    p.add_argument("--transfer", default="uint8")
    p.add_argument("-b", "--batch-size", type=int, default=1024)
    args = p.parse_args()
    before = rss()
    ds = latecast.open_store(args.store)
    loader = latecast.Loader(ds, args.batch_size, device="cpu", transfer=args.transfer)
    peak_anon, n, t0 = 0, 0, time.perf_counter()
    for images, _ in loader:
        n += len(images)
        peak_anon = max(peak_anon, rss()["RssAnon"])
        if args.batches and n >= args.batches * args.batch_size:
            break
    after = rss()
    print(
        json.dumps(
            {
                "store_bytes": ds.image_bytes + ds.label_bytes,
                "images": len(ds),
                "images_read": n,
                "seconds": round(time.perf_counter() - t0, 2),
                "rss_anon_before": before["RssAnon"],
                "peak_rss_anon": peak_anon,
                "rss_file_after": after["RssFile"],
                "vm_hwm": after["VmHWM"],
            }
        )
    )


if __name__ == "__main__":
    main()
