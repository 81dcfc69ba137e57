"""Peak memory while streaming WebDataset shards far larger than a memory cap (issue 25), and
the same shards over HTTP from localhost against local files.

    python benchmarks/stream_rss.py --work /tmp/latecast-stream --sizes 0.5,4 --cap-mb 512 \
        --http --rounds 3

For each size (GB of train shards) it writes shards of 256x256 noise JPEGs (80 KB each, a
few dozen distinct files repeated under their own keys; written once, kept in ``--work``),
indexes them (``latecast index``), then in a fresh process walks one epoch of a ``Loader``
over the stream on the CPU (read, JPEG decode, crop, normalize) with the process's data
segment capped (``RLIMIT_DATA``) at what it used once set up plus ``--cap-mb``: a process
whose memory grew with the shards would fail with MemoryError there. It prints the peak RSS
(VmHWM), the largest RssAnon seen after a batch and images/s; ``--http`` adds the first size
read from a ``http.server`` on 127.0.0.1 (``--rounds``: local and HTTP by turns, medians).
One JSON line last. Linux only.
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

PHOTO = 256  # side of the noise JPEGs: about 80 KB each at quality 90
DISTINCT = 32  # distinct files, repeated under their own keys
SHARD_MB = 64


def rss() -> dict[str, int]:
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "RssAnon", "VmData"):
                fields[key] = int(value.split()[0]) * 1024  # kB -> bytes
    return fields


def write_shards(folder: Path, gigabytes: float, photo: int) -> str:
    """Train shards of ``gigabytes`` plus one test shard; their spec."""
    import numpy as np
    from PIL import Image

    rng, files = np.random.default_rng(0), []
    for _ in range(DISTINCT):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (photo, photo, 3), np.uint8)).save(buf, "JPEG")
        files.append(buf.getvalue())
    total = max(2, int(gigabytes * 2**30 // len(files[0])))
    per = max(1, min(total // 2, int(SHARD_MB * 2**20 // len(files[0]))))
    count = -(-total // per) + 1  # + the test shard
    spec = f"{folder}/shard-{{000..{count - 1:03d}}}.tar"
    if (folder / "index.json").exists():
        return spec
    folder.mkdir(parents=True, exist_ok=True)
    for s in range(count):
        n = per if s < count - 1 else min(per, 256)
        with tarfile.open(folder / f"shard-{s:03d}.tar", "w") as tar:
            for i in range(n):
                for ext, data in (
                    ("jpg", files[(s + i) % DISTINCT]),
                    ("cls", str(i % 10).encode()),
                ):
                    info = tarfile.TarInfo(f"{s:03d}{i:06d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    from latecast.storage.shards import write_index

    write_index(spec)
    return spec


def child(spec: str, cap_mb: int, batch: int) -> None:
    """One epoch of a Loader over the stream, the data segment capped; one JSON line."""
    import latecast
    from latecast.storage.stream import open_shards

    ds = open_shards(spec, "train")
    loader = latecast.Loader(ds, batch, device="cpu", seed=0)
    loader.start()
    base = rss()
    cap = base["VmData"] + cap_mb * 2**20
    resource.setrlimit(resource.RLIMIT_DATA, (cap, cap))
    peaks, done = {"RssAnon": 0, "VmData": 0}, threading.Event()

    def sample() -> None:  # every 5 ms: the peaks between batches too
        while not done.wait(0.005):
            now = rss()
            for k in peaks:
                peaks[k] = max(peaks[k], now[k])

    threading.Thread(target=sample, daemon=True).start()
    n, t0 = 0, time.perf_counter()
    for images, _ in loader:
        n += len(images)
    seconds = time.perf_counter() - t0
    done.set()
    peak, data = peaks["RssAnon"], peaks["VmData"]
    print(json.dumps({
        "shard_bytes": ds.file_bytes, "images": n, "seconds": round(seconds, 2),
        "images_per_s": round(n / seconds, 1), "rss_anon_set_up": base["RssAnon"],
        "peak_rss_anon": peak, "vm_hwm": rss()["VmHWM"], "cap_bytes_over_set_up": cap_mb * 2**20,
        "peak_vm_data_over_set_up": data - base["VmData"],
    }))  # fmt: skip


def served(folder: Path) -> tuple[subprocess.Popen, int]:
    code = (
        "import functools, http.server, sys\n"
        "class Q(http.server.SimpleHTTPRequestHandler):\n"
        "    def log_message(self, *a): pass\n"
        "s = http.server.ThreadingHTTPServer(('127.0.0.1', 0), functools.partial(Q, "
        "directory=sys.argv[1]))\nprint(s.server_address[1], flush=True)\ns.serve_forever()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE)
    return proc, int(proc.stdout.readline())


def run_child(spec: str, args) -> dict:
    cmd = [sys.executable, __file__, "--child", spec, "--cap-mb", str(args.cap_mb),
           "-b", str(args.batch_size)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{spec}: the streaming process failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/latecast-stream"))
    p.add_argument("--sizes", default="0.5,4", help="GB of train shards, comma-separated")
    p.add_argument("--cap-mb", type=int, default=512, help="data segment allowed past set-up")
    p.add_argument("--photo", type=int, default=PHOTO, help="side of the noise JPEGs")
    p.add_argument("-b", "--batch-size", type=int, default=32)
    p.add_argument("--http", action="store_true", help="also the first size over HTTP")
    p.add_argument("--rounds", type=int, default=1, help="--http: local and HTTP runs, by turns")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.child, args.cap_mb, args.batch_size)
    rows = {}
    for gb in map(float, args.sizes.split(",")):
        folder = args.work / f"{gb:g}gb-{args.photo}"
        spec = write_shards(folder, gb, args.photo)
        if not (args.http and not rows):
            rows[f"{gb:g} GB local"] = run_child(spec, args)
            continue
        server, port = served(folder)
        url = spec.replace(str(folder), f"http://127.0.0.1:{port}")
        try:  # interleaved, so that a load that comes and goes meets both alike
            runs = [[run_child(where, args) for where in (spec, url)] for _ in range(args.rounds)]
        finally:
            server.kill()
            server.wait()
        for name, each in zip(("local", "http"), zip(*runs)):
            rate = sorted(r["images_per_s"] for r in each)
            rows[f"{gb:g} GB {name}"] = {**each[0], "images_per_s": rate[len(rate) // 2],
                                         "images_per_s_runs": rate}  # fmt: skip
    print("| shards | shard MB | images | peak RSS MB | peak RssAnon MB | images/s |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(
            f"| {name} | {r['shard_bytes'] / 2**20:.0f} | {r['images']} | "
            f"{r['vm_hwm'] / 2**20:.0f} | {r['peak_rss_anon'] / 2**20:.0f} | {r['images_per_s']} |"
        )
    print(json.dumps({"cap_mb": args.cap_mb, "rows": rows}))


if __name__ == "__main__":
    main()
