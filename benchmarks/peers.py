"""latecast side by side with FFCV, DALI (CPU) and the torchvision DataLoader, one run.

    python benchmarks/peers.py --ffcv-python /work/peers/ffcv/bin/python \\
        --dali-python /work/peers/dali/bin/python --rounds 3

From the same images it writes each peer's format under ``--work`` (kept for the next run):
a latecast raw store and JPEG store (``latecast.convert_folder``, what ``latecast convert``
runs), FFCV ``.beton`` files (raw pixels, and the JPEG files' own bytes), the JPEG files
themselves with their labels for DALI, uint8 arrays for torchvision. Then every round runs
every (workload, threads, peer) once, each in a fresh process under the peer's own Python:
a warm-up of ``--warmup`` batches (FFCV compiles its pipeline there), then one timed epoch,
its CPU time the process's user + system seconds (``getrusage``, its DataLoader workers
included). The table shows medians over the rounds. Installs nothing: a peer whose Python
is not given, or cannot import it, is left out with one line saying so.

Workloads (float32 NCHW contiguous out, normalized with one mean/std per dataset, device cpu):

- ``cifar-raw``: CIFAR-10 train (the JPEG copy, decoded once), crop (zero padding 4) + flip
  (p 0.5) + normalize; latecast ``resident`` on its raw store, FFCV raw ``.beton``,
  torchvision (PIL per image, as ``datasets.CIFAR10``: RandomCrop, RandomHorizontalFlip,
  ToTensor, Normalize).
- ``cifar-jpeg``: the same from the JPEG files: latecast JPEG store, FFCV ``.beton`` of the
  same JPEG bytes, DALI (``readers.file`` + ``decoders.image`` + ``slice`` with zero padding +
  ``crop_mirror_normalize``), and the user's own DataLoader of the image folder through
  ``latecast.wrap``: ``wrap-jpeg`` (``latecast.jpeg_folder``, the files as a JPEG field)
  and ``wrap`` (torchvision's ``ImageFolder`` + ``PILToTensor``, PIL decoding in the
  workers), each with ``--loader-workers`` worker processes (2; their CPU counted),
  ``persistent_workers=True`` (forked once for every epoch, as PyTorch advises for
  training over many epochs; ``--fork-workers`` forks them again for each epoch, the
  DataLoader's default). ``wrap-held``: the ``wrap-jpeg`` batches read before the timing
  and held in memory (wrap's own work, without the DataLoader's hand-off).
- ``photos``: ``--photos`` ImageNet-shaped JPEGs (``synthetic_photos.py``), decode +
  RandomResizedCrop(224, scale (0.08, 1), ratio (3/4, 4/3)) + flip + normalize; CPU-ms
  per image. The wrap rows as for CIFAR (``wrap``: RandomResizedCrop by torchvision in
  the workers, the flip by wrap).
- ``mnist``: the MNIST train images, normalize only.

Where a peer cannot do exactly the same: FFCV's ``NormalizeImage`` takes 3 channels only,
so its MNIST row casts (``Convert``) and runs torchvision's ``Normalize`` on each batch;
FFCV decodes with libjpeg-turbo's fast integer IDCT (``TJFLAG_FASTDCT``: cheaper, up to a
few grey levels off) and resizes with OpenCV's ``INTER_AREA``, DALI and latecast with
antialiased linear interpolation, torchvision with PIL's bilinear filter; DALI's reader
shuffles through a 1024-sample buffer (not a full permutation) and runs whole batches, so
its epoch is ceil(N / batch) batches, with int32 labels (int64 elsewhere).
Threads: latecast ``torch.set_num_threads(T)``, FFCV ``num_workers=T``, DALI
``num_threads=T``, torchvision ``num_workers=0`` at 1 thread, else T worker processes; the
wrap rows ``torch.set_num_threads(T)`` beside their ``--loader-workers``.
The last stdout line is JSON (also written to ``--json``).

The peers' venvs, as built for issue 48 (Debian 12, Python 3.11; cupy is imported only by
FFCV's GPU normalize)::

    apt-get install -y libopencv-dev libturbojpeg0-dev pkg-config
    python3 -m venv /work/peers/ffcv && python3 -m venv /work/peers/dali
    /work/peers/dali/bin/pip install torch==2.14.1 torchvision==0.29.1 nvidia-dali-cuda120==2.4.0
    /work/peers/ffcv/bin/pip install torch==2.14.1 torchvision==0.29.1 numpy numba \
        opencv-python-headless cupy-cuda12x pkgconfig assertpy tqdm psutil terminaltables \
        fastargs matplotlib pandas setuptools wheel Cython
    /work/peers/ffcv/bin/pip install --no-build-isolation ffcv==1.0.2  # built from its sdist
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import math
import os
import platform
import resource
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "datasets"
PEERS_OF = {  # workload -> the peers that run it, in table order
    "cifar-raw": ("latecast", "ffcv", "torchvision"),
    "cifar-jpeg": ("latecast", "wrap-jpeg", "wrap-held", "wrap", "ffcv", "dali"),
    "photos": ("latecast", "wrap-jpeg", "wrap-held", "wrap", "ffcv", "dali", "torchvision"),
    "mnist": ("latecast", "ffcv", "torchvision"),
}
OURS = ("latecast", "wrap-jpeg", "wrap-held", "wrap")  # run by this Python, latecast inside
MODULE = {**dict.fromkeys(OURS, "latecast"), "ffcv": "ffcv", "dali": "nvidia.dali"}
MODULE["torchvision"] = "torchvision"
DIST = {**dict.fromkeys(OURS, "latecast"), "ffcv": "ffcv", "dali": "nvidia-dali-cuda120"}
PHOTO = 224  # RandomResizedCrop's output side
CROP, FLIP, SCALE, RATIO = 4, 0.5, (0.08, 1.0), (3 / 4, 4 / 3)


# ---- one run, in its own process: a peer's epochs of (images, labels) ------------------


def latecast_epochs(spec: dict):
    import dataclasses

    import latecast

    d, w = spec["data"], spec["workload"]
    stats = {"mean": tuple(spec["mean"]), "std": tuple(spec["std"])}
    if w == "mnist":
        ds = latecast.from_arrays(np.load(d["images"]), np.load(d["labels"]), **stats)
    else:
        store = latecast.open_store(d["jpeg_store" if w != "cifar-raw" else "raw_store"])
        ds = dataclasses.replace(store, **stats)
    augment = {
        "cifar-raw": latecast.Augment(crop=CROP, flip=FLIP),
        "cifar-jpeg": latecast.Augment(crop=CROP, flip=FLIP),
        "photos": latecast.Augment(resized_crop=SCALE[0], flip=FLIP),
    }.get(w)
    transfer = "jpeg" if w in ("cifar-jpeg", "photos") else "resident"
    loader = latecast.Loader(ds, spec["batch_size"], "cpu", transfer, augment=augment)
    state = {"epoch": 0}

    def epoch():
        loader.set_epoch(state["epoch"])  # from its start, also after a warm-up broke off
        state["epoch"] += 1
        return iter(loader)

    return epoch


def wrap_epochs(spec: dict):
    """``latecast.wrap`` over the user's own DataLoader of the image folder: ``wrap-jpeg``
    the files' bytes (``latecast.jpeg_folder``) as a JPEG field, decoded, cropped, flipped
    and normalized by wrap; ``wrap`` an ImageFolder decoded by PIL in the workers
    (``PILToTensor``; photos: RandomResizedCrop there too), flipped, shifted and normalized
    by wrap. Both with ``--loader-workers`` worker processes, kept from epoch to epoch
    unless ``--fork-workers``. ``wrap-held``: wrap-jpeg's batches read once before the
    timing (no workers) and held in memory, the same ones every epoch: wrap's own work on
    them, without the DataLoader's hand-off from its workers."""
    import torch
    from torchvision import datasets
    from torchvision import transforms as T

    import latecast

    photos = spec["workload"] == "photos"
    size = (PHOTO, PHOTO) if photos else (32, 32)
    held = spec["peer"] == "wrap-held"
    if spec["peer"] in ("wrap-jpeg", "wrap-held"):
        samples, fields = latecast.jpeg_folder(spec["data"]["folder"]), {0: latecast.jpeg(size)}
        augment = latecast.Augment(resized_crop=SCALE[0], flip=FLIP) if photos else None
    else:
        crop = [T.RandomResizedCrop(PHOTO, scale=SCALE, ratio=RATIO)] if photos else []
        samples = datasets.ImageFolder(spec["data"]["folder"], T.Compose([*crop, T.PILToTensor()]))
        fields, augment = None, latecast.Augment(flip=FLIP) if photos else None
    augment = augment or latecast.Augment(crop=CROP, flip=FLIP)
    workers = 0 if held else spec["loader_workers"]
    loader = torch.utils.data.DataLoader(
        samples, spec["batch_size"], shuffle=True, num_workers=workers,
        generator=torch.Generator().manual_seed(0),
        persistent_workers=workers > 0 and not spec["fork_workers"],
    )  # fmt: skip
    loader = list(loader) if held else loader
    stats = {"mean": spec["mean"], "std": spec["std"]}
    wrapped = latecast.wrap(loader, device="cpu", augment=augment, fields=fields, **stats)
    state = {"epoch": 0}

    def epoch():
        wrapped.set_epoch(state["epoch"])
        state["epoch"] += 1
        return iter(wrapped)

    return epoch


def ffcv_epochs(spec: dict):
    import torch
    from ffcv.fields.decoders import (
        IntDecoder,
        NDArrayDecoder,
        RandomResizedCropRGBImageDecoder,
        SimpleRGBImageDecoder,
    )
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import (
        Convert,
        ModuleWrapper,
        NormalizeImage,
        RandomHorizontalFlip,
        RandomTranslate,
        Squeeze,
        ToTensor,
        ToTorchImage,
    )
    from torchvision.transforms import Normalize

    w, mean, std = spec["workload"], np.array(spec["mean"]) * 255, np.array(spec["std"]) * 255
    out = [ToTensor(), ToTorchImage(channels_last=False)]  # (N, C, H, W) contiguous
    if w == "mnist":  # NormalizeImage takes 3 channels only
        image = [
            NDArrayDecoder(),
            *out,
            Convert(torch.float32),
            ModuleWrapper(Normalize(mean, std)),
        ]
    else:
        decode = (
            [RandomResizedCropRGBImageDecoder((PHOTO, PHOTO), scale=SCALE, ratio=RATIO)]
            if w == "photos"
            else [SimpleRGBImageDecoder(), RandomTranslate(padding=CROP, fill=(0, 0, 0))]
        )
        normalize = NormalizeImage(mean, std, np.float32)
        image = [*decode, RandomHorizontalFlip(FLIP), normalize, *out]
    beton = spec["data"]["raw_beton" if w == "cifar-raw" else "beton"]
    loader = Loader(
        beton,
        batch_size=spec["batch_size"],
        num_workers=spec["threads"],
        order=OrderOption.RANDOM,
        seed=0,
        drop_last=False,
        os_cache=True,
        pipelines={"image": image, "label": [IntDecoder(), ToTensor(), Squeeze()]},
    )
    return lambda: iter(loader)


def dali_epochs(spec: dict):
    import torch
    from nvidia.dali import fn, pipeline_def, types

    w, batch = spec["workload"], spec["batch_size"]
    files = json.loads(Path(spec["data"]["files"]).read_text())
    mean, std = [m * 255 for m in spec["mean"]], [s * 255 for s in spec["std"]]

    @pipeline_def(batch_size=batch, num_threads=spec["threads"], device_id=None, seed=0)
    def pipeline():
        jpegs, labels = fn.readers.file(
            files=[f for f, *_ in files], labels=[label for _, label, *_ in files],
            random_shuffle=True,
        )  # fmt: skip
        if w == "photos":
            images = fn.decoders.image_random_crop(
                jpegs, device="cpu", output_type=types.RGB, random_area=list(SCALE),
                random_aspect_ratio=list(RATIO), num_attempts=10,
            )  # fmt: skip
            images = fn.resize(images, resize_x=PHOTO, resize_y=PHOTO)
        else:  # zero padding CROP, then a 32x32 window: RandomCrop(32, padding=4)
            images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
            start = fn.random.uniform(
                values=list(range(-CROP, CROP + 1)), shape=2, dtype=types.INT32
            )
            images = fn.slice(
                images, start, [32, 32], axes=[0, 1], out_of_bounds_policy="pad", fill_values=0
            )
        images = fn.crop_mirror_normalize(
            images, dtype=types.FLOAT, output_layout="CHW", mean=mean, std=std,
            mirror=fn.random.coin_flip(probability=FLIP),
        )  # fmt: skip
        return images, labels

    pipe = pipeline()
    pipe.build()

    def epoch():
        for _ in range(math.ceil(len(files) / batch)):
            images, labels = pipe.run()
            yield torch.from_numpy(images.as_array()), torch.from_numpy(labels.as_array())

    return epoch


class PILArrays:
    """What torchvision's ``CIFAR10``/``MNIST.__getitem__`` do: a PIL image per sample."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, transform) -> None:
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        from PIL import Image

        img = self.images[i]
        return self.transform(Image.fromarray(img[..., 0] if img.shape[2] == 1 else img)), int(
            self.labels[i]
        )


def torchvision_epochs(spec: dict):
    import torch
    from torchvision import datasets
    from torchvision import transforms as T

    d, w = spec["data"], spec["workload"]
    tail = [T.ToTensor(), T.Normalize(spec["mean"], spec["std"])]
    if w == "photos":
        crop = T.RandomResizedCrop(PHOTO, scale=SCALE, ratio=RATIO)
        samples = datasets.ImageFolder(
            d["folder"], T.Compose([crop, T.RandomHorizontalFlip(FLIP), *tail])
        )
    else:
        aug = (
            [T.RandomCrop(32, padding=CROP), T.RandomHorizontalFlip(FLIP)]
            if w == "cifar-raw"
            else []
        )
        images = np.load(d["images"], mmap_mode="r")
        samples = PILArrays(images, np.load(d["labels"]), T.Compose([*aug, *tail]))
    workers = 0 if spec["threads"] == 1 else spec["threads"]
    loader = torch.utils.data.DataLoader(
        samples, spec["batch_size"], shuffle=True, num_workers=workers,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    return lambda: iter(loader)


EPOCHS = {"latecast": latecast_epochs, "ffcv": ffcv_epochs, "dali": dali_epochs}
EPOCHS |= {"torchvision": torchvision_epochs, "wrap": wrap_epochs}
EPOCHS |= {"wrap-jpeg": wrap_epochs, "wrap-held": wrap_epochs}


def cpu_seconds() -> float:
    """User + system seconds of this process (all threads), its waited-for children and
    its children still running (persistent DataLoader workers; read from /proc)."""
    own, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime + running_children()


def running_children() -> float:
    """User + system seconds so far of this process's children that have not been waited
    for (0 where there is no /proc): a child waited for between two calls moves from here
    to ``RUSAGE_CHILDREN`` with all its seconds, so differences count each second once."""
    me, ticks = os.getpid(), 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)"
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[1]) == me:  # ppid; utime and stime in clock ticks
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def measure(spec: dict) -> dict:
    """The warm-up, then ``spec["epochs"]`` timed epochs of one peer on one workload."""
    import torch

    threads = torch.get_num_threads()  # put back at the end: --in-process runs in the caller
    torch.set_num_threads(spec["threads"])
    epoch = EPOCHS[spec["peer"]](spec)
    it = epoch()
    for i, (images, _) in zip(range(spec["warmup"]), it):
        if i == 0:
            out = f"{str(images.dtype).removeprefix('torch.')} {tuple(images.shape)}"
            values = {"mean": float(images.mean()), "std": float(images.std())}  # alike?
            if images.dtype != torch.float32 or not images.is_contiguous():
                raise SystemExit(f"{spec['peer']}: {out} is not float32 contiguous NCHW")
    if hasattr(it, "close"):
        it.close()  # a generator's, FFCV's: stops its threads
    del it  # a DataLoader iterator stops its workers when dropped
    runs = []
    for _ in range(spec["epochs"]):
        cpu0, t0, n = cpu_seconds(), time.perf_counter(), 0
        for _, labels in epoch():
            n += len(labels)
        runs.append(
            {"images": n, "seconds": time.perf_counter() - t0, "cpu_seconds": cpu_seconds() - cpu0}
        )
    torch.set_num_threads(threads)
    return {"output": out, "first_batch": values, "version": version(spec["peer"]), "epochs": runs}


def version(peer: str) -> str:
    from importlib import import_module, metadata

    try:
        return metadata.version(DIST.get(peer, peer))
    except metadata.PackageNotFoundError:
        return getattr(import_module(MODULE[peer]), "__version__", "?")


# ---- writing FFCV's files, in the FFCV Python ------------------------------------------


def ffcv_jpeg_as_is(destination, value, malloc) -> None:
    """``RGBImageField.encode`` for a JPEG file kept byte for byte (FFCV's own 'jpg' mode
    decodes and re-encodes): the same files as latecast's JPEG store and DALI read."""
    from ffcv.fields.rgb_image import IMAGE_MODES

    data, height, width = value
    destination["mode"], destination["height"], destination["width"] = (
        IMAGE_MODES["jpg"],
        height,
        width,
    )
    destination["data_ptr"], storage = malloc(data.nbytes)
    storage[:] = data


class Samples:
    def __init__(self, items, read) -> None:
        self.items, self.read = items, read

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        return self.read(self.items[i])


def ffcv_write(spec: dict) -> dict:
    from ffcv.fields import IntField, NDArrayField, RGBImageField
    from ffcv.writer import DatasetWriter

    kind, out = spec["kind"], Path(spec["out"])
    if kind == "jpeg":
        field = RGBImageField(write_mode="jpg")
        field.encode = ffcv_jpeg_as_is  # type(field) stays RGBImageField: FFCV reads it back
        files = json.loads(Path(spec["files"]).read_text())
        samples = Samples(files, lambda f: ((np.fromfile(f[0], np.uint8), f[2], f[3]), f[1]))
    else:
        images, labels = np.load(spec["images"], mmap_mode="r"), np.load(spec["labels"])
        field = (
            RGBImageField(write_mode="raw")
            if kind == "raw"
            else NDArrayField(np.dtype("u1"), images.shape[1:])
        )
        samples = Samples(range(len(labels)), lambda i: (np.asarray(images[i]), int(labels[i])))
    tmp = out.with_suffix(".tmp")
    writer = DatasetWriter(
        str(tmp), {"image": field, "label": IntField()}, num_workers=os.cpu_count()
    )
    writer.from_indexed_dataset(samples)
    os.replace(tmp, out)
    return {"out": str(out)}


def child(spec: dict) -> None:
    print(json.dumps(ffcv_write(spec) if spec.get("job") == "write" else measure(spec)))


# ---- the data: one folder per dataset and size under --work ----------------------------


def cifar_folder(source: Path, out: Path, limit: int | None) -> None:
    """The first ``limit / classes`` training JPEGs of each class (all without a limit) from
    the CIFAR-10 JPEG tarball (``train/<class>/NNNN.jpg``) or a folder (``[train/]<class>/``)."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if source.is_dir():
        top = source / "train" if (source / "train").is_dir() else source
        copy(
            ((f.parent.name, f.name, f.read_bytes) for f in sorted(top.glob("*/*.jpg"))), tmp, limit
        )
    else:
        with tarfile.open(source) as tar:  # sorted members; read in order, one pass
            members = [m for m in tar if m.isfile() and Path(m.name).parts[-3:-2] == ("train",)]
            parts = (Path(m.name).parts[-2:] for m in members)
            copy(((*p, tar.extractfile(m).read) for p, m in zip(parts, members)), tmp, limit)
    tmp.rename(out)


def copy(files, out: Path, limit: int | None) -> None:
    """(class, name, read) -> ``out/class/name``, the first ``limit / classes`` of a class."""
    files = list(files)
    per_class = max(1, limit // len({c for c, _, _ in files})) if limit else len(files)
    taken = {}
    for cls, name, read in files:
        if taken.setdefault(cls, 0) < per_class:
            taken[cls] += 1
            (out / cls).mkdir(parents=True, exist_ok=True)
            (out / cls / name).write_bytes(read())


def file_list(folder: Path, classes: tuple[str, ...], out: Path) -> None:
    """[path, label, height, width] of every JPEG, labels in the store's class order."""
    from PIL import Image

    rows = []
    for label, cls in enumerate(classes):
        for f in sorted((folder / cls).glob("*.jpg")):
            with Image.open(f) as im:  # the header only
                rows.append([str(f), label, im.height, im.width])
    out.write_text(json.dumps(rows))


def read_idx(path: Path, limit: int | None) -> np.ndarray:
    """An MNIST idx file (``.gz`` or plain): uint8 of its dims, the first ``limit`` rows."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(data[3])]
    array = np.frombuffer(data, np.uint8, offset=4 + 4 * len(dims)).reshape(dims)
    return array[:limit]


def find(folder: Path, stem: str) -> Path:
    for path in (folder / stem, folder / f"{stem}.gz"):
        if path.is_file():
            return path
    raise SystemExit(f"{folder}: no {stem} or {stem}.gz")


def write_arrays(d: Path, images: np.ndarray, labels: np.ndarray) -> None:
    if not (d / "labels.npy").is_file():
        d.mkdir(parents=True, exist_ok=True)
        np.save(d / "images.npy", images)
        np.save(d / "labels.npy", labels)  # last: its presence says both are whole


def ffcv_file(python: str | None, kind: str, d: Path, out: Path) -> str | None:
    if python is None:
        return None
    if not out.is_file():
        spec = {"job": "write", "kind": kind, "out": str(out), "files": str(d / "files.json")}
        spec |= {"images": str(d / "images.npy"), "labels": str(d / "labels.npy")}
        run_child(python, spec, check=True)
    return str(out)


def prepare(args: argparse.Namespace, ffcv: str | None) -> dict[str, dict]:
    """Each dataset once under ``args.work``; returns what the runs read, per workload."""
    import latecast

    work, limit, stats = args.work, args.limit, lambda ds: {"mean": ds.mean, "std": ds.std}
    out = {}
    if {"cifar-raw", "cifar-jpeg"} & set(args.workloads):
        d = work / f"cifar-{limit or 'all'}"
        if not (d / "jpg").is_dir():
            d.mkdir(parents=True, exist_ok=True)
            cifar_folder(args.cifar, d / "jpg", limit)
        for encoding in ("raw", "jpeg"):
            if not (d / encoding).is_dir():
                latecast.convert_folder(d / "jpg", d / encoding, encoding=encoding, test_fraction=0)
        raw = latecast.open_store(d / "raw")
        write_arrays(d, np.asarray(raw.images), np.asarray(raw.labels))
        if not (d / "files.json").is_file():
            file_list(d / "jpg", raw.classes, d / "files.json")
        cifar = {"raw_store": str(d / "raw"), "jpeg_store": str(d / "jpeg"), "n": len(raw)}
        cifar |= {"images": str(d / "images.npy"), "labels": str(d / "labels.npy")}
        cifar |= {"files": str(d / "files.json"), "folder": str(d / "jpg"), **stats(raw)}
        cifar["raw_beton"] = ffcv_file(ffcv, "raw", d, d / "raw.beton")
        cifar["beton"] = ffcv_file(ffcv, "jpeg", d, d / "jpeg.beton")
        out["cifar-raw"] = out["cifar-jpeg"] = cifar
    if "photos" in args.workloads:
        import synthetic_photos

        d = work / f"photos-{args.photos}"
        if not (d / "jpg").is_dir():
            tmp = d / "jpg.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            synthetic_photos.write(tmp, "train", args.photos, 10, 90, 0, os.cpu_count() or 1)
            tmp.rename(d / "jpg")
        if not (d / "jpeg").is_dir():
            latecast.convert_folder(
                d / "jpg" / "train", d / "jpeg", encoding="jpeg", size=f"{PHOTO}x{PHOTO}",
                test_fraction=0,
            )  # fmt: skip
        store = latecast.open_store(d / "jpeg")
        if not (d / "files.json").is_file():
            file_list(d / "jpg" / "train", store.classes, d / "files.json")
        photos = {"jpeg_store": str(d / "jpeg"), "folder": str(d / "jpg" / "train")}
        photos |= {"files": str(d / "files.json"), "n": len(store), **stats(store)}
        photos["beton"] = ffcv_file(ffcv, "jpeg", d, d / "jpeg.beton")
        out["photos"] = photos
    if "mnist" in args.workloads:
        d = work / f"mnist-{limit or 'all'}"
        images = read_idx(find(args.mnist, "train-images-idx3-ubyte"), limit)[..., None]
        labels = read_idx(find(args.mnist, "train-labels-idx1-ubyte"), limit)
        write_arrays(d, images, labels)
        mnist = {"images": str(d / "images.npy"), "labels": str(d / "labels.npy"), "n": len(labels)}
        mnist |= stats(latecast.from_arrays(images, labels))
        mnist["beton"] = ffcv_file(ffcv, "ndarray", d, d / "mnist.beton")
        out["mnist"] = mnist
    return out


# ---- the interleaved run ---------------------------------------------------------------


def run_child(python: str, spec: dict, check: bool = False) -> dict:
    """``spec`` run by this script under ``python``, in a fresh process: its JSON line, or
    ``{"error": ...}`` (with ``check``: exit)."""
    cmd = [python, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    t0, cpu0 = time.perf_counter(), cpu_seconds()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    whole = {"seconds": time.perf_counter() - t0, "cpu_seconds": cpu_seconds() - cpu0}
    if proc.returncode == 0:  # whole: the process with its start-up and warm-up
        return json.loads(proc.stdout.strip().splitlines()[-1]) | {"process": whole}
    error = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    if check:
        raise SystemExit(f"{python}: {spec.get('job', spec.get('peer'))}: {error}")
    return {"error": error}


def usable(peer: str, python: str | None) -> str | None:
    """Why ``peer`` is left out, or None."""
    if python is None:
        return f"no --{peer}-python given"
    if not Path(python).is_file():
        return f"{python} does not exist"
    if python == sys.executable:  # this Python: no start-up of another
        return None if importlib.util.find_spec(MODULE[peer]) else f"cannot import {MODULE[peer]}"
    proc = subprocess.run([python, "-c", f"import {MODULE[peer]}"], capture_output=True, text=True)
    if proc.returncode:
        return f"{python} cannot import {MODULE[peer]}: {proc.stderr.strip().splitlines()[-1]}"
    return None


def said(result: dict) -> str:
    if "error" in result:
        return f"failed: {result['error']}"
    e = result["epochs"][0]
    return f"{e['images'] / e['seconds']:,.0f} images/s, {e['cpu_seconds']:.2f} CPU-s"


def summarise(job: tuple[str, int, str], runs: list[dict], n: int) -> dict:
    workload, threads, peer = job
    good = [r for r in runs if "epochs" in r]
    epochs = [e for r in good for e in r["epochs"]]
    row = {"workload": workload, "threads": threads, "peer": peer, "images": n}
    row["errors"] = [r["error"] for r in runs if "error" in r]
    if epochs:
        row["images_per_s"] = float(np.median([e["images"] / e["seconds"] for e in epochs]))
        row["cpu_seconds"] = float(np.median([e["cpu_seconds"] for e in epochs]))
        row["cpu_ms_per_image"] = float(
            np.median([1e3 * e["cpu_seconds"] / e["images"] for e in epochs])
        )
        row |= {k: good[0][k] for k in ("version", "output", "first_batch")}
    row["runs"] = runs
    return row


def table(rows: list[dict]) -> str:
    base = {
        (r["workload"], r["threads"]): r
        for r in rows
        if r["peer"] == "latecast" and "images_per_s" in r
    }
    lines = [
        "| workload | threads | peer | images/s | CPU | images/s vs latecast | CPU vs latecast |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        head = f"| {r['workload']} | {r['threads']} | {r['peer']} |"
        if "images_per_s" not in r:
            lines.append(f"{head} {r['errors'][-1] if r['errors'] else 'no runs'} | | | |")
            continue
        photos = r["workload"] == "photos"
        cpu = (
            f"{r['cpu_ms_per_image']:.2f} ms/image" if photos else f"{r['cpu_seconds']:.2f} s/epoch"
        )
        lc = base.get((r["workload"], r["threads"]))
        ratios = (
            f"{r['images_per_s'] / lc['images_per_s']:.2f}x | "
            f"{r['cpu_ms_per_image'] / lc['cpu_ms_per_image']:.2f}x"
            if lc
            else " | "
        )
        lines.append(f"{head} {r['images_per_s']:,.0f} | {cpu} | {ratios} |")
    return "\n".join(lines)


def git_revision() -> str:
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return proc.stdout.strip() or "?"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians over them")
    p.add_argument("--limit", type=int, help="CIFAR and MNIST images (default: all, 50k and 60k)")
    p.add_argument("--photos", type=int, default=1000, help="synthetic photos")
    p.add_argument("--threads", default="1", help="comma list, e.g. 1,2")
    p.add_argument("-b", "--batch-size", type=int, default=512)
    p.add_argument("--photo-batch-size", type=int, default=128)
    p.add_argument("--warmup", type=int, default=5, help="batches before the timed epoch (>= 1)")
    p.add_argument("--epochs", type=int, default=1, help="timed epochs per run")
    p.add_argument("--workloads", default=",".join(PEERS_OF), help="comma list")
    p.add_argument("--peers", default=",".join(MODULE), help="comma list")
    p.add_argument(
        "--loader-workers", type=int, default=2, help="the wrap rows' DataLoader workers"
    )
    p.add_argument(
        "--fork-workers",
        action="store_true",
        help="the wrap rows fork their workers for each epoch (not persistent_workers)",
    )
    p.add_argument("--ffcv-python", help="a Python that imports ffcv")
    p.add_argument("--dali-python", help="a Python that imports nvidia.dali")
    cifar = SHARED / "cifar10-jpg" / "cifar10-jpg.tar.gz"
    p.add_argument(
        "--cifar", type=Path, default=cifar, help="its JPEG tarball, or [train/]<class>/"
    )
    p.add_argument("--mnist", type=Path, default=SHARED / "mnist", help="folder of MNIST idx files")
    p.add_argument(
        "--work", type=Path, default=Path("/tmp/latecast-peers"), help="formats kept here"
    )
    p.add_argument("--json", type=Path, help="also write the JSON here")
    p.add_argument("--in-process", action="store_true", help="no fresh processes (for tests)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.workloads = [w for w in args.workloads.split(",") if w]
    unknown = set(args.workloads) - set(PEERS_OF)
    if unknown:
        p.error(f"unknown workloads {sorted(unknown)}; known: {', '.join(PEERS_OF)}")
    args.peers = [x for x in args.peers.split(",") if x]
    args.threads = [int(t) for t in args.threads.split(",")]
    if args.warmup < 1 or args.rounds < 0 or min(args.threads) < 1:
        p.error("--warmup and --threads must be at least 1, --rounds at least 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    pythons = {p: sys.executable for p in (*OURS, "torchvision")}
    pythons |= {"ffcv": args.ffcv_python, "dali": args.dali_python}
    left_out = {}
    for peer in args.peers:
        why = usable(peer, pythons.get(peer)) if peer in MODULE else "not a peer of this script"
        if why:
            left_out[peer] = why
            print(f"{peer}: left out: {why}")
    peers = [p for p in args.peers if p not in left_out]
    load_before, started = os.getloadavg(), time.time()
    data = prepare(args, pythons["ffcv"] if "ffcv" in peers else None)
    jobs = [
        (w, t, p) for w in args.workloads for t in args.threads for p in PEERS_OF[w] if p in peers
    ]
    runs = {job: [] for job in jobs}
    for r in range(args.rounds):
        for job in jobs:  # every job once a round: load drifts over all of them alike
            w, t, peer = job
            batch = args.photo_batch_size if w == "photos" else args.batch_size
            spec = {"peer": peer, "workload": w, "threads": t, "batch_size": batch, "data": data[w]}
            spec |= {
                "mean": data[w]["mean"],
                "std": data[w]["std"],
                "warmup": args.warmup,
                "epochs": args.epochs,
                "loader_workers": args.loader_workers,
                "fork_workers": args.fork_workers,
            }
            result = measure(spec) if args.in_process else run_child(pythons[peer], spec)
            print(f"round {r + 1}: {w}, {peer}, {t} threads: {said(result)}", file=sys.stderr)
            runs[job].append(result)
    rows = [summarise(job, runs[job], data[job[0]]["n"]) for job in jobs]
    sizes = ", ".join(f"{w} {data[w]['n']:,}" for w in args.workloads)
    print(
        f"\n{args.rounds} rounds, medians; images: {sizes}; batch {args.batch_size} "
        f"(photos {args.photo_batch_size}); device cpu; git {git_revision()}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}; load average "
        f"{load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after\n"
    )
    print(table(rows) + "\n")
    result = {
        "command": sys.argv if argv is None else ["benchmarks/peers.py", *argv],
        "git": git_revision(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": time.time() - started,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.processor(),
        },
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "pythons": {p: pythons[p] for p in peers},
        "left_out": left_out,
        "rows": rows,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
