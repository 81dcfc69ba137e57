"""WebDataset tar shards as a JPEG dataset, without a store: ``latecast train
'http://host/shard-{000..009}.tar'`` (or ``'path/shard-*.tar'``).

Each shard is read once, in order, over HTTP (a plain GET) or from disk, into host memory
as a JPEG store holds it (the files back to back, their upright sizes from the headers,
their labels from ``.cls``); the JPEG files are then decoded on the device as any jpeg
store's. The last shard is the test split, the others the train split (WebDataset's own
layout keeps test shards apart too). Training size: the most common upright size of the
train files; mean/std: of the first ``STAT_FILES`` train images at that size.

Resume is exact: the shards are held whole, so a checkpoint's position is a sample's, and
the resume identity includes the SHA-256 of every train file's bytes: other or changed
shards are refused with one line (the fingerprint check of ``--resume``). The cost of that
is memory: the shards must fit in host RAM (convert larger data into a store).
"""

from __future__ import annotations

import glob
import hashlib
import re
import tarfile
import urllib.request
from collections import Counter
from dataclasses import replace

import numpy as np

from ..data import EncodedDataset, mean_std
from ..errors import ConfigError, FormatError
from ..jpegheader import jpeg_header

STAT_FILES = 512  # images the mean/std are measured on (a few seconds of CPU decoding)
_BRACES = re.compile(r"\{(\d+)\.\.(\d+)\}")
_train_of: dict = {}  # spec -> the train split just read: its test split's statistics, once


def is_shards(name: str) -> bool:
    return name.startswith(("http://", "https://")) or name.endswith(".tar")


def expand(spec: str) -> list[str]:
    """``shard-{000..009}.tar`` -> the ten names (zero-padded as written); a local pattern's
    ``*`` and ``?`` -> the files matching it, sorted."""
    m = _BRACES.search(spec)
    if m:
        a, b = m.groups()
        return [
            name
            for k in range(int(a), int(b) + 1)
            for name in expand(spec[: m.start()] + str(k).zfill(len(a)) + spec[m.end() :])
        ]
    if spec.startswith(("http://", "https://")) or not glob.has_magic(spec):
        return [spec]
    return sorted(glob.glob(spec))


def _samples(url: str):
    """``(key, jpeg bytes, label)`` of each sample in the shard, in its order."""
    try:
        src = urllib.request.urlopen(url, timeout=60) if "://" in url else open(url, "rb")
    except OSError as err:
        raise ConfigError(f"{url}: cannot read the shard ({err})") from None
    parts: dict[str, dict[str, bytes]] = {}
    try:
        with src, tarfile.open(fileobj=src, mode="r|*") as tar:
            for m in tar:
                if m.isfile():
                    key, _, ext = m.name.partition(".")
                    parts.setdefault(key, {})[ext.lower()] = tar.extractfile(m).read()
    except (tarfile.TarError, OSError) as err:
        raise FormatError(f"{url}: not a readable tar shard ({err})") from None
    for key, p in parts.items():
        jpg = p.get("jpg", p.get("jpeg"))
        if jpg is None or "cls" not in p:
            raise FormatError(f"{url}: sample {key!r} has no .jpg and .cls ({', '.join(p)})")
        try:
            yield key, jpg, int(p["cls"])
        except ValueError:
            raise FormatError(f"{url}: sample {key!r}: .cls is not an integer") from None


def open_shards(spec: str, split: str = "train") -> EncodedDataset:
    """The ``split`` of the shards named by ``spec`` as an ``EncodedDataset`` in memory; the
    test split has the train split's training size, channels and mean/std."""
    urls = expand(spec)
    if len(urls) < 2:
        raise ConfigError(
            f"{spec}: {len(urls)} shard(s); give two or more (the last is the test split)"
        )
    if split == "train":
        ds = _train_of[spec] = _with_stats(
            _dataset(spec, split, [s for u in urls[:-1] for s in _samples(u)])
        )
        return ds
    train = _train_of.pop(spec, None) or open_shards(spec)
    _train_of.pop(spec, None)
    ds = _dataset(spec, split, list(_samples(urls[-1])))
    return replace(ds, mean=train.mean, std=train.std, size=train.size, channels=train.channels)


def _dataset(spec: str, split: str, samples: list) -> EncodedDataset:
    heads = [jpeg_header(jpg) for _, jpg, _ in samples]
    for (key, _, _), h in zip(samples, heads):
        if h is None:
            raise FormatError(f"{spec}: sample {key!r}: its .jpg is not a JPEG file")
    labels, files = np.array([c for _, _, c in samples]), [jpg for _, jpg, _ in samples]
    if labels.min() < 0 or labels.max() >= 2**16:
        raise FormatError(f"{spec}: .cls values {labels.min()}..{labels.max()} (0..65535)")
    channels = 1 if all(h[2] == 1 for h in heads) else 3
    data = b"".join(files)
    return EncodedDataset(
        name=spec, split=split, data=np.frombuffer(data, np.uint8),
        offsets=np.cumsum([0] + [len(f) for f in files]).astype(np.int64),
        sizes=np.array([h[:2] for h in heads], np.int32),
        labels=labels.astype(np.uint8 if labels.max() < 256 else np.uint16),
        classes=tuple(str(c) for c in range(int(labels.max()) + 1)),
        mean=(0.5,) * channels, std=(0.25,) * channels, channels=channels,
        size=Counter(h[:2] for h in heads).most_common(1)[0][0],
        digest=hashlib.sha256(data).hexdigest(),  # the resume identity: every byte
    )  # fmt: skip


def _with_stats(ds: EncodedDataset) -> EncodedDataset:
    """``ds`` with the mean/std of its first ``STAT_FILES`` images at the training size."""
    import torch

    from ..data import Encoded
    from ..decode import decode

    n = min(len(ds), STAT_FILES)
    batch = Encoded(
        torch.from_numpy(ds.data[: ds.offsets[n]].copy()), ds.offsets[: n + 1].tolist(),
        torch.from_numpy(ds.sizes[:n].astype(np.int64)), torch.arange(n), ds.channels,
        torch.device("cpu"), ds.name,
    )  # fmt: skip
    flat = decode(batch, ds.size).reshape(-1, ds.channels).long()  # (n * H * W, C)
    mean, std = mean_std(torch.stack([flat.sum(0), (flat * flat).sum(0)]).numpy(), len(flat))
    return replace(ds, mean=mean, std=std)
