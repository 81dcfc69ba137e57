"""Set-ups that several test files share (tests/ is on sys.path, launched or not)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np


def noise_jpeg(rng: np.random.Generator, quality: int = 90) -> bytes:
    """A 200x200 JPEG of noise: ~50 KB, so a few dozen put a file past the first MiB."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (200, 200, 3), dtype=np.uint8)).save(
        buf, "JPEG", quality=quality
    )
    return buf.getvalue()


def damage_scan(jpeg: bytes) -> bytes:
    """16 bytes inverted in the middle of the entropy-coded data (after the SOS header):
    Pillow decodes the file without a word, libjpeg with "Corrupt JPEG data: N extraneous
    bytes" (it still decodes it: part of the image is wrong)."""
    data, mid = bytearray(jpeg), (jpeg.index(b"\xff\xda") + len(jpeg)) // 2
    data[mid : mid + 16] = bytes(b ^ 0xFF for b in data[mid : mid + 16])
    return bytes(data)


def silent_damage(jpeg: bytes) -> bytes:
    """One bit flipped in the entropy-coded data where libjpeg decodes on without a word
    (the first such byte from the middle of the scan): some pixels wrong, nothing said."""
    import torch

    from latecast.decode import libjpeg_says, read

    cpu, as_tensor = (
        torch.device("cpu"),
        lambda b: torch.frombuffer(bytearray(b), dtype=torch.uint8),
    )
    before = read([as_tensor(jpeg)], 3, cpu)[0]
    for at in range((jpeg.index(b"\xff\xda") + len(jpeg)) // 2, len(jpeg) - 2):
        data = bytearray(jpeg)
        data[at] ^= 0x10
        if 0xFF in data[at - 1 : at + 1] or libjpeg_says([as_tensor(data)], 3)[0]:
            continue
        if not torch.equal(read([as_tensor(data)], 3, cpu)[0], before):
            return bytes(data)
    raise AssertionError("no silent bit flip found")


def damage_mid_store(data_bin: Path, offsets, k: int, damage=damage_scan) -> None:
    """Damage file ``k`` of a jpeg store's data.bin in place (its size, head and tail still
    agree), after checking it lies outside the first and last MiB that opening samples."""
    start, end = int(offsets[k]), int(offsets[k + 1])
    assert (1 << 20) < start and end < data_bin.stat().st_size - (1 << 20)  # mid-store
    with open(data_bin, "r+b") as f:
        f.seek(start)
        damaged = damage(f.read(end - start))
        f.seek(start)
        f.write(damaged)


def shares(runs: list[dict], epoch: int, key: str = "seen") -> list[list[int]]:
    """Each launched rank's sample ids in ``epoch``, read off its ``[epoch, ids]`` records."""
    return [sum((ids for e, ids in r[key] if e == epoch), []) for r in runs]


def assert_two_halves(runs: list[dict], n: int, epochs: int = 2, key: str = "seen") -> None:
    """The reference check of a 2-rank run: in every epoch each rank saw its own half of the
    ``n`` samples, and together every sample once."""
    for epoch in range(epochs):
        a, b = shares(runs, epoch, key)
        assert len(a) == len(b) == n // 2 and sorted(a + b) == list(range(n)), (key, epoch)


def lightning_trainer(**kwargs):
    """A Lightning ``Trainer`` on the CPU that writes and prints nothing of its own."""
    import lightning as L

    quiet = dict(logger=False, enable_progress_bar=False, enable_model_summary=False)
    return L.Trainer(accelerator="cpu", **{**quiet, **kwargs})
