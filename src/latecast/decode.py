"""JPEG batches decoded where the pixels are used: the first step of the prepare stage for
encoded stores (``EncodedDataset``, moved by the ``jpeg`` mover as ``transfer.Encoded``) and
for the JPEG fields of ``latecast.wrap`` (``encoded.py``).

    decode (here) -> resized crop to the training size -> augment -> normalize

Each file is decoded at its stored size and cropped to the training size in the same
step: a RandomResizedCrop box when training asks for one, else "scale to cover, crop the
centre" (``transforms.centre_boxes``, what ``latecast convert`` does for raw stores).

The decoder is chosen once per process (``decoder()``, reported by ``info``, ``stats`` and
the bench JSON): TorchCodec's ``decode_jpeg`` when TorchCodec >= 0.16 imports, else
torchvision's (deprecated in torchvision 0.29 for TorchCodec; its warning is silenced once
here, never printed per batch). ``LATECAST_DECODER=torchvision`` (or ``torchcodec``) picks
one. Both give the same pixels: EXIF orientation applied, as TorchCodec always does and as
Pillow's ``ImageOps.exif_transpose`` (``latecast convert`` applies it too); for torchvision
latecast reads the orientation from the file's header and turns the decoded image itself.

- CUDA: one batched call, ``decode_jpeg(files, device=...)``: nvJPEG, on the hardware JPEG
  engines of A100/H100/H200 for baseline files. It reads the files from host memory and
  syncs its own stream (not the training stream) before it returns.
- CPU: a thread pool of ``torch.get_num_threads()``, each thread decoding and cropping its
  share. Both decoders decode a list on the CPU in a Python loop, no faster than one call
  per file; their ops release the GIL, so threads scale. Measured on 2 vCPUs (Xeon,
  torchvision 0.29, lightly loaded), the op called in one thread and in two: CIFAR-10 32x32
  files 32,000/s and 45,000/s; 500x375 photos 450/s and 806/s.
"""

from __future__ import annotations

import os
import struct
import warnings
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Callable

import numpy as np
import torch

from .errors import ConfigError, FormatError
from .transfer import Encoded
from .transforms import centre_boxes, resized_crop

_pools: dict[int, ThreadPoolExecutor] = {}
DECODERS = ("torchcodec", "torchvision")
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
# EXIF orientation -> the turn that shows the image upright, on (C, H, W): Pillow's
# exif_transpose (2 FLIP_LEFT_RIGHT, 3 ROTATE_180, 4 FLIP_TOP_BOTTOM, 5 TRANSPOSE,
# 6 ROTATE_270, 7 TRANSVERSE, 8 ROTATE_90; rot90 with k=1 turns counter-clockwise)
_TURNS: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {
    2: lambda x: x.flip(2),
    3: lambda x: x.flip(1, 2),
    4: lambda x: x.flip(1),
    5: lambda x: x.transpose(1, 2),
    6: lambda x: x.rot90(-1, (1, 2)),
    7: lambda x: x.transpose(1, 2).flip(1, 2),
    8: lambda x: x.rot90(1, (1, 2)),
}


@lru_cache(maxsize=None)
def decoder() -> str:
    """The JPEG decoder of this process, ``"torchcodec <version>"`` or ``"torchvision
    <version>"``: chosen at the first call, ``LATECAST_DECODER`` first."""
    asked = os.environ.get("LATECAST_DECODER", "")
    if asked not in ("", *DECODERS):
        raise ConfigError(f"LATECAST_DECODER={asked!r}: give one of {', '.join(DECODERS)}")
    for name in [asked] if asked else DECODERS:
        try:
            module = __import__(name)
            version = module.__version__.split("+")[0]
            if name == "torchvision" or tuple(map(int, version.split(".")[:2])) >= (0, 16):
                break
        except Exception:  # absent, or a build whose libraries do not load
            continue
    else:
        raise ConfigError(
            f"decoding JPEG files needs {asked or 'TorchCodec >= 0.16 or torchvision'}: "
            "pip install 'latecast[photos]'"
        )
    if name == "torchvision":  # once, here: torchvision 0.29 warns at every decode call
        warnings.filterwarnings(
            "ignore", "The image decoding and encoding capabilities", DeprecationWarning
        )
    return f"{name} {version}"


def jpeg_header(data) -> tuple[int, int, int, int] | None:
    """``(H, W, channels, EXIF orientation)`` of a JPEG file (any buffer of its bytes), H
    and W as it shows upright (orientation applied); None for what is not a readable JPEG.
    Reads the markers up to the frame header, no pixels."""
    mv, i, orientation = memoryview(data).cast("B"), 2, 1
    if len(mv) < 4 or mv[0] != 0xFF or mv[1] != 0xD8:
        return None
    while i + 9 < len(mv) and mv[i] == 0xFF:
        marker, length = mv[i + 1], mv[i + 2] << 8 | mv[i + 3]
        if marker == 0xFF:  # a fill byte
            i += 1
            continue
        if marker == 0xE1 and mv[i + 4 : i + 10] == b"Exif\0\0":
            orientation = _orientation(bytes(mv[i + 10 : i + 2 + length]))
        if marker in _SOF:
            h, w, c = mv[i + 5] << 8 | mv[i + 6], mv[i + 7] << 8 | mv[i + 8], mv[i + 9]
            return (w, h, c, orientation) if orientation >= 5 else (h, w, c, orientation)
        i += 2 + length
    return None


def _orientation(tiff: bytes) -> int:
    """The orientation tag (0x0112) of an EXIF block, 1 when absent or unreadable."""
    try:
        end = {b"II": "<", b"MM": ">"}[tiff[:2]]
        ifd = struct.unpack(end + "I", tiff[4:8])[0]
        for k in range(struct.unpack(end + "H", tiff[ifd : ifd + 2])[0]):
            tag, _, _, value = struct.unpack(end + "HHIH", tiff[ifd + 2 + 12 * k :][:10])
            if tag == 0x0112:
                return value if 1 <= value <= 8 else 1
    except (KeyError, struct.error):
        pass
    return 1


def read(files: list[torch.Tensor], channels: int, device: torch.device) -> list[torch.Tensor]:
    """JPEG files (1-D uint8 on the CPU) -> ``(channels, H, W)`` uint8 images on ``device``,
    upright (EXIF orientation applied), in one call of the chosen decoder."""
    if not files:
        return []
    mode = {1: "GRAY", 3: "RGB"}[channels]
    if decoder().startswith("torchcodec"):
        from torchcodec.decoders import decode_jpeg

        return decode_jpeg(files, mode=mode, device=device)
    from torchvision.io import ImageReadMode, decode_jpeg

    images = decode_jpeg(files, ImageReadMode[mode], device)
    for k, f in enumerate(files):
        turn = _TURNS.get((jpeg_header(f.numpy()) or (0, 0, 0, 1))[3])
        images[k] = images[k] if turn is None else turn(images[k])
    return images


def decode(batch: Encoded, size: tuple[int, int], boxes: torch.Tensor | None = None):
    """The batch's files as uint8 ``(n, H, W, C)`` on ``batch.device``, ``size = (H, W)``.

    Args:
        batch: what the ``jpeg`` mover yields.
        size: the training size.
        boxes: ``(n, 4)`` int64 ``(top, left, height, width)`` in the stored images, on the
            CPU (e.g. ``transforms.resized_crop_params``); None: ``centre_boxes``.
    """
    boxes = centre_boxes(batch.sizes, size) if boxes is None else boxes
    files = batch.files()

    def upright(rows, device) -> list[torch.Tensor]:  # (H, W, C) views, checked
        todo = [i for i in rows if i not in batch.decoded]
        try:
            done = dict(zip(todo, read([files[i] for i in todo], batch.channels, device)))
        except RuntimeError as err:  # name the first file that does not decode
            for i in todo:
                try:
                    read([files[i]], batch.channels, torch.device("cpu"))
                except RuntimeError as bad:
                    raise FormatError(
                        f"sample {int(batch.indices[i])}: not a decodable JPEG ({bad})"
                    ) from None
            raise FormatError(
                f"the batch did not decode on {device}, though each file does on the CPU ({err})"
            ) from None
        images = [done[i] if i in done else batch.decoded[i].to(device) for i in rows]
        for i, im in zip(rows, images):
            if list(im.shape[1:]) != batch.sizes[i].tolist():  # a store from before EXIF turns
                raise FormatError(
                    f"sample {int(batch.indices[i])}: decodes to {tuple(im.shape[1:])}, stored "
                    f"as {tuple(batch.sizes[i].tolist())} (written by a latecast that ignored "
                    "EXIF orientation: convert it again)"
                )
        return [im.permute(1, 2, 0) for im in images]

    if batch.device.type != "cpu":  # one nvJPEG call
        return resized_crop(upright(range(len(files)), batch.device), boxes, size)
    threads = torch.get_num_threads()
    pool = _pools.get(threads) or _pools.setdefault(threads, ThreadPoolExecutor(threads))

    def part(rows: np.ndarray) -> torch.Tensor:  # one thread: decode and crop its share
        return resized_crop([upright([i], batch.device)[0] for i in rows], boxes[rows], size)

    rows = [r for r in np.array_split(np.arange(len(files)), threads) if len(r)]
    return torch.cat(list(pool.map(part, rows)))
