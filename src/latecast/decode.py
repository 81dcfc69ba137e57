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

torchvision 0.29 deprecates its decoders in favour of TorchCodec 0.16. TorchCodec is not
used yet: its image API is still moving (a recent ``decode_jpeg`` takes a path only, and a
batched CUDA call is not documented), and nothing here could run it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np
import torch

from .data import Encoded
from .errors import ConfigError, FormatError
from .transforms import centre_boxes, resized_crop

_pools: dict[int, ThreadPoolExecutor] = {}


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
    """The batch's files as uint8 ``(n, H, W, C)`` on ``batch.device``, ``size = (H, W)``.

    Args:
        batch: what the ``jpeg`` mover yields.
        size: the training size.
        boxes: ``(n, 4)`` int64 ``(top, left, height, width)`` in the stored images, on the
            CPU (e.g. ``transforms.resized_crop_params``); None: ``centre_boxes``.
    """
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
                        f"sample {int(batch.indices[i])}: not a decodable JPEG ({bad})"
                    ) from None
            raise FormatError(
                f"the batch did not decode on {device}, though each file does on the CPU ({err})"
            ) from None

    if batch.device.type != "cpu":
        images = read(files, batch.device)  # list of (C, H_i, W_i), one nvJPEG call
        return resized_crop([im.permute(1, 2, 0) for im in images], boxes, size)
    threads = torch.get_num_threads()
    pool = _pools.get(threads) or _pools.setdefault(threads, ThreadPoolExecutor(threads))

    def part(rows: np.ndarray) -> torch.Tensor:  # one thread: decode and crop its share
        return resized_crop(
            [read(files[i], "cpu").permute(1, 2, 0) for i in rows], boxes[rows], size
        )

    rows = [r for r in np.array_split(np.arange(len(files)), threads) if len(r)]
    return torch.cat(list(pool.map(part, rows)))
