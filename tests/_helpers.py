"""Set-ups that several test files share (tests/ is on sys.path, launched or not)."""

from __future__ import annotations

import contextlib
import io
import os
import socket
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

TIMEOUT = 240  # seconds for one launched run: a hang fails instead of blocking CI
PNG = b"\x89PNG\r\n\x1a\n"  # the signature every PNG file starts with


def seed_of(*parts) -> int:
    """A seed from ``parts`` that is the same in every process (``hash`` of a str is not)."""
    return zlib.crc32(repr(parts).encode())


def small(n: int = 300, shape=(28, 28, 1), classes: int = 10, seed: int = 0, name: str = "small"):
    """A ``Dataset`` of ``n`` random uint8 images of ``shape`` (H, W, C) from ``seed``; sample
    ``i`` is labelled ``i % classes`` (classes named "0", "1", ...)."""
    import latecast

    rng = np.random.default_rng(seed)
    return latecast.from_arrays(
        rng.integers(0, 256, (n, *shape), dtype=np.uint8),
        np.arange(n) % classes,
        name=name,
        classes=[str(i) for i in range(classes)],
    )


def smooth(h: int, w: int, seed: int, channels: int = 3) -> np.ndarray:
    """A distinct photo-like uint8 image JPEG keeps well, a bright block top left (a turn or
    flip shows): ``(h, w, channels)``, ``(h, w)`` for 1 channel."""
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:h, 0:w]
    ramp = 40 + 160 * (xs * rng.uniform() + ys * rng.uniform()) / (h + w)
    img = ramp[..., None] * rng.uniform(0.6, 1, channels)
    img[: h // 3, : w // 4] = 240
    img = img.clip(0, 255).astype(np.uint8)
    return img[..., 0] if channels == 1 else img


def jpeg_bytes(pixels: np.ndarray, quality: int = 90) -> bytes:
    """``pixels`` (``(H, W)``, ``(H, W, 1)`` or ``(H, W, 3)`` uint8) as a JPEG file (Pillow)."""
    from PIL import Image

    if pixels.ndim == 3 and pixels.shape[2] == 1:
        pixels = pixels[..., 0]
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def one_line_error(proc, *mentions: str, rc: int = 1) -> str:
    """A command (``run_cli``'s result) failed with exit code ``rc``: one stderr line
    ``latecast: error: ...`` holding every one of ``mentions``, no traceback; the line."""
    lines = proc.err.strip().splitlines()
    assert proc.rc == rc and len(lines) == 1, proc.out[-2000:] + proc.err[-2000:]
    assert lines[0].startswith("latecast: error: "), proc.err
    assert "Traceback" not in proc.err + proc.out and "internal error" not in proc.err
    assert all(m in lines[0] for m in mentions), (mentions, lines[0])
    return lines[0]


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    """A real tmpfs of ``size`` mounted at ``path`` for the block; skipped where not allowed."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        mount = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]
        proc = subprocess.run(mount, capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("no mount command here: cannot make a real small filesystem")
    if proc.returncode:
        pytest.skip(f"cannot mount a tmpfs (needs root): {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


HOLD = """import sys, time
from latecast.trainer.rundir import claim
with claim(sys.argv[1], None, False):
    print("held", flush=True)
    time.sleep(900)
"""  # another run holding a folder, as `latecast train` holds its own


@contextlib.contextmanager
def held(out: Path):
    """Another process holding ``out`` as a run does (``rundir.claim``) for the block; then
    killed (``SIGKILL``, as a run that crashed)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait(30)


def write_tar(path: Path, members, mode: str = "w") -> None:
    """A tar file at ``path`` of ``(name, bytes)`` members, in order."""
    import tarfile

    with tarfile.open(path, mode) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def flip(path: Path, key: str) -> None:
    """One bit of ``key``'s JPEG scan data flipped in place: sizes, keys, offsets all kept."""
    import tarfile

    with tarfile.open(path) as tar:
        member = tar.getmember(f"{key}.jpg")
    data = bytearray(path.read_bytes())
    data[member.offset_data + member.size // 2] ^= 1
    path.write_bytes(bytes(data))


def tree(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, bytes | None]:
    """Every file under ``folder`` with its bytes, every folder as None (names in ``skip``
    left out): what must be there, unchanged, after a refused or failed write."""
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
        for p in sorted(folder.rglob("*"))
        if p.name not in skip
    }


def cifar_records(
    images: np.ndarray, labels: np.ndarray, coarse: np.ndarray | None = None
) -> bytes:
    """CIFAR binary records from (N, 32, 32, 3) images: the label byte (CIFAR-100: coarse,
    then fine), then the R, G, B planes."""
    planes = images.transpose(0, 3, 1, 2).reshape(len(images), 3072)  # (N, C*H*W)
    heads = labels[:, None] if coarse is None else np.stack([coarse, labels], 1)
    return np.concatenate([heads.astype(np.uint8), planes], 1).tobytes()


def assert_report(md: Path, png: Path, rows: dict[str, bool]) -> str:
    """A measuring tool's report: a table row ``| name |`` for each of ``rows`` marked True,
    none for those marked False, and its plot a PNG; returns the markdown."""
    text = md.read_text()
    for name, shown in rows.items():
        assert (f"| {name} |" in text) == shown, name
    assert png.read_bytes().startswith(PNG)
    return text


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

    from latecast.kinds.decode import libjpeg_says, read

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


def launch(*argv, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python *argv`` (one thread per process) under ``TIMEOUT``; it must exit 0, else its
    output's tails are the failure."""
    proc = subprocess.run(
        [sys.executable, *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
        cwd=cwd,  # where Lightning writes lightning_logs/
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerate(*argv, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``accelerate launch`` with 2 processes on the CPU: torchrun underneath, gloo."""
    return launch(
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",  # with ACCELERATE_USE_CPU: torchrun, gloo (--cpu alone runs 1 process)
        "--num_processes=2",
        "--num_machines=1",
        "--mixed_precision=no",
        "--dynamo_backend=no",
        f"--main_process_port={free_port()}",
        *argv,
        env={"ACCELERATE_USE_CPU": "1"},
        cwd=cwd,
    )


def finished(images, labels, where, mean=(0.0,), std=(1.0,), **settings):
    """What ``latecast.prepare.Prepare`` makes of uint8 ``(N, H, W, C)`` images and labels (or
    None) as batch ``where`` (epoch, rank, batch): the reference every way in must match."""
    import torch

    from latecast.fields import Image, Integer
    from latecast.prepare import Prepare

    plans = [Image(0, torch.uint8, tuple(images.shape))]
    values = [images] + ([] if labels is None else [labels.long()])
    plans += [] if labels is None else [Integer(1, torch.int64, tuple(labels.shape))]
    return Prepare(mean, std, **settings)(plans, values, where, images.device)


def draw_of(aug, seed: int, where: tuple, nhwc):
    """The draw ``wrap`` makes for uint8 ``(N, H, W, C)`` images as batch ``where``."""
    import torch

    from latecast.fields import Image
    from latecast.prepare import Prepare

    p, dev = Prepare((0.0,), (1.0,), augment=aug, seed=seed), nhwc.device
    p.seed_batch(where, dev)
    f = Image(0, torch.uint8, tuple(nhwc.shape))
    g, host = p.generator(dev), p.generator(torch.device("cpu"))
    return p.draw(f, f.sizes_of(nhwc), dev, g, host, None, where[0])


def lightning_hook(batch, where=(0, 0, 0), training=True, **options):
    """What ``PrepareOnDevice``'s two hooks make of ``batch`` on the CPU, called as Lightning
    calls them for batch ``where`` (epoch, global rank, batch index)."""
    import types

    import torch

    from latecast.integrations.lightning import PrepareOnDevice

    class Hooked:  # what Lightning's module gives the mixin: the base hook, ``training``
        def on_after_batch_transfer(self, batch, dataloader_idx):
            return batch

    module = type("Module", (PrepareOnDevice, Hooked), {"training": training})()
    moved = options.pop("moved", False)  # by a transfer_batch_to_device of the user's own
    module.prepare_on_device(**options)
    loop = types.SimpleNamespace(epoch_loop=types.SimpleNamespace(batch_idx=where[2] - 1))
    module.trainer = types.SimpleNamespace(
        fit_loop=loop, current_epoch=where[0], global_rank=where[1]
    )
    sent = batch if moved else module.transfer_batch_to_device(batch, torch.device("cpu"), 0)
    return module.on_after_batch_transfer(sent, 0)


def hooked_fit(train, val=None, trainer: dict | None = None, **options):
    """A ``PrepareOnDevice`` LightningModule (``prepare_on_device(**options)``, a zero weight
    for a model) fitted on ``train`` (and ``val``) by a real CPU ``Trainer(**trainer)``: its
    ``trained`` and ``validated`` batches, as each step saw them."""
    import lightning as L
    import torch
    from torch.utils._pytree import tree_map

    from latecast import PrepareOnDevice

    class Model(PrepareOnDevice, L.LightningModule):
        def __init__(self):
            super().__init__()
            self.prepare_on_device(**options)
            self.w = torch.nn.Parameter(torch.zeros(()))
            self.trained, self.validated = [], []

        def training_step(self, batch, i):
            self.trained.append(tree_map(torch.clone, batch))
            return self.w * (batch["image"] if isinstance(batch, dict) else batch[0]).float().mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), 0.1)

    class Validated(Model):  # a validation_step with no loader for it: Lightning warns
        def validation_step(self, batch, i):
            self.validated.append(tree_map(torch.clone, batch))

    model = Model() if val is None else Validated()
    lightning_trainer(enable_checkpointing=False, **(trainer or {})).fit(model, train, val)
    return model


def mover(name: str):
    """A Loader's ``transfer=`` for mover ``name``: ``float32``, the usual pipeline kept as a
    baseline outside the core, is its class (``latecast.trainer.baseline.Float32``)."""
    from latecast.trainer.baseline import Float32

    return Float32 if name == "float32" else name
