"""The JPEG kind: a field of files (a list of ``bytes``, 1-D uint8 tensors or arrays, or
Hugging Face ``{"bytes": ..., "path": ...}`` dicts) crosses as the files back to back and is
decoded on the device as a JPEG store's batch is. Recognised by the JPEG signature, or declared
``fields={"jpg": latecast.jpeg(...)}``; a file that is no JPEG is decoded on the host.
"""

from __future__ import annotations

import functools
import itertools
import math
import numbers
import os
import warnings
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..data import Split
from ..errors import BatchError, check, numbers_of, refuse
from ..fields import Context, Field, Image, Mask, Name, check_channels, normalized, one_size
from ..movers import Stored
from ..threads import count, pool
from ..transforms import INTERPOLATIONS
from .decode import _MODES, At, Encoded, decoder, decoder_on
from .jpegheader import JPEG_SIDE, jpeg_headers, too_big

_said: set[Name] = set()  # fields whose non-JPEG files were announced
SIGNATURE = b"\xff\xd8\xff"  # how a JPEG file starts


@dataclass(frozen=True)
class JpegSpec:
    """A JPEG field's declaration (``jpeg``); ``plan`` reads each file's header on the host
    (a BatchError naming the field and the file for one it cannot take)."""

    size: tuple[int, int] | None = None  # the training (H, W); None: the files' own, all alike
    channels: int | None = None  # None: 3 unless every file is grey and mean/std are not 3
    interpolation: str = "bilinear"

    def plan(self, name: Name, value: Any, options: Any, batch: dict) -> JpegFiles:
        files = files_of(value, name)
        if files is None:
            raise BatchError(
                f"field {name!r} is declared JPEG files but is {type(value).__name__}: give a "
                "list of bytes, of 1-D uint8 tensors or arrays, or of {'bytes': ..., 'path': ...} "
                "dicts"
            )
        heads = jpeg_headers(files)
        for i, h in enumerate(heads):
            if why := too_big(h):  # refused from its header, before decoding
                raise BatchError(f"{At(name)[i]}: {why}")
        rgb = len(options.mean or ()) == 3  # 3 mean/std values: grey files made RGB, as
        grey = not rgb and all(h and h[2] == 1 for h in heads)  # ImageFolder's convert("RGB")
        channels = self.channels or (1 if grey else 3)
        no_jpeg = [i for i, h in enumerate(heads) if h is None]
        decoded = {i: host_decode(name, i, files[i], channels) for i in no_jpeg}
        sizes = [tuple(decoded[i].shape[1:]) if h is None else h[:2] for i, h in enumerate(heads)]
        size = self.size or one_size(name, sizes, "JPEG files", "jpeg")
        check_channels(name, channels, len(options.mean or (0,)))
        kept = [f[:0] if i in decoded else f for i, f in enumerate(files)]  # of its own type
        sizes = torch.from_numpy(np.array(sizes, dtype=np.int64).reshape(-1, 2))
        return JpegFiles.of(name, kept, sizes, size, channels, decoded=decoded, heads=heads,
                           interpolation=self.interpolation,
                           names=value.names if isinstance(value, Files) else None)  # fmt: skip


def jpeg(
    size: int | tuple[int, int] | None = None,
    channels: int | None = None,
    interpolation: str = "bilinear",
) -> JpegSpec:
    """Declare a field of JPEG files for ``wrap(fields={name: latecast.jpeg(...)})``.

    Args:
        size: the training size, ``(H, W)`` or one int: RandomResizedCrop to it when
            ``augment`` asks for one (``Augment(resized_crop=...)``), else resize to cover
            and crop the centre (evaluation). None: the files' own size, all alike.
        channels: 1 (greyscale) or 3 (RGB); grey and colour files come out alike. None: 3,
            unless every file of a batch is grey and wrap's mean/std are not 3 values.
        interpolation: ``"bilinear"`` or ``"bicubic"`` (OpenCLIP's, timm's), with antialias:
            how a crop is resized to ``size``, as torchvision v2 resizes (within 1 grey level).

    Example:
        >>> dl = DataLoader(wds.WebDataset(urls).to_tuple("jpg", "cls").batched(256), None)
        >>> loader = latecast.wrap(dl, mean=MEAN, std=STD, fields={0: latecast.jpeg(224)},
        ...                        augment=latecast.Augment(resized_crop=0.08, flip=0.5))
    """
    hw = numbers_of((size, size) if isinstance(size, numbers.Integral) else size, int)
    ok = size is None or (hw and len(hw) == 2 and 1 <= min(hw) <= max(hw) <= JPEG_SIDE)
    sides = f"an integer N or (H, W) of integers in 1..{JPEG_SIDE} (None: the files' own)"
    one_or_three = channels is None or numbers_of([channels], int) in ((1,), (3,))
    refuse([(ok, "latecast.jpeg(size=...)", size, sides),
            (one_or_three, "latecast.jpeg(channels=...)", channels, "1, 3 or None")])  # fmt: skip
    how = check(interpolation, "latecast.jpeg(interpolation=...)", tuple(INTERPOLATIONS))
    decoder()  # a bad LATECAST_DECODER: its one error now, not at a batch
    return JpegSpec(hw, None if channels is None else int(channels), how)


@dataclass(frozen=True)
class Files:
    """JPEG files back to back, as ``jpeg_folder`` batches them: file ``i`` is
    ``data[offsets[i]:offsets[i + 1]]``. To other code a sequence of ``bytes``."""

    data: torch.Tensor  # (total,) uint8 on the CPU
    offsets: list[int]  # (n + 1,) from 0 to total
    names: list[str] | None = None  # each file in messages (jpeg_folder's: its path)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> bytes:
        k = range(len(self))[i]  # an index out of range: IndexError
        return self.data[self.offsets[k] : self.offsets[k + 1]].numpy().tobytes()

    def views(self) -> list[np.ndarray]:
        """Each file as a 1-D uint8 array, a view of ``data``."""
        data, at = self.data.numpy(), self.offsets
        return [data[a:b] for a, b in zip(at, at[1:])]

    def pin_memory(self) -> Files:  # the DataLoader's pin_memory=True
        return Files(self.data.pin_memory(), self.offsets, self.names)


def files_of(value: Any, name: Name) -> list[bytes | np.ndarray] | None:
    """The field's files, ``bytes`` as they came, else 1-D uint8 arrays (views), or None when
    ``value`` is not a list of files. A Hugging Face row ``{"bytes": None, "path": p}`` is
    read from ``p`` (in this process: a ``collate_fn`` that reads them uses the workers)."""
    if isinstance(value, Files):
        return value.views()
    if isinstance(value, np.ndarray) and value.dtype == object and value.ndim == 1:
        value = list(value)
    if not isinstance(value, (list, tuple)) or not value:
        return None
    if all(type(item) is bytes for item in value):  # a Dataset's file reads, collated
        return list(value)
    out = []
    for k, item in enumerate(value):
        if isinstance(item, dict) and item.get("bytes") is None and "path" in item:
            item = _read(name, k, item["path"])
        item = item.get("bytes") if isinstance(item, dict) else item
        if isinstance(item, torch.Tensor) and item.device.type == "cpu":
            item = item.numpy() if item.dtype == torch.uint8 and item.ndim == 1 else None
        if isinstance(item, (bytes, bytearray, memoryview)):
            item = np.frombuffer(item, np.uint8)
        if not isinstance(item, np.ndarray) or item.dtype != np.uint8 or item.ndim != 1:
            return None
        out.append(np.ascontiguousarray(item))  # a strided view: copied, as packing reads runs
    return out


def _read(name: Name, k: int, path: Any) -> np.ndarray:
    """The bytes of the file at ``path`` (a row's), or one BatchError saying why not."""
    try:
        return np.fromfile(os.fspath(path), np.uint8)
    except (OSError, TypeError, ValueError) as err:
        why = getattr(err, "strerror", None) or err
        raise BatchError(
            f"{At(name)[k]} has no bytes and its path {path!r:.1000} does not read here ({why}); "
            "give the files' bytes"
        ) from None


def recognised(value: Any, name: Name) -> tuple[JpegSpec, list] | None:
    """An undeclared field as JPEG files (``Options.recognise``), when it is a list of files any
    of which starts with the JPEG signature (rows read from their paths: the first alone)."""
    if isinstance(value, Files):  # jpeg_folder's batch: its views made once
        files = value.views()
        return (JpegSpec(), files) if any(bytes(f[:3]) == SIGNATURE for f in files) else None
    for k in range(len(value) if isinstance(value, (list, tuple, np.ndarray)) else 0):
        head = files_of(value[k : k + 1], name)
        if head is not None and bytes(head[0][:3]) == SIGNATURE:
            return JpegSpec(), files_of(value, name)
        if head is None or isinstance(value[k], dict):
            return None
    return None


@dataclass(frozen=True)
class JpegFiles(Field):
    """The JPEG kind: the files back to back (``nbytes`` of them), each file's upright size,
    the training size and channels; its bytes stay in the pinned slot for the decoder."""

    files: list = field(default_factory=list, repr=False)
    sizes: torch.Tensor | None = None  # (n, 2) int64 upright (H, W)
    size: tuple[int, int] = (0, 0)
    channels: int = 3
    decoded: dict = field(default_factory=dict, repr=False)  # non-JPEG files
    heads: list | None = field(default=None, repr=False)  # jpeg_header of each
    source: str = ""  # in messages: "name/split" of a store, else the field
    indices: torch.Tensor | None = None  # a store's sample indices (None: positions)
    names: list | None = None  # a stream's: each file's shard and key
    plain: bool = False  # EncodedDataset.plain
    interpolation: str = "bilinear"  # how a crop is resized to `size`

    category, what = "image", "jpeg"
    pixels = on_host = True

    @classmethod
    def of(cls, name: Name, files: list, sizes: torch.Tensor, size: tuple, channels: int,
           offsets: list | None = None, **more: Any) -> JpegFiles:  # fmt: skip
        """The field of ``files`` (``offsets``: where each starts, back to back, if known)."""
        f = cls(name, torch.uint8, (len(files),), None, files, sizes, tuple(size), channels, **more)
        if offsets is not None:
            vars(f)["offsets"] = offsets  # the cached property, as a store already knows it
        return f

    @functools.cached_property
    def offsets(self) -> list[int]:
        return list(itertools.accumulate(map(len, self.files), initial=0))

    @property
    def nbytes(self) -> int:
        return self.offsets[-1]

    @property
    def decoded_bytes(self) -> int:  # as uint8 pixels at the training size
        return len(self.files) * math.prod(self.size) * self.channels

    @property
    def usual_bytes(self) -> int:  # the usual way: float32 at the training size
        return 4 * self.decoded_bytes

    decoder = staticmethod(decoder_on)  # the decoder of its files on a device

    def pack(self, dst: torch.Tensor, value: Any) -> None:
        """The files back to back into the pinned bytes ``dst``."""
        if self.files and type(self.files[0]) is bytes:  # files_of: all bytes, or all arrays
            dst.numpy()[:] = np.frombuffer(b"".join(self.files), np.uint8)
        elif self.files:
            np.concatenate(self.files, out=dst.numpy())

    def view(self, raw: torch.Tensor, device: torch.device) -> Encoded:
        """The files (``raw``: host bytes) as a batch to decode on ``device``."""
        idx = torch.arange(len(self.files)) if self.indices is None else self.indices
        names = self.names or (None if self.source else At(self.name))  # a file in messages
        return Encoded(raw, self.offsets, self.sizes, idx, self.channels, device,
                       self.source or f"field {self.name!r}", self.decoded, names, self.heads,
                       self.plain, self.interpolation)  # fmt: skip

    def sizes_of(self, x: Encoded) -> torch.Tensor:
        return x.sizes  # each file's own: the draw's boxes are made in them

    def finish(self, x: Encoded, ctx: Context) -> torch.Tensor:
        """Decoded to the training size by the draw's boxes (else resized to cover it and its
        centre cropped), then as an image (``normalized``)."""
        return normalized(x.decode(self.size, ctx.draw.boxes), ctx)

    def together(self, plans: list[Field | None]) -> None:
        """Masks beside JPEG files are moved by the files' decoding boxes: one a file, each
        its file's size, every image of the batch coming out at one size (BatchError)."""
        masks = [f for f in plans if isinstance(f, Mask)]
        if not masks:
            return
        m, (n, h, w) = masks[0], masks[0].nhw
        other = [(k, a, b) for k, (a, b) in enumerate(self.sizes.tolist()) if (a, b) != (h, w)]
        bad = "its file at position {} is {}x{}".format(*other[0]) if other else ""
        if bad := f"it holds {len(self.files)} files" if len(self.files) != n else bad:
            raise BatchError(
                f"field {m.name!r}: masks {(n, h, w)} are moved with the files of JPEG field "
                f"{self.name!r} (by their decoding boxes), but {bad}"
            )
        files = [f for f in plans if isinstance(f, JpegFiles)]
        outs = {f.size for f in files} | {f.nhw[1:] for f in plans if isinstance(f, Image)}
        if len(outs) > 1:
            raise BatchError(
                f"field {m.name!r}: masks come out at the size of their JPEG images, so every "
                f"image of the batch must come out at one size, got {sorted(outs)}"
            )


def host_decode(name: Name, i: int, data: bytes | np.ndarray, channels: int) -> torch.Tensor:
    """A file that is no JPEG, decoded on the host, upright: ``(channels, H, W)`` uint8."""
    mode = _MODES[channels]
    t = torch.from_numpy(np.frombuffer(data, np.uint8).copy())  # a rare file: writable
    try:
        if decoder().startswith("torchcodec"):
            from torchcodec.decoders import decode_image

            image = decode_image(t, mode=mode)
        else:
            from torchvision.io import ImageReadMode, decode_image

            image = decode_image(t, ImageReadMode[mode], apply_exif_orientation=True)
    except (RuntimeError, ValueError) as err:  # torch's ops, TorchCodec's format sniffing
        why = str(err).splitlines()[-1][:200]
        raise BatchError(f"{At(name)[i]} is not a readable image ({why})") from None
    if image.ndim == 4:  # an animation: its first frame
        image = image[0]
    if name not in _said:
        _said.add(name)
        warnings.warn(f"field {name!r}: a file that is no JPEG (at position {i}) is decoded on "
                      "the host; such files of this field are not said again",
                      stacklevel=2)  # fmt: skip
    return image


class JpegStore(Stored):
    """JPEG stores and streams: a batch's files packed beside its narrow labels; the labels
    cross, the files stay in the pinned slot for the decoder (nvJPEG parses them on the host).
    Each file of a store is checked against its CRC-32 at a run's first read of it."""

    name = "jpeg"
    slots, side = 3, True  # read ahead as wrap: one copy in flight, one out, one being filled

    def __init__(self, dataset: Split, device: torch.device, batch_size: int) -> None:
        super().__init__(dataset, device, batch_size)
        self.stats.decoder = decoder_on(device)  # an unusable decoder: its one error here
        crc = getattr(dataset, "crc32", None)  # a stream has none: its index checks its files
        self.unread = None if crc is None else np.ones(len(dataset), bool)

    @staticmethod
    def epoch_bytes(dataset: Split) -> dict[str, int]:
        return {"per_epoch": dataset.image_bytes + dataset.label_bytes, "once": 0}

    def gather(self, item: Any) -> tuple[list[Field], list]:
        """An index batch of a store; for a stream, the ``(EncodedDataset, ids, names)`` of a
        batch its source read (``StreamedDataset``)."""
        if not torch.is_tensor(item):
            ds, idx, names = item
            return ds.batch(np.arange(len(idx)), indices=idx, names=names)
        at = item.numpy()
        plans, values = self.dataset.batch(at, indices=item)
        if self.unread is not None and self.unread[at].any():
            self._first_read(at, values[0])
        return plans, values

    def _first_read(self, idx: np.ndarray, files: list[np.ndarray]) -> None:
        """Files read for the first time checked against their store's CRC-32 (damage libjpeg
        decodes silently, a lying ``offsets.npy``): a warning naming each once."""
        new, threads = np.flatnonzero(self.unread[idx]), count()
        parts = np.array_split(new, min(threads, len(new)))  # zlib lets go of the GIL past 5 KiB

        def crcs(part: np.ndarray) -> list[int]:
            return [zlib.crc32(files[k]) for k in part]

        here = len(parts) < 2  # one part: here, not handed to a pool thread and waited for
        done = map(crcs, parts) if here else pool(threads).map(crcs, parts)
        crc = np.concatenate([np.array(c, np.uint32) for c in done])
        for k in new[crc != self.dataset.crc32[idx[new]]]:
            warnings.warn(
                f"{self.dataset.name}/{self.dataset.split}: sample {idx[k]}: its bytes differ from "
                f"the CRC-32 its store kept when written (damaged or edited since); `latecast "
                f"info --verify` checks a store",
                stacklevel=4,
            )
        self.unread[idx] = False
