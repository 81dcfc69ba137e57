"""Audio: bytes crossed and host CPU-s per epoch of the usual float32 pipeline (DataLoader
workers turning int16 clips into float32, padded to 1 s, a gain, optionally torchaudio's
log-mel) against ``latecast.waveform`` (the workers collate int16, padded, with lengths;
the same work on the device), on synthetic speech-commands-sized data.

    python benchmarks/audio.py --clips 4096 --batch-size 256 --workers 2

Clips are 0.875-1 s of int16 noise at 16 kHz. CPU-s are process CPU (``resource``: the main
process and its reaped DataLoader workers), one epoch after a warm-up epoch. On a CPU
"device" latecast's device work runs on the host too: ``device work`` times it alone (the
field's ``prepared`` over held batches), so on a GPU the host pays ``wrap`` minus it. The
usual log-mel is torchaudio's where it is installed, else latecast's ``Mel`` (the same ops).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import time

import torch
from torch.utils.data import DataLoader, Dataset

import latecast
from latecast.integrations.plan import Options
from latecast.kinds.audio import Mel

RATE = 16000
try:
    import torchaudio
except ImportError:
    torchaudio = None


def cpu_seconds() -> float:
    """CPU time of this process and its reaped children (the DataLoader's workers)."""
    own, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


class Clips(Dataset):
    """Stored int16 clips; ``usual``: made float32 in the worker as the usual pipeline does."""

    def __init__(self, n: int, usual=None) -> None:
        g = torch.Generator().manual_seed(0)
        sizes = torch.randint(14000, RATE + 1, (n,), generator=g)
        self.data = torch.randint(-20000, 20000, (n, RATE), dtype=torch.int16, generator=g)
        self.sizes, self.usual = sizes.tolist(), usual
        self.gen = torch.Generator().manual_seed(1)

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int):
        clip = self.data[i, : self.sizes[i]]
        if self.usual is None:
            return clip, i % 35
        return self.usual(clip), i % 35


def usual_transform(mel):
    """torchaudio.load's float32, padded to 1 s, a gain in [-6, 3] dB (Vol), the log-mel."""
    to_db = torchaudio.transforms.AmplitudeToDB() if torchaudio and mel else None
    spec = torchaudio.transforms.MelSpectrogram(RATE) if torchaudio and mel else Mel()

    def make(clip: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.pad(clip.float() / 32768, (0, RATE - len(clip)))[None]
        x = (x * 10 ** (float(torch.empty(()).uniform_(-6, 3)) / 20)).clamp(-1, 1)
        if not mel:
            return x
        return to_db(spec(x)) if to_db else spec(x)

    return make


def padded(batch: list) -> tuple:
    """int16 clips zero-padded to the longest, their lengths, the labels."""
    clips = [c for c, _ in batch]
    lengths = torch.tensor([len(c) for c in clips])
    waves = torch.nn.utils.rnn.pad_sequence(clips, batch_first=True)
    return waves, lengths, torch.tensor([y for _, y in batch])


def epoch(loader, step) -> tuple[float, float, int]:
    """CPU-s and wall-s of one epoch after a warm-up one, and the bytes it moved."""
    moved = sum(step(b) for b in loader)  # warm-up
    c, w = cpu_seconds(), time.perf_counter()
    moved = sum(step(b) for b in loader)
    return cpu_seconds() - c, time.perf_counter() - w, moved


def run(args, mel: bool) -> dict:
    device = torch.device("cpu")
    usual = DataLoader(Clips(args.clips, usual_transform(mel)), args.batch_size,
                       num_workers=args.workers, shuffle=True)  # fmt: skip

    def to_device(b) -> int:
        x, y = b[0].to(device), b[1].to(device)
        return x.numel() * x.element_size() + y.numel() * y.element_size()

    u_cpu, u_wall, u_bytes = epoch(usual, to_device)
    stored = DataLoader(Clips(args.clips), args.batch_size, num_workers=args.workers,
                        shuffle=True, collate_fn=padded)  # fmt: skip
    spec = latecast.waveform(RATE, pad=True, gain=(-6.0, 3.0), mel=mel or None, lengths=1)
    wrapped = latecast.wrap(stored, device=device, fields={0: spec})
    l_cpu, l_wall, _ = epoch(wrapped, lambda b: 0)
    l_bytes = wrapped.stats.h2d_bytes // 2  # two epochs counted
    loader_cpu, _, _ = epoch(stored, lambda b: 0)
    return {
        "usual_cpu_s": u_cpu, "usual_wall_s": u_wall, "usual_bytes": u_bytes,
        "wrap_cpu_s": l_cpu, "wrap_wall_s": l_wall, "wrap_bytes": l_bytes,
        "loader_cpu_s": loader_cpu, "device_work_cpu_s": device_work(stored, spec),
    }  # fmt: skip


def device_work(stored: DataLoader, spec) -> float:
    """CPU-s of the field's device work alone (its kind's ``finish``, through the one
    ``Prepare``) over one epoch's held batches."""
    options, cpu = Options(fields={0: spec}), torch.device("cpu")
    prepare, held = options.prepare(), []
    for batch in stored:
        f = spec.plan(0, batch[0], options, dict(enumerate(batch)))
        raw = torch.empty(f.nbytes, dtype=torch.uint8)
        f.pack(raw, batch[0])
        held.append((f, f.view(raw, cpu)))
    c = time.process_time()
    for k, (f, x) in enumerate(held):
        prepare([f], [x], (0, 0, k), cpu)
    return time.process_time() - c


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clips", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(1)
    usual_mel = f"torchaudio {torchaudio.__version__}" if torchaudio else "latecast.kinds.audio.Mel"
    print(f"torch {torch.__version__}, usual log-mel by {usual_mel}, {platform.processor()}")
    print(f"{args.clips} clips of 14000-16000 int16 samples, batch {args.batch_size}, "
          f"{args.workers} workers, 1 thread; one epoch after a warm-up")  # fmt: skip
    print("| output | usual CPU-s | wrap CPU-s (CPU device) | of it device work | loader alone "
          "| usual bytes | wrap bytes | bytes ratio |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    rows = {}
    for name, mel in (("waveform (N, 16000)", False), ("log-mel (N, 128, 81)", True)):
        r = rows[name] = run(args, mel)
        print(f"| {name} | {r['usual_cpu_s']:.2f} | {r['wrap_cpu_s']:.2f} | "
              f"{r['device_work_cpu_s']:.2f} | {r['loader_cpu_s']:.2f} | {r['usual_bytes']:,} | "
              f"{r['wrap_bytes']:,} | {r['usual_bytes'] / r['wrap_bytes']:.2f}x |")  # fmt: skip
    print(json.dumps({"args": vars(args), "usual_mel": usual_mel, "rows": rows}))


if __name__ == "__main__":
    main()
