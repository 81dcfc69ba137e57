"""The golden cases: small seeded inputs through every path that moves and prepares a batch,
their outputs as flat lists of tensors (saved by ``make_golden.py``, compared bit for bit by
``tests/core/test_golden.py``). Built here from fixed seeds on the CPU, nothing from
``_helpers.py`` (a helper changed elsewhere must not change a case). A case is ``name ->
fn(tmp) -> list[tensor]`` (``tmp``: shared, the JPEG store converted once); JPEG cases run once
per CPU decoder, saved as ``name@decoder``."""

from __future__ import annotations

import io
import tarfile
import types
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

import latecast
from latecast.trainer.baseline import Float32  # the usual pipeline, kept as the baseline
from latecast.transforms import Mix  # public, though not among latecast's top-level names

# ---- the internals the cases reach: follow a move here, one line each ----------------------


def PrepareOnDevice() -> type:  # noqa: N802  (the Lightning mixin's class)
    from latecast.integrations.lightning import PrepareOnDevice

    return PrepareOnDevice


def index_shards(spec: str) -> None:
    """``latecast index SPEC``: the index a stream of WebDataset shards is opened by."""
    from latecast.storage.shards import write_index

    write_index(spec)


# ---- inputs -----------------------------------------------------------------------------------

DECODERS = ("simplejpeg", "torchcodec", "torchvision")
MEAN, STD = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)
CLASSES = 5


def smooth(h: int, w: int, seed: int) -> np.ndarray:
    """A distinct RGB image that JPEG keeps well: a coloured gradient with a bright block."""
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:h, 0:w]
    img = np.stack([40 + 160 * (xs * rng.uniform() + ys * rng.uniform()) / (h + w)] * 3, -1)
    img = img * rng.uniform(0.6, 1, 3)
    img[: h // 3, : w // 4] = 240
    return img.clip(0, 255).astype(np.uint8)


def jpeg_of(pixels: np.ndarray, quality: int = 90) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def images(n: int, seed: int, h: int = 10, w: int = 10, c: int = 3) -> torch.Tensor:
    """uint8 ``(n, h, w, c)`` noise."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, h, w, c), dtype=torch.uint8, generator=g)


def labels(n: int, seed: int, high: int = CLASSES) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, (n,), generator=g)


def dataset() -> latecast.Dataset:
    """25 images 10x10x3 (not a multiple of the batch or the world: partial batches, padding)."""
    return latecast.from_arrays(images(25, 1).numpy(), labels(25, 2).numpy().astype(np.uint8))


def jpeg_store(tmp: Path) -> latecast.Dataset:
    """A JPEG store (kept files, decoded by the prepare stage) of 24 files of mixed sizes."""
    out = tmp / "store"
    if not out.exists():
        folder = tmp / "folder"
        for k in range(24):
            sub = folder / f"class{k % 3}"
            sub.mkdir(parents=True, exist_ok=True)
            h, w = 12 + 4 * (k % 3), 12 + 2 * (k % 4)
            (sub / f"{k:02d}.jpg").write_bytes(jpeg_of(smooth(h, w, 100 + k)))
        latecast.convert_folder(
            folder, out, size="12x12", encoding="jpeg", test_fraction=0, workers=1, progress=False
        )
    return latecast.open_store(out)


def shards(tmp: Path) -> str:
    """Three WebDataset shards (KEY.jpg, KEY.cls; the last the test split), indexed: their
    spec, for ``load_dataset``."""
    folder, spec = tmp / "shards", str(tmp / "shards" / "shard-{000..002}.tar")
    if not folder.exists():
        folder.mkdir()
        for s, n in enumerate((7, 9, 4)):
            with tarfile.open(folder / f"shard-{s:03d}.tar", "w") as tar:
                for i in range(100 * s, 100 * s + n):
                    h, w = 12 + 2 * (i % 3), 14
                    files = {"jpg": jpeg_of(smooth(h, w, i)), "cls": str(i % 3).encode()}
                    for ext, data in files.items():
                        info = tarfile.TarInfo(f"{i:06d}.{ext}")
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))
        index_shards(spec)
    return spec


def jpeg_files(n: int, seed: int, h: int = 14, w: int = 18) -> list[bytes]:
    return [jpeg_of(smooth(h, w, seed + k)) for k in range(n)]


# ---- flattening what comes out ------------------------------------------------------------------


def flat(value: Any) -> list[torch.Tensor]:
    """The tensors of a batch in a fixed order (dicts by key order), cloned: a static
    Loader's buffers are overwritten by its next batch."""
    if torch.is_tensor(value):
        return [value.detach().clone()]
    if isinstance(value, dict):
        return [t for v in value.values() for t in flat(v)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in flat(v)]
    return []


def epochs(loader, n: int = 2) -> list[torch.Tensor]:
    """Every batch of ``n`` passes, flat."""
    return [t for _ in range(n) for batch in loader for t in flat(batch)]


# ---- the Loader -------------------------------------------------------------------------------

AUG_A = dict(crop=2, flip=0.5, cutout=4, jitter=0.3)
BF16_CL = dict(dtype=torch.bfloat16, channels_last=True)
AUG_B = dict(crop=3, fill="reflect", altflip=True, resized_crop=0.35)
MIX = dict(classes=CLASSES, mixup=0.4, cutmix=1.0)


def loader_case(
    transfer: str, static: bool, aug: dict, mix: bool, data=dataset, seed=7, **more
) -> Callable:
    def run(tmp: Path) -> list[torch.Tensor]:
        loader = latecast.Loader(
            data(),
            batch_size=12,
            device="cpu",
            transfer=Float32 if transfer == "float32" else transfer,
            seed=seed,
            augment=latecast.Augment(**aug) if aug else None,
            mix=Mix(**MIX) if mix else None,
            static=static,
            **more,
        )
        return epochs(loader)

    return run


def loader_cases() -> dict[str, Callable]:
    cases = {}
    for transfer in ("float32", "uint8", "prefetch", "resident"):
        for static in (False, True):
            s = "static" if static else "dynamic"
            cases[f"loader/{transfer}/{s}/a+mix"] = loader_case(transfer, static, AUG_A, True)
            cases[f"loader/{transfer}/{s}/b"] = loader_case(transfer, static, AUG_B, False)
        for rank in (0, 1):
            cases[f"loader/{transfer}/rank{rank}of2"] = loader_case(
                transfer, False, AUG_A, False, rank=rank, world_size=2
            )
        cases[f"loader/{transfer}/eval-bf16-cl"] = loader_case(
            transfer, True, {}, False, pad=False, shuffle=False, **BF16_CL
        )
        cases[f"loader/{transfer}/block-drop"] = loader_case(
            transfer, False, AUG_A, False, order="block:4:2", drop_last=True
        )
    return cases


def jpeg_loader_case(static: bool, aug: dict, mix: bool = False, stream=False, **more) -> Callable:
    def run(tmp: Path) -> list[torch.Tensor]:
        loader = latecast.Loader(
            latecast.load_dataset(shards(tmp)) if stream else jpeg_store(tmp),
            batch_size=10,
            device="cpu",
            transfer="jpeg",
            seed=11,
            augment=latecast.Augment(**aug) if aug else None,
            mix=Mix(classes=3, mixup=0.3) if mix else None,
            static=static,
            **more,
        )
        return epochs(loader)

    return run


JPEG_LOADER = {
    "jpeg-loader/centre": jpeg_loader_case(False, {}),
    "jpeg-loader/resized+flip": jpeg_loader_case(False, dict(resized_crop=0.25, flip=0.5)),
    "jpeg-loader/static/resized+crop+mix": jpeg_loader_case(
        True, dict(resized_crop=0.3, crop=2, cutout=3), mix=True
    ),
    "jpeg-loader/rank1of2-eval": jpeg_loader_case(
        True, {}, rank=1, world_size=2, pad=False, shuffle=False
    ),
    "stream-loader/resized+flip": jpeg_loader_case(
        False, dict(resized_crop=0.3, flip=0.5), stream=True
    ),
    "stream-loader/static/rank1of2+mix": jpeg_loader_case(
        True, dict(crop=2, cutout=3), mix=True, stream=True, rank=1, world_size=2
    ),
}


# ---- wrap, Mover, the Lightning hook -------------------------------------------------------------


def plain_batches(nchw: bool = False) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for k in range(3):
        x = images(6, 20 + k)
        out.append((x.permute(0, 3, 1, 2).contiguous() if nchw else x, labels(6, 30 + k)))
    return out


def field_batches() -> list[dict[str, Any]]:
    """Images, a mask, integers of every narrow width, floats, something that passes."""
    out = []
    for k in range(3):
        g = torch.Generator().manual_seed(40 + k)
        out.append(
            {
                "image": images(6, 50 + k),
                "mask": torch.randint(0, 4, (6, 10, 10), generator=g, dtype=torch.uint8),
                "u8": torch.randint(0, 200, (6,), generator=g),  # int64 -> uint8
                "i8": torch.randint(-100, 100, (6, 2), generator=g),  # -> int8
                "i16": torch.randint(-1000, 1000, (6,), generator=g),  # -> int16
                "i32": torch.randint(-(10**6), 10**6, (6, 3), generator=g),  # -> int32
                "tokens": torch.randint(0, 60000, (6, 5), generator=g),  # declared uint16
                "float": torch.randn(6, 4, generator=g),  # as it is
                "name": [f"s{k}-{i}" for i in range(6)],  # passes through
            }
        )
    return out


def jpeg_batches(masks: bool) -> list[dict[str, Any]]:
    out = []
    for k in range(2):
        b = {"jpg": jpeg_files(5, 60 + 10 * k), "label": labels(5, 70 + k, 3)}
        if masks:
            g = torch.Generator().manual_seed(80 + k)
            b["mask"] = torch.randint(0, 3, (5, 14, 18), generator=g, dtype=torch.uint8)
        out.append(b)
    return out


def masked() -> list[dict[str, Any]]:
    return jpeg_batches(True)


def wrap_case(batches: Callable[[], Any], passes: int = 2, **options) -> Callable:
    def run(tmp: Path) -> list[torch.Tensor]:
        made = batches()
        wrapped = latecast.wrap(made, device="cpu", **options)
        return epochs(wrapped, passes)

    return run


def dataloader(nchw: bool) -> Callable[[], Any]:
    def make():
        x = torch.cat([b[0] for b in plain_batches(nchw)])
        y = torch.cat([b[1] for b in plain_batches(nchw)])
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)

    return make


AUG = latecast.Augment(crop=2, flip=0.5, cutout=3, jitter=0.2)
GEO = latecast.Augment(crop=2, flip=0.5, resized_crop=0.4)
FIELDS = {"mask": "mask", "tokens": torch.uint16, "i32": (torch.int32, torch.int32)}
NORM = dict(mean=MEAN, std=STD)
JPEG_MASKS = {"jpg": latecast.jpeg(12), "mask": "mask"}

WRAP = {
    "wrap/list-nhwc": wrap_case(plain_batches, **NORM, augment=AUG, seed=3),
    "wrap/list-nchw": wrap_case(lambda: plain_batches(True), **NORM, augment=AUG, seed=4),
    "wrap/generator-plain": wrap_case(lambda: iter(plain_batches()), passes=1),
    "wrap/dataloader-nhwc": wrap_case(dataloader(False), **NORM, augment=AUG),
    "wrap/dataloader-nchw-bf16-cl": wrap_case(
        dataloader(True), **NORM, layout="NCHW", **BF16_CL, augment=GEO, seed=9
    ),
    "wrap/fields-masks": wrap_case(field_batches, **NORM, augment=GEO, fields=FIELDS, seed=5),
    "wrap/fields-no-aug": wrap_case(field_batches, fields=FIELDS),
    "wrap/mix+erase": wrap_case(
        plain_batches,
        **NORM,
        augment=AUG,
        seed=6,
        mix=Mix(classes=CLASSES, mixup=0.5, cutmix=1.0),
        erase=latecast.Erasing(p=0.7, value="random"),
    ),
    "wrap/erase-per-channel": wrap_case(
        plain_batches, **NORM, erase=latecast.Erasing(p=0.9, value=(0.1, 0.2, 0.3)), seed=2
    ),
}

JPEG_WRAP = {
    "wrap-jpeg/declared-resized": wrap_case(
        lambda: jpeg_batches(False), **NORM, augment=GEO, fields={"jpg": latecast.jpeg(12)}
    ),
    "wrap-jpeg/recognised-centre": wrap_case(lambda: jpeg_batches(False), **NORM),
    "wrap-jpeg/masks": wrap_case(
        masked,
        **NORM,
        augment=GEO,
        seed=8,
        fields={"jpg": latecast.jpeg((12, 14)), "mask": "mask"},
    ),
    "wrap-jpeg/masks-centre+mix": wrap_case(
        masked, **NORM, dtype=torch.bfloat16, fields=JPEG_MASKS, mix=Mix(classes=3, mixup=0.3)
    ),
}


def mover_case(batches: Callable[[], list], **options) -> Callable:
    def run(tmp: Path) -> list[torch.Tensor]:
        mover = latecast.Mover(device="cpu", **options)
        out = [t for b in batches() for t in flat(mover(b))]
        mover.set_epoch(1)
        return out + [t for b in batches()[:1] for t in flat(mover(b))]

    return run


MOVER = {
    "mover/tuples": mover_case(plain_batches, **NORM, augment=AUG, seed=12),
    "mover/fields": mover_case(field_batches, **NORM, augment=GEO, fields=FIELDS, seed=13),
    "mover/plain": mover_case(plain_batches),
}
JPEG_MOVER = {
    "mover-jpeg/masks": mover_case(masked, **NORM, augment=GEO, fields=JPEG_MASKS),
}


class _Hooked:
    """What Lightning gives the mixin: a base hook that returns the batch, ``training`` and a
    trainer's epoch, global rank and batch index."""

    training = True

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch


def lightning_case(batches: Callable[[], list], **options) -> Callable:
    """The hook's batches as Lightning hands them: packed by the mixin's
    ``transfer_batch_to_device``, finished by its ``on_after_batch_transfer``."""

    def run(tmp: Path) -> list[torch.Tensor]:
        module = type("Module", (PrepareOnDevice(), _Hooked), {})()
        if options:
            module.prepare_on_device(**options)
        out = []
        for epoch, rank, training in ((0, 0, True), (1, 1, True), (0, 0, False)):
            module.training = training
            for step, batch in enumerate(batches()[:2]):
                loop = types.SimpleNamespace(epoch_loop=types.SimpleNamespace(batch_idx=step))
                trainer = types.SimpleNamespace(
                    fit_loop=loop, current_epoch=epoch, global_rank=rank
                )
                module.trainer = trainer
                batch = module.transfer_batch_to_device(batch, torch.device("cpu"), 0)
                out += flat(module.on_after_batch_transfer(batch, 0))
        return out

    return run


LIGHTNING = {
    "lightning/tuples": lightning_case(plain_batches, **NORM, augment=AUG, seed=14),
    "lightning/fields": lightning_case(
        field_batches,
        **NORM,
        augment=GEO,
        fields=FIELDS,
        seed=15,
        erase=latecast.Erasing(p=0.6),
    ),
    "lightning/mix-bf16": lightning_case(
        plain_batches, **NORM, **BF16_CL, mix=Mix(classes=CLASSES, cutmix=1.0)
    ),
    "lightning/unprepared": lightning_case(plain_batches),
}

# ---- the transforms called as they are ---------------------------------------------------------


def transform_case(fn: Callable, *args: Any) -> Callable:
    def run(tmp: Path) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(21)
        return [t for _ in range(2) for t in flat(fn(*args, generator=g))]

    return run


def floats() -> torch.Tensor:
    return torch.randn(6, 3, 10, 10, generator=torch.Generator().manual_seed(22))


TRANSFORMS = {
    "transforms/augment": transform_case(latecast.Augment(**AUG_A), images(6, 23)),
    "transforms/augment-geo": transform_case(GEO, images(6, 24)),
    "transforms/augment-altflip": transform_case(
        lambda x, generator: latecast.Augment(**AUG_B)(
            x, generator, epoch=1, indices=torch.arange(6), seed=3
        ),
        images(6, 25),
    ),
    "transforms/erasing": transform_case(latecast.Erasing(p=0.8, value="random"), floats()),
    "transforms/mix": transform_case(Mix(**MIX), floats(), labels(6, 26)),
}


# ---- the kinds added since b931d8b, saved at a755c18 ---------------------------------------------


def deep_dataset() -> latecast.Dataset:
    """25 uint16 images 10x10x2 (a 16-bit store's split), values past 8 bits."""
    g = torch.Generator().manual_seed(90)
    x = torch.randint(0, 60000, (25, 10, 10, 2), generator=g).numpy().astype(np.uint16)
    return latecast.from_arrays(x, labels(25, 91).numpy().astype(np.uint8))


def deep_batches() -> list[dict[str, Any]]:
    """int16 CT-like slices (N, 1, H, W) with a mask, and uint16 bands (N, H, W, 4)."""
    out = []
    for k in range(3):
        g = torch.Generator().manual_seed(100 + k)
        out.append(
            {
                "ct": torch.randint(-1024, 3000, (6, 1, 10, 12), generator=g).to(torch.int16),
                "mask": torch.randint(0, 3, (6, 10, 12), generator=g, dtype=torch.uint8),
                "bands": torch.randint(0, 10000, (6, 10, 12, 4), generator=g).to(torch.uint16),
                "label": labels(6, 110 + k),
            }
        )
    return out


def audio_batches(ragged: bool) -> list[Any]:
    out = []
    for k in range(3):
        g = torch.Generator().manual_seed(120 + k)
        if ragged:
            clips = [
                torch.randint(-20000, 20000, (n,), generator=g).to(torch.int16)
                for n in (300, 420, 380, 520, 410)
            ]
        else:
            clips = torch.randint(-20000, 20000, (5, 2, 500), generator=g).to(torch.int16)
        out.append({"audio": clips, "label": labels(5, 130 + k)})
    return out


def clip_batches(layout: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for k in range(3):
        g = torch.Generator().manual_seed(140 + k)
        x = torch.randint(0, 256, (4, 3, 12, 14, 3), generator=g, dtype=torch.uint8)  # NTHWC
        x = x.permute(0, 1, 4, 2, 3).contiguous() if layout == "NTCHW" else x
        out.append((x, labels(4, 150 + k)))
    return out


DEEP_FIELDS = {
    "ct": latecast.image16(window=(-1000, 400)),
    "mask": "mask",
    "bands": latecast.image16(mean=(1000.0, 2000.0, 3000.0, 4000.0), std=(500.0,) * 4),
}
KINDS = {
    **{
        f"loader16/{t}/{'static' if s else 'dynamic'}": loader_case(
            t, s, AUG_B if s else {}, False, deep_dataset, 17
        )
        for t in ("float32", "uint8", "prefetch", "resident")
        for s in (False, True)
    },
    "loader16/uint8/geo+mix": loader_case(
        "uint8", False, dict(crop=2, flip=0.5), True, deep_dataset, 17
    ),
    "wrap16/fields-geo+erase": wrap_case(
        deep_batches, fields=DEEP_FIELDS, augment=GEO, seed=21, erase=latecast.Erasing(p=0.7)
    ),
    "wrap16/fields-plain-bf16": wrap_case(deep_batches, fields=DEEP_FIELDS, **BF16_CL),
    "mover16/fields": mover_case(deep_batches, fields=DEEP_FIELDS, augment=GEO, seed=22),
    "lightning16/fields": lightning_case(deep_batches, fields=DEEP_FIELDS, augment=GEO, seed=23),
    "lightning16/packed": lightning_case(deep_batches, fields=DEEP_FIELDS, augment=GEO, seed=23),
    "lightning/packed-fields": lightning_case(
        field_batches, **NORM, augment=GEO, fields=FIELDS, seed=15
    ),
    "lightning/packed-mix": lightning_case(
        plain_batches, **NORM, augment=AUG, mix=Mix(classes=CLASSES, cutmix=1.0)
    ),
    "lightning-audio/packed": lightning_case(
        lambda: audio_batches(True),
        seed=30,
        fields={"audio": latecast.waveform(400, pad=True)},
    ),
    "wrap-audio/ragged-gain-mel": wrap_case(
        lambda: audio_batches(True),
        seed=24,
        fields={"audio": latecast.waveform(400, pad=True, gain=(-6.0, 6.0), mel={"n_mels": 16})},
    ),
    "wrap-audio/rows-centre": wrap_case(
        lambda: audio_batches(False),
        seed=25,
        fields={"audio": latecast.waveform(450, crop="centre", gain=(-3.0, 0.0))},
    ),
    "mover-audio/rows-random": mover_case(
        lambda: audio_batches(False), seed=26, fields={"audio": latecast.waveform(450)}
    ),
    "wrap-clip/crop+jitter+cutout": wrap_case(
        lambda: clip_batches("NTHWC"),
        **NORM,
        seed=27,
        augment=latecast.Augment(crop=2, flip=0.5, jitter=0.3, cutout=3),
        fields={0: latecast.clip(3, size=(10, 12))},
    ),
    "wrap-clip/resized-ntchw-out": wrap_case(
        lambda: clip_batches("NTCHW"),
        **NORM,
        seed=28,
        augment=latecast.Augment(resized_crop=0.5, flip=0.5),
        fields={0: latecast.clip(3, "NTCHW", size=8, out="NTCHW")},
    ),
    "wrap-clip/centre-bf16": wrap_case(
        lambda: clip_batches("NTHWC"),
        **NORM,
        dtype=torch.bfloat16,
        fields={0: latecast.clip(3, size=(9, 9))},
    ),
    "mover-clip/crop": mover_case(
        lambda: clip_batches("NTHWC"),
        **NORM,
        seed=29,
        augment=latecast.Augment(crop=1, flip=0.5),
        fields={0: latecast.clip(3)},
    ),
}


# ---- all of them ------------------------------------------------------------------------------

Cases = dict[str, Callable[[Path], list[torch.Tensor]]]
CASES: Cases = {**loader_cases(), **WRAP, **MOVER, **LIGHTNING, **TRANSFORMS}
SINCE: Cases = KINDS  # saved at a755c18
JPEG_SINCE: Cases = {
    "lightning-jpeg/packed-masks": lightning_case(
        masked, **NORM, augment=GEO, seed=31, fields=JPEG_MASKS
    ),
    "wrap-jpeg/colour+erase": wrap_case(
        lambda: jpeg_batches(False),
        **NORM,
        seed=32,
        augment=latecast.Augment(resized_crop=0.5, flip=0.5, jitter=0.3, cutout=3),
        erase=latecast.Erasing(p=0.8),
        fields={"jpg": latecast.jpeg(12)},
    ),
    "jpeg-loader/prefetched-eval": jpeg_loader_case(False, {}, shuffle=False, pad=False),
}
JPEG_CASES: Cases = {**JPEG_LOADER, **JPEG_WRAP, **JPEG_MOVER}


def keys() -> list[tuple[str, str | None]]:
    """``(case, decoder)`` of every output: decoder None for the cases without JPEG files."""
    return [(c, None) for c in CASES] + [(c, d) for d in DECODERS for c in JPEG_CASES]


def since() -> list[tuple[str, str | None]]:
    """The same of the cases saved at a755c18 (``a755c18.pt``): the kinds added after b931d8b."""
    return [(c, None) for c in SINCE] + [(c, d) for d in DECODERS for c in JPEG_SINCE]


def key(case: str, decoder: str | None) -> str:
    return case if decoder is None else f"{case}@{decoder}"


def run(case: str, tmp: Path) -> list[torch.Tensor]:
    """One case's outputs; a JPEG case decodes with the process's CPU decoder, chosen by the
    caller (``LATECAST_DECODER``, as the suite's ``decoder`` fixture does)."""
    return {**CASES, **JPEG_CASES, **SINCE, **JPEG_SINCE}[case](tmp)
