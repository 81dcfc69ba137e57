"""A split of JPEG files as stored (``EncodedDataset``), without torch: ``convert``'s workers
load none; the mover that moves it (``kinds/jpeg.py``) is imported when it is asked for."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..data import Split


@dataclass(frozen=True, eq=False)
class EncodedDataset(Split):
    """Images kept as their encoded files (JPEG), decoded on the device."""

    data: np.ndarray  # (total,) uint8, the files back to back, possibly a read-only memmap
    offsets: np.ndarray  # (N + 1,) int64 from 0 to len(data): file i is data[o[i]:o[i + 1]]
    sizes: np.ndarray  # (N, 2) int32 (H, W) of each image as stored
    channels: int  # decoded to: 1 (grayscale) or 3 (RGB)
    size: tuple[int, int]  # (H, W) every image is cropped or resized to on the device
    encoding: str = "jpeg"  # what data holds
    digest: str = ""  # as Dataset's (of data)
    crc32: np.ndarray | None = None  # (N,) uint32: each file's CRC-32 as written (a store's)
    plain: bool = False  # every file upright, 1 or 3 channels: the CPU decoder reads no header

    def __post_init__(self) -> None:
        super().__post_init__()
        n, at = len(self.labels), self.offsets
        rises = len(at) and at[0] == 0 and at[-1] == len(self.data) and np.all(np.diff(at) > 0)
        self._check(
            (self.data.dtype == np.uint8 and self.data.ndim == 1, "data must be uint8 (total,)"),
            (at.shape == (n + 1,), f"offsets must be int64 ({n + 1},)"),
            (rises, "offsets must rise from 0 to len(data)"),
            (self.sizes.shape == (n, 2), f"sizes must be ({n}, 2)"),
            (self.crc32 is None or self.crc32.shape == (n,), f"crc32 must be ({n},)"),
            (self.channels in (1, 3), "channels must be 1 or 3"),
            (self.encoding == "jpeg", "encoding must be 'jpeg'"),
        )

    what = "a JPEG store; convert the folder with --encoding raw for the other movers"

    @property
    def movers(self) -> dict:
        """The one mover of JPEG files (``movers.movers_for``)."""
        from .jpeg import JpegStore  # torch: not for convert's workers

        return {JpegStore.name: JpegStore}

    def batch(self, at: np.ndarray, indices=None, names: list | None = None) -> tuple[list, list]:
        """The files and labels ``at`` (``indices``: the samples' own, a torch tensor;
        ``names``: a stream's, each file's shard and key)."""
        import torch  # not for convert's workers

        from ..fields import Taken, labels_field
        from .jpeg import JpegFiles

        data = self.data.view(np.ndarray)  # a plain view slices faster than a memmap
        starts, ends = self.offsets[at], self.offsets[at + 1]
        files = [data[a:b] for a, b in zip(starts.tolist(), ends.tolist())]
        sizes = torch.from_numpy(self.sizes[at].astype(np.int64))
        offsets = np.concatenate([[0], np.cumsum(ends - starts)]).tolist()
        jpegs = JpegFiles.of(0, files, sizes, self.size, self.channels, offsets,
                            source=f"{self.name}/{self.split}", indices=indices, names=names,
                            plain=self.plain)  # fmt: skip
        return [jpegs, labels_field(self.labels, len(at))], [files, Taken(self.labels, at)]

    @property
    def image_shape(self) -> tuple[int, int, int]:  # once decoded and cropped to size
        return (*self.size, self.channels)

    @property
    def image_bytes(self) -> int:
        return int(self.data.nbytes)
