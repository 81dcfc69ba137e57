"""JPEG batches decoded where the pixels are used: the first step of the prepare stage for
encoded stores (``EncodedDataset``, moved by the ``jpeg`` mover as ``data.Encoded``).

    decode (here) -> resized crop to the training size -> augment -> normalize

Each file is decoded at its stored size and cropped to the training size in the same
step: a RandomResizedCrop box when training asks for one, else "scale to cover, crop the
centre" (``transforms.centre_boxes``, what ``latecast convert`` does for raw stores).

- CUDA: one batched call, ``torchvision.io.decode_jpeg(files, device=...)``: nvJPEG, on the
  hardware JPEG engines of A100/H100/H200 for baseline files. It reads the files from host
  memory and syncs its own stream (not the training stream) before it returns.
- CPU: a thread pool of ``torch.get_num_threads()``, each thread decoding and cropping its
  share. torchvision decodes a list on the CPU in a Python loop, no faster than one call per
  file; its op releases the GIL, so threads scale. Measured on 2 vCPUs (Xeon, torchvision
  0.29, lightly loaded), the op called in one thread and in two: CIFAR-10 32x32 files
  32,000/s and 45,000/s; 500x375 photos 450/s and 806/s.

libjpeg reports damaged scan data ("Corrupt JPEG data: N extraneous bytes before marker 0xd9")
as a warning written from C to fd 2, not as a Python warning, and decodes the file anyway,
partly wrong. So a batch is decoded with fd 2 sent to a temporary file (``_fd2``, ~60 us); when
anything was written there, each file is decoded again alone to find which, and each is
named in one Python warning (store and sample index), never libjpeg's own text.

torchvision 0.29 deprecates its decoders in favour of TorchCodec 0.16. TorchCodec is not
used yet: its image API is still moving (a recent ``decode_jpeg`` takes a path only, and a
batched CUDA call is not documented), and nothing here could run it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator

import numpy as np
import torch

from .data import Encoded
from .errors import ConfigError, FormatError
from .transforms import centre_boxes, resized_crop

_pools: dict[int, ThreadPoolExecutor] = {}
_fd2_lock = threading.Lock()  # fd 2 is the process's: one redirection at a time


def jpeg_decoder() -> Callable:
    """``decode(file_or_files, channels, device)`` -> ``(C, H, W)`` uint8 image(s)."""
    try:
        from torchvision.io import ImageReadMode, decode_jpeg
    except ImportError:
        raise ConfigError(
            "decoding JPEG stores needs torchvision: pip install torchvision"
        ) from None
    modes = {1: ImageReadMode.GRAY, 3: ImageReadMode.RGB}
    return lambda files, channels, device: decode_jpeg(files, modes[channels], device)


def decode(batch: Encoded, size: tuple[int, int], boxes: torch.Tensor | None = None):
    """The batch's files as uint8 ``(n, H, W, C)`` on ``batch.device``, ``size = (H, W)``;
    a file libjpeg warns about is named in one warning (``_named``).

    Args:
        batch: what the ``jpeg`` mover yields.
        size: the training size.
        boxes: ``(n, 4)`` int64 ``(top, left, height, width)`` in the stored images, on the
            CPU (e.g. ``transforms.resized_crop_params``); None: ``centre_boxes``.
    """
    with _fd2() as said:
        images = _decode(batch, size, boxes)
    return _named(said[0], batch, images)


def _decode(batch: Encoded, size: tuple[int, int], boxes: torch.Tensor | None):
    boxes = centre_boxes(batch.sizes, size) if boxes is None else boxes
    files, decoder = batch.files(), jpeg_decoder()

    def read(which, device):
        try:
            return decoder(which, batch.channels, device)
        except RuntimeError as err:  # name the first file that does not decode
            for i, f in enumerate(files):
                try:
                    decoder(f, batch.channels, "cpu")
                except RuntimeError as bad:
                    raise FormatError(
                        f"{batch.source}: sample {int(batch.indices[i])}: not a decodable "
                        f"JPEG ({bad})"
                    ) from None
            raise FormatError(
                f"{batch.source}: the batch did not decode on {device}, though each file "
                f"does on the CPU ({err})"
            ) from None

    if batch.device.type != "cpu":
        images = read(files, batch.device)  # list of (C, H_i, W_i), one nvJPEG call
        _check_sizes(images, batch, range(len(files)))
        return resized_crop([im.permute(1, 2, 0) for im in images], boxes, size)
    threads = torch.get_num_threads()
    pool = _pools.get(threads) or _pools.setdefault(threads, ThreadPoolExecutor(threads))

    def part(rows: np.ndarray) -> torch.Tensor:  # one thread: decode and crop its share
        images = [read(files[i], "cpu") for i in rows]
        _check_sizes(images, batch, rows)
        return resized_crop([im.permute(1, 2, 0) for im in images], boxes[rows], size)

    rows = [r for r in np.array_split(np.arange(len(files)), threads) if len(r)]
    return torch.cat(list(pool.map(part, rows)))


def _check_sizes(images: list[torch.Tensor], batch: Encoded, rows) -> None:
    """Each decoded ``(C, H, W)`` must have the ``(H, W)`` that sizes.npy gives its file:
    the crop boxes are drawn from those sizes (too large: out of the image; too small: the
    wrong crop)."""
    sizes = batch.sizes.tolist()
    for im, i in zip(images, rows):
        if list(im.shape[1:]) != sizes[i]:
            raise FormatError(
                f"{batch.source}: sample {int(batch.indices[i])}: the file is "
                f"{im.shape[1]}x{im.shape[2]}, sizes.npy says {sizes[i][0]}x{sizes[i][1]} "
                f"(an edited store?)"
            )


def _named(said: str, batch: Encoded, out: torch.Tensor) -> torch.Tensor:
    """``out``, after one warning per file of ``batch`` that libjpeg warned about (found by
    decoding each again alone); text no file makes again was not libjpeg's: passed on."""
    if not said:
        return out
    damaged = [i for i, text in enumerate(libjpeg_says(batch.files(), batch.channels)) if text]
    for i in damaged:
        warnings.warn(
            f"{batch.source}: sample {int(batch.indices[i])}: damaged JPEG data (libjpeg decodes "
            f"it with a warning, part of the image is wrong); `latecast info --verify` checks "
            f"a store",
            stacklevel=4,
        )
    if not damaged:
        os.write(2, said.encode())
    return out


def libjpeg_says(files: list, channels: int) -> list[str]:
    """What libjpeg writes to fd 2 while decoding each file alone on the CPU ("" for a file
    it decodes cleanly); a file it cannot decode at all raises as in ``decode``."""
    decoder, said = jpeg_decoder(), []
    for f in files:
        with _fd2() as text, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Python's own (torchvision's deprecation) stay out
            decoder(f, channels, "cpu")
        said.append(text[0])
    return said


@contextlib.contextmanager
def _fd2() -> Iterator[list[str]]:
    """Send fd 2 to a temporary file while the block runs; the text written there is then
    ``said[0]`` of the yielded list (what C code such as libjpeg printed, and whatever
    another thread wrote meanwhile: ``_named`` passes that on)."""
    said: list[str] = []
    with _fd2_lock, tempfile.TemporaryFile() as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield said
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            said.append(tmp.read().decode(errors="replace"))
