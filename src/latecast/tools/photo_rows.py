"""``latecast bench``'s photo rows: generated 500x375 JPEGs in WebDataset shards, decoded,
RandomResizedCrop(224), flipped and normalized by the workers (``photos-float32``) or by
``latecast.wrap`` on the device (``photos-wrap``); read by webdataset, else by ``tarfile``."""

from __future__ import annotations

import functools
import io
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import torch

from ..integrations.dataloader import wrap
from ..kinds.decode import decoder_on
from ..kinds.jpeg import jpeg
from ..transforms import Augment
from . import measure

PHOTO, CROP, SHARDS = (375, 500), 224, 4  # (H, W) as ImageNet's typical photo; crop; shards
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet's


def write_shards(n: int, root: Path, seed: int) -> list[str]:
    """``n`` photo-like JPEGs (smooth colour fields with edges, quality 90, ~60 KB) in
    ``SHARDS`` tar shards as WebDataset writes them (``KEY.jpg``, ``KEY.cls``)."""
    from PIL import Image

    rng, paths = np.random.default_rng(seed), []
    for s in range(SHARDS):
        paths.append(str(root / f"photos-{s:03d}.tar"))
        with tarfile.open(paths[-1], "w") as tar:
            for i in range(s, n, SHARDS):
                small = rng.integers(0, 256, (PHOTO[0] // 25, PHOTO[1] // 25, 3), dtype=np.uint8)
                im = Image.fromarray(small).resize(PHOTO[::-1], Image.BICUBIC)
                buf = io.BytesIO()
                im.save(buf, "JPEG", quality=90)
                for ext, data in (("jpg", buf.getvalue()), ("cls", str(i % 10).encode())):
                    info = tarfile.TarInfo(f"{i:07d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return paths


class Usual:
    """A worker's work the usual way (a class: spawned workers pickle it)."""

    def __init__(self) -> None:
        from torchvision import transforms as T

        crop = [T.RandomResizedCrop(CROP), T.RandomHorizontalFlip()]
        self.tf = T.Compose([*crop, T.ToTensor(), T.Normalize(MEAN, STD)])

    def __call__(self, data: bytes) -> torch.Tensor:
        from PIL import Image

        return self.tf(Image.open(io.BytesIO(data)).convert("RGB"))


def _files(samples: list) -> tuple[list, torch.Tensor]:  # the wrap row's batches: bytes kept
    return [s[0] for s in samples], torch.tensor([s[1] for s in samples])


class TarPhotos(torch.utils.data.IterableDataset):
    """The shards' ``(jpg, cls)`` pairs, a worker's own shards (without webdataset)."""

    def __init__(self, paths: list[str], image=None) -> None:
        self.paths, self.image = paths, image

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        k, n = (info.id, info.num_workers) if info else (0, 1)
        for path in self.paths[k::n]:
            with tarfile.open(path) as tar:
                parts: dict[str, bytes] = {}
                for m in tar:
                    parts[m.name.rsplit(".", 1)[1]] = tar.extractfile(m).read()
                    if len(parts) == 2:
                        jpg, cls = parts.pop("jpg"), parts.pop("cls")
                        yield (self.image(jpg) if self.image else jpg), int(cls)


def loaders(paths: list[str], batch: int, workers: int) -> tuple[str, object, object]:
    """(reader, the usual DataLoader, the DataLoader whose batches wrap takes). Workers stay
    alive between passes, so ``measure.cpu_seconds`` counts them."""
    DataLoader = functools.partial(measure.dataloader, workers=workers, seed=None, persistent=True)
    try:
        import webdataset as wds
    except ImportError:
        usual = DataLoader(TarPhotos(paths, Usual()), batch)
        files = DataLoader(TarPhotos(paths), batch, collate_fn=_files)
        return "tarfile", usual, files

    def shards(image):
        return (
            wds.WebDataset(paths, shardshuffle=False, empty_check=False)
            .to_tuple("jpg", "cls")
            .map_tuple(image, int)
            .batched(batch, partial=True)
        )

    usual, files = DataLoader(shards(Usual()), None), DataLoader(shards(None), None)
    return f"webdataset {wds.__version__}", usual, files


def photo_rows(n: int, batch: int, workers: int, repeats: int, seed: int, device) -> dict:
    """Both rows over ``n`` generated photos: images/s, host CPU s and bytes per epoch."""
    batches = -(-n // batch)
    with tempfile.TemporaryDirectory(prefix="latecast-photos-") as tmp:
        paths = write_shards(n, Path(tmp), seed)
        reader, usual, files = loaders(paths, batch, workers)
        aug = Augment(resized_crop=0.08, flip=0.5)
        wrapped = wrap(files, mean=MEAN, std=STD, device=device, augment=aug, seed=seed,
                       fields={0: jpeg(CROP)})  # fmt: skip
        runs = {
            "photos-float32": measure.passes(
                lambda dl=usual: measure.to_device(iter(dl), device), batches, repeats, device
            ),
            "photos-wrap": measure.passes(lambda w=wrapped: iter(w), batches, repeats, device),
        }
        moved = wrapped.stats
        jpeg_bytes = sum(Path(p).stat().st_size for p in paths)  # about: the tar headers too
        del usual, files, wrapped
    usual = n * (3 * CROP * CROP * 4 + 8)  # float32 images, int64 labels
    # wrap's: of every batch it read, the same share of each is its bytes
    h2d = {"photos-float32": usual, "photos-wrap": usual * moved.h2d_bytes // moved.usual_bytes}
    about = dict(images=n, photo=list(PHOTO), crop=CROP, workers=workers, reader=reader)
    about.update(decoder=decoder_on(device), shard_bytes=jpeg_bytes)
    return {**about, **measure.host_rows(runs, n, h2d)}
