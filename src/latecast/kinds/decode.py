"""JPEG files decoded where the pixels are used and cropped to the training size (``decode``):
one nvJPEG call a batch on a GPU (``decoder()``), each file into its slot of the batch on the
CPU (``cpu_decoder()``, ``threads.pool``). Every decoder gives the same pixels, upright (EXIF
orientation applied). libjpeg says a file is damaged only on fd 2: a batch decodes with fd 2
sent to a temporary file (``_fd2``), and each file that made libjpeg speak is named once.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import tempfile
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import torch

from ..errors import BatchError, ConfigError, FormatError
from ..fields import Name
from ..threads import count, one_thread, pool
from ..transforms import centre_boxes, crop_into, resized_crop
from .jpegheader import jpeg_header, jpeg_headers, too_big


@dataclass(frozen=True)
class At:
    """Field ``name``'s files in messages, by their position in the batch (``At(name)[i]``;
    ``Encoded.names`` of a ``wrap`` field's batch)."""

    name: Name

    def __getitem__(self, i: int) -> str:
        return f"field {self.name!r}: the file at position {i} in the batch"


@dataclass
class Encoded:
    """A batch of JPEG files back to back, as the ``jpeg`` mover hands it on: file ``i`` is
    ``data[offsets[i]:offsets[i + 1]]``, in a slot of the mover's ring (decode it before
    asking for the batch after next)."""

    data: torch.Tensor  # (bytes,) uint8 on the CPU, pinned for a CUDA device
    offsets: list[int]  # (n + 1,)
    sizes: torch.Tensor  # (n, 2) int64 (H, W) as stored, on the CPU
    indices: torch.Tensor  # (n,) int64 dataset indices, on the CPU (for error messages)
    channels: int  # to decode to: 1 (gray) or 3 (RGB)
    device: torch.device  # where the pixels are wanted
    source: str = ""  # the dataset, "name/split", for messages
    decoded: dict = field(default_factory=dict)  # wrap: position -> CHW of a non-JPEG file
    names: list | None = None  # a stream's: each file's shard and key, for messages
    heads: list | None = None  # wrap: each file's jpeg_header, read as it was planned
    plain: bool = False  # every file upright, 1 or 3 channels (``EncodedDataset.plain``)
    interpolation: str = "bilinear"  # or "bicubic": how a crop is resized to the training size

    def __len__(self) -> int:
        return len(self.sizes)

    def sample(self, i: int) -> str:
        """File ``i`` in a message: its shard and key, else its sample index in ``source``."""
        return self.names[i] if self.names else f"{self.source}: sample {int(self.indices[i])}"

    def files(self) -> list[torch.Tensor]:
        """One 1-D uint8 view per file (what the decoders take), cut in one call."""
        at = self.offsets
        return list(self.data[at[0] : at[-1]].split([b - a for a, b in zip(at, at[1:])]))

    def decode(self, size: tuple[int, int], boxes: torch.Tensor | None = None) -> torch.Tensor:
        """``decode(self, size, boxes)`` (what ``Prepare`` asks of pixels kept on the host); a
        file of a ``wrap`` field that does not decode is a BatchError naming it."""
        try:
            return decode(self, size, boxes)
        except FormatError as err:  # raised from None: its cause is the file, as named
            raise (BatchError(str(err)) if isinstance(self.names, At) else err) from None


_fd2_lock = threading.Lock()  # fd 2 is the process's: one redirection at a time
_fd2_files: dict[int, int] = {}  # process id -> its temporary file's fd (a forked worker: its own)

DECODERS = ("torchcodec", "torchvision")
_MODES = {1: "GRAY", 3: "RGB"}  # channels -> the decoders' colour mode
_LEAST = {"torchcodec": (0, 16), "torchvision": (0, 0), "simplejpeg": (1, 8)}  # 1.8: buffer=
Decoded = tuple[torch.Tensor, list]  # a batch (n, H, W, C) uint8, and its files found damaged


def _turned(image: torch.Tensor, orientation: int, h: int = 1) -> torch.Tensor:
    """``image`` (its height on axis ``h``, its width on ``h + 1``) as it shows upright under
    EXIF ``orientation`` 1-8, as Pillow's ``exif_transpose`` turns it."""
    if orientation >= 5:  # 5-8: a quarter turn, the transpose and one of 1-4's flips
        image = image.transpose(h, h + 1)
    flips = ((), (h + 1,), (h, h + 1), (h,))[(orientation - 1) % 4]
    return image.flip(flips) if flips else image


def _version(name: str) -> str | None:
    """The version of ``name`` where it imports and is at least ``_LEAST[name]``, else None."""
    try:
        version = __import__(name).__version__.split("+")[0]
        return version if tuple(map(int, version.split(".")[:2])) >= _LEAST[name] else None
    except Exception:  # absent, or a build whose libraries do not load
        return None


@functools.cache
def decoder() -> str:
    """The JPEG decoder of this process, ``"torchcodec <version>"`` (TorchCodec >= 0.16) or
    else ``"torchvision <version>"``; ``LATECAST_DECODER`` (one of ``DECODERS``) picks one.
    Chosen at the first call. Raises ``ConfigError`` when none imports."""
    asked = os.environ.get("LATECAST_DECODER", "")
    if asked not in ("", *DECODERS):
        raise ConfigError(f"LATECAST_DECODER={asked!r}: give one of {', '.join(DECODERS)}")
    name = next((n for n in ([asked] if asked else DECODERS) if _version(n)), None)
    if name is None:
        raise ConfigError(
            f"decoding JPEG files needs {asked or 'TorchCodec >= 0.16 or torchvision'}: "
            "pip install 'latecast[photos]'"
        )
    if name == "torchvision":  # once, here: torchvision 0.29 warns at every decode call
        warnings.filterwarnings("ignore", "The image decoding and encoding", DeprecationWarning)
    return f"{name} {_version(name)}"


@functools.cache
def cpu_decoder() -> str:
    """The decoder of JPEG batches on a CPU device: ``"simplejpeg <version>"`` where
    simplejpeg >= 1.8 (libjpeg-turbo, as TorchCodec: the same pixels) imports and
    ``LATECAST_DECODER`` is unset, else ``decoder()``."""
    version = None if os.environ.get("LATECAST_DECODER") else _version("simplejpeg")
    return f"simplejpeg {version}" if version else decoder()


def decoder_on(device: torch.device) -> str:
    """The decoder of JPEG batches for ``device``: ``cpu_decoder()`` or ``decoder()``."""
    return cpu_decoder() if torch.device(device).type == "cpu" else decoder()


def read(files: list[torch.Tensor], channels: int, device: torch.device) -> list[torch.Tensor]:
    """JPEG files (1-D uint8 on the CPU) -> ``(channels, H, W)`` uint8 images on ``device``,
    upright, by ``decoder()``: one batched call on a GPU, one call per file on the CPU.
    Raises ``RuntimeError`` for a file it cannot decode."""
    cpu = torch.device(device).type == "cpu"
    return list(map(_one(channels), files)) if cpu or not files else _one(channels, device)(files)


def _one(channels: int, device: torch.device | str = "cpu") -> Callable:
    """``decoder()``'s call for one file on the CPU, else for a list of files on ``device``:
    ``(channels, H, W)`` uint8, upright."""
    mode = _MODES[channels]
    if decoder().startswith("torchcodec"):
        from torchcodec.decoders import decode_jpeg

        return functools.partial(decode_jpeg, mode=mode, device=device)
    from torchvision.io import ImageReadMode, decode_jpeg

    def upright(f: torch.Tensor, image: torch.Tensor) -> torch.Tensor:  # torchvision's: no EXIF
        return _turned(image, (jpeg_header(f.numpy()) or (0, 0, 0, 1))[3])

    if device == "cpu":
        return lambda f: upright(f, decode_jpeg(f, ImageReadMode[mode]))
    return lambda fs: list(map(upright, fs, decode_jpeg(fs, ImageReadMode[mode], device)))


def _turbo(data: np.ndarray, channels: int, head: tuple | None) -> tuple[Any, bool]:
    """simplejpeg's decoding of one file with header ``head``, upright ``(H, W, C)``, and whether
    libjpeg warned (damaged data: decoded again leniently, as the other decoders do). ``(None,
    False)`` leaves the file to ``decoder()``: no readable header, 4 channels (CMYK: simplejpeg's
    is 1-2 grey levels off TorchCodec's), or one it cannot decode (12-bit)."""
    import simplejpeg

    if head is None or head[2] == 4:
        return None, False
    for strict in (True, False):  # strict (the default) raises for libjpeg's warnings too
        try:
            image = simplejpeg.decode_jpeg(data, _MODES[channels], strict=strict)
        except ValueError:
            continue
        return (image if head[3] == 1 else _turned(torch.from_numpy(image), head[3], 0)), not strict
    return None, False


def decode(batch: Encoded, size: tuple[int, int], boxes: torch.Tensor | None = None):
    """The batch's files decoded and cropped to the training ``size`` ``(H, W)``: uint8
    ``(n, H, W, C)`` on ``batch.device``. ``boxes``: ``(n, 4)`` int64 ``(top, left, height,
    width)`` in the stored images, on the CPU (``transforms.resized_crop_params``; None:
    ``centre_boxes``). A file libjpeg warns about is named in one warning; one that does not
    decode, or whose size is not what ``batch.sizes`` says, raises ``FormatError``."""
    with _fd2() as said, one_thread():
        on = _decode_cpu if batch.device.type == "cpu" else _decode_gpu
        images, damaged = on(batch, tuple(size), boxes)
    return _named(said[0], batch, images, damaged)


def _decode_gpu(batch: Encoded, size: tuple[int, int], boxes: torch.Tensor | None) -> Decoded:
    """One nvJPEG call for the batch, sizes checked, then ``resized_crop``; no damaged list."""
    files, sizes, dev = batch.files(), batch.sizes.tolist(), batch.device
    todo = [i for i in range(len(files)) if i not in batch.decoded]
    heads = batch.heads or jpeg_headers([f.numpy() for f in files])  # at once, not one by one
    for i in todo:  # refused from its header before decoding
        _refuse(batch, i, too_big(heads[i]))
    try:
        done = dict(zip(todo, read([files[i] for i in todo], batch.channels, dev)))
    except RuntimeError as err:  # name the first file that does not decode
        for i in todo:
            try:
                read([files[i]], batch.channels, torch.device("cpu"))
            except RuntimeError as bad:
                _refuse(batch, i, f"not a decodable JPEG ({bad})")
        raise FormatError(
            f"{batch.source}: the batch did not decode on {dev}, though each file "
            f"does on the CPU ({err})"
        ) from None
    images = [done[i] if i in done else batch.decoded[i].to(dev) for i in range(len(files))]
    for i, im in enumerate(images):
        _check_size(im.shape[1:], sizes[i], batch, i)
    boxes = centre_boxes(batch.sizes, size) if boxes is None else boxes
    hwc = [im.permute(1, 2, 0) for im in images]
    return resized_crop(hwc, boxes, size, batch.interpolation), []


def _decode_cpu(batch: Encoded, size: tuple[int, int], boxes: torch.Tensor | None) -> Decoded:
    """The batch decoded by ``count()`` threads, each a contiguous share, each file into its slot:
    decoded there, copied (all at the training size, uncropped: CIFAR's) or cropped into it."""
    n, channels, one = len(batch), batch.channels, _one(batch.channels)
    box = torch.tensor([0, 0, *size])  # a whole file at the training size: none cropped
    whole = bool((batch.sizes == box[2:]).all()) and (boxes is None or bool((boxes == box).all()))
    sizes = [list(size)] * n if whole else batch.sizes.tolist()
    if not whole:
        boxes = (centre_boxes(batch.sizes, size) if boxes is None else boxes).tolist()
    turbo, damaged = cpu_decoder().startswith("simplejpeg"), []
    data = batch.data.numpy()  # numpy views of the files: a tenth of a tensor view's cost
    files = [data[a:b] for a, b in zip(batch.offsets, batch.offsets[1:])]
    plain = (*size, channels, 1) if batch.plain and whole and turbo else None  # every header
    heads = batch.heads or ([None] * n if plain else jpeg_headers(files))
    shape = (n, *size, channels)  # files decoded straight into their slots: off 32 bytes
    out = _off_32(shape) if whole and turbo else torch.empty(shape, dtype=torch.uint8)
    if turbo:
        import simplejpeg

    def upright(i: int):  # file i as (H, W, C): a tensor, or simplejpeg's array
        if i in batch.decoded:  # wrap's file that is no JPEG, decoded on the host
            image = batch.decoded[i].permute(1, 2, 0)
        else:
            _refuse(batch, i, too_big(head := heads[i] or jpeg_header(files[i])))
            image, bad = _turbo(files[i], channels, head) if turbo else (None, False)
            damaged.extend([i] * bad)
            if image is None:
                try:
                    image = one(torch.from_numpy(files[i])).permute(1, 2, 0)
                except RuntimeError as err:
                    _refuse(batch, i, f"not a decodable JPEG ({err})")
        _check_size(image.shape[:2], sizes[i], batch, i)
        return image

    def part(rows: range) -> None:
        if whole and not turbo:  # one copy for the share
            torch.stack([upright(i) for i in rows], out=out[rows.start : rows.stop])
            return
        slots = out.numpy()  # numpy views of the slots: a tenth of a tensor view's cost
        for i in rows:
            if whole and (heads[i] or plain) in fits and i not in batch.decoded:  # the hot loop
                try:  # straight into its slot
                    if simplejpeg.decode_jpeg(files[i], space, buffer=slots[i]).shape == want:
                        continue
                except ValueError:  # damaged: decoded again below, leniently, and named
                    pass
            if whole:
                slots[i] = upright(i)
            else:
                crop_into(torch.as_tensor(upright(i)), boxes[i], out[i], batch.interpolation)

    # the headers of files that decode into their slot as they are: the training size, upright
    fits, want = {(*size, 1, 1), (*size, 3, 1)}, (*size, channels)
    space, threads = _MODES[channels], count()
    step = -(-n // threads) or 1  # contiguous shares: an error names the first bad file
    shares = [range(a, min(a + step, n)) for a in range(0, n, step)]
    here = len(shares) < 2  # one share: decoded here, as a pool thread may wait for a busy core
    list(map(part, shares) if here else pool(threads).map(part, shares))
    return out, sorted(damaged)


def _off_32(shape: tuple[int, ...]) -> torch.Tensor:
    """An empty uint8 tensor that starts 8 bytes past a 32-byte boundary, for simplejpeg to
    decode into. libjpeg-turbo's AVX2 colour conversion writes a row that starts on one with
    non-temporal stores, past the cache: CIFAR-10's 96-byte rows all did in torch's 64-byte
    aligned memory, which made decoding 20% slower and the crop and normalize after it read
    the pixels back from memory. (Only there: a batch of crops, written by torch, kept 32
    bytes more moved glibc's mmap threshold past its other blocks of that size.)"""
    flat = torch.empty(math.prod(shape) + 32, dtype=torch.uint8)
    skip = (8 - flat.data_ptr()) % 32
    return flat[skip : skip + math.prod(shape)].view(shape)


def _refuse(batch: Encoded, i: int, why: str | None) -> None:
    """A FormatError naming file ``i`` of ``batch`` and ``why``, when there is a why."""
    if why:
        raise FormatError(f"{batch.sample(i)}: {why}") from None


def _check_size(hw: torch.Size, size: list[int], batch: Encoded, i: int) -> None:
    """A decoded image's ``(H, W)`` must be what sizes.npy gives its file: the crop boxes
    are drawn from those (too large: out of the image; too small: the wrong crop)."""
    if list(hw) != size:
        _refuse(batch, i, f"the file is {hw[0]}x{hw[1]}, sizes.npy says {size[0]}x{size[1]} "
                "(an edited store, or one written when convert ignored EXIF orientation: "
                "convert it again)")  # fmt: skip


def _named(said: str, batch: Encoded, out: torch.Tensor, known: list = ()) -> torch.Tensor:
    """``out``, after one warning per file of ``batch`` that libjpeg warned about: ``known``
    (simplejpeg's), and those found by decoding each again alone when fd 2 ``said``
    anything; text no file makes again was not libjpeg's: passed on to fd 2."""
    says = libjpeg_says(batch.files(), batch.channels) if said else []
    for i in sorted({*known, *(i for i, text in enumerate(says) if text)}):
        warnings.warn(
            f"{batch.sample(i)}: damaged JPEG data (libjpeg decodes it with a warning, part of "
            "the image is wrong); `latecast info --verify` checks a store",
            stacklevel=4,
        )
    if said and not any(says):
        os.write(2, said.encode())
    return out


def libjpeg_says(files: list, channels: int) -> list[str]:
    """What libjpeg writes to fd 2 while ``decoder()`` decodes each file alone on the CPU
    ("" for a clean or empty file); a file it cannot decode raises ``RuntimeError``."""
    said = [""] * len(files)
    for k, f in enumerate(files):
        if len(f):  # wrap: a file decoded on the host (no JPEG) stands empty here
            with _fd2() as text, warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Python's own (torchvision's deprecation) out
                read([f], channels, torch.device("cpu"))
            said[k] = text[0]
    return said


@contextlib.contextmanager
def _fd2() -> Iterator[list[str]]:
    """fd 2 sent to a temporary file while the block runs; what was written there (by libjpeg,
    or another thread meanwhile: ``_named`` passes that on) is then the yielded list's item.
    The process keeps its file, emptied after each use (one a batch cost 0.2 ms)."""
    said: list[str] = []
    with _fd2_lock:
        if (fd := _fd2_files.get(os.getpid())) is None:
            with tempfile.TemporaryFile() as tmp:  # its descriptor kept: no file object left open
                fd = _fd2_files[os.getpid()] = os.dup(tmp.fileno())
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(fd, 2)
        try:
            yield said
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            written = os.lseek(fd, 0, os.SEEK_CUR)  # fd 2 shared its offset
            said.append(os.pread(fd, written, 0).decode(errors="replace"))
            if written:
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
