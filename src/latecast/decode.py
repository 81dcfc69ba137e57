"""JPEG batches decoded where the pixels are used: the first step of the prepare stage for
encoded stores (``EncodedDataset``, moved by the ``jpeg`` mover as ``data.Encoded``) and
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
- CPU: simplejpeg where it imports (``cpu_decoder``: libjpeg-turbo as TorchCodec uses it,
  the same pixels, without its per-call overhead), else the decoder above; a thread pool
  of ``torch.get_num_threads()`` (one: the caller's thread), each thread decoding its
  share one file at a time (both torch decoders decode a list in a Python loop, no
  faster) and writing each image straight into its slot of the batch; the decoders
  release the GIL, so threads scale. Files already at the training size (CIFAR-10) go
  through one tight loop (no crop boxes; no header read either when the store's
  meta.json says every file is ``plain``): in the loader 20 -> 16 CPU-us a CIFAR-10 file,
  simplejpeg's own call about 14.5 of it (issue 29). Measured on 2 vCPUs (Xeon,
  torchvision 0.29, lightly loaded), the op called in one thread and in two: CIFAR-10
  32x32 files 32,000/s and 45,000/s; 500x375 photos 450/s and 806/s.

libjpeg reports damaged scan data ("Corrupt JPEG data: N extraneous bytes before marker 0xd9")
as a warning written from C to fd 2, not as a Python warning, and decodes the file anyway,
partly wrong. So a batch is decoded with fd 2 sent to a temporary file (``_fd2``, ~60 us); when
anything was written there, each file is decoded again alone to find which, and each is
named in one Python warning (store and sample index), never libjpeg's own text.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import tempfile
import threading
import warnings
from functools import lru_cache
from typing import Callable, Iterator

import numpy as np
import torch

from .data import Encoded
from .errors import ConfigError, FormatError
from .jpegheader import jpeg_header, jpeg_headers
from .threads import count, one_thread, pool
from .transforms import centre_boxes, crop_into, resized_crop

_fd2_lock = threading.Lock()  # fd 2 is the process's: one redirection at a time

DECODERS = ("torchcodec", "torchvision")
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


def read(files: list[torch.Tensor], channels: int, device: torch.device) -> list[torch.Tensor]:
    """JPEG files (1-D uint8 on the CPU) -> ``(channels, H, W)`` uint8 images on ``device``,
    upright (EXIF orientation applied): one batched call of the chosen decoder on a GPU,
    one call per file on the CPU (``_one``)."""
    if torch.device(device).type == "cpu" or not files:
        return list(map(_one(channels), files))
    mode = {1: "GRAY", 3: "RGB"}[channels]
    if decoder().startswith("torchcodec"):
        from torchcodec.decoders import decode_jpeg

        return decode_jpeg(files, mode=mode, device=device)
    from torchvision.io import ImageReadMode, decode_jpeg

    return list(map(_upright, files, decode_jpeg(files, ImageReadMode[mode], device)))


def _one(channels: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """The chosen decoder for one file on the CPU: ``(channels, H, W)`` uint8, upright."""
    mode = {1: "GRAY", 3: "RGB"}[channels]
    if decoder().startswith("torchcodec"):
        from torchcodec.decoders import _image_decoders as tc

        native = {m.name for m in getattr(tc, "_JPEG_NATIVE_OUTPUT_MODES", ())}
        if mode in native:  # decode_jpeg's own op, less its checks: 18 us a CIFAR file, not 22
            value = tc.ImageReadMode[mode].value
            return lambda f: tc._decode_jpeg(f, value)
        return functools.partial(tc.decode_jpeg, mode=mode)
    from torchvision.io import ImageReadMode, decode_jpeg

    return lambda f: _upright(f, decode_jpeg(f, ImageReadMode[mode]))


@lru_cache(maxsize=None)
def cpu_decoder() -> str:
    """The decoder of JPEG batches on a CPU device: ``"simplejpeg <version>"`` where
    simplejpeg >= 1.8 imports and ``LATECAST_DECODER`` picks no other, else ``decoder()``.
    simplejpeg calls libjpeg-turbo's TurboJPEG API straight into a numpy array: the same
    pixels as TorchCodec (both libjpeg-turbo, exact IDCT, fancy upsampling) at half its
    cost a CIFAR-10 file (12 vs 25 us, 1 thread, loaded 2-core machine; photos alike)."""
    if not os.environ.get("LATECAST_DECODER"):
        try:
            import simplejpeg

            version = simplejpeg.__version__
            if tuple(map(int, version.split(".")[:2])) >= (1, 8):  # buffer= and strict=
                return f"simplejpeg {version}"
        except Exception:  # absent, or a build that does not load
            pass
    return decoder()


def decoder_on(device: torch.device) -> str:
    """The decoder of JPEG batches for ``device``: ``cpu_decoder()`` or ``decoder()``."""
    return cpu_decoder() if torch.device(device).type == "cpu" else decoder()


def _turbo(
    data: np.ndarray, channels: int, into: np.ndarray | None, head: tuple | None = None
) -> tuple[np.ndarray | None, bool]:
    """simplejpeg's decoding of one file, upright ``(H, W, C)`` (written straight into
    ``into``, a slot of the batch, and then ``into`` itself, when it fits it as stored),
    and whether libjpeg warned (damaged data: decoded again leniently, as the other
    decoders decode it). ``(None, False)`` leaves the file to ``decoder()``: a header it
    cannot read, 4 channels (CMYK: simplejpeg's conversion differs from TorchCodec's by 1-2
    grey levels), or a file simplejpeg cannot decode (12-bit), which the other then names.
    ``head``: the file's ``jpeg_header`` when read already (wrap's fields)."""
    import simplejpeg

    head = head or jpeg_header(data)  # (H, W, channels, orientation), upright
    if head is None or head[2] == 4:
        return None, False
    space, fits = ("GRAY" if channels == 1 else "RGB"), into is not None and head[3] == 1
    buffer = into if fits and into.shape[:2] == head[:2] else None
    try:
        image, damaged = simplejpeg.decode_jpeg(data, space, buffer=buffer), False
        image = image if buffer is None else buffer  # the same pixels: its own view
    except ValueError:  # strict (the default): raised for libjpeg's warnings too
        try:
            image, damaged = simplejpeg.decode_jpeg(data, space, strict=False), True
        except ValueError:
            return None, False
    turn = _TURNS.get(head[3])
    if turn is not None:  # (H, W, C) as (C, H, W) for the turn, and back
        image = turn(torch.from_numpy(image).permute(2, 0, 1)).permute(1, 2, 0).numpy()
    return image, damaged


def _upright(file: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
    """torchvision's decoding of ``file`` turned by the EXIF orientation of its header."""
    turn = _TURNS.get((jpeg_header(file.numpy()) or (0, 0, 0, 1))[3])
    return image if turn is None else turn(image)


def decode(batch: Encoded, size: tuple[int, int], boxes: torch.Tensor | None = None):
    """The batch's files as uint8 ``(n, H, W, C)`` on ``batch.device``, ``size = (H, W)``;
    a file libjpeg warns about is named in one warning (``_named``).

    Args:
        batch: what the ``jpeg`` mover yields.
        size: the training size.
        boxes: ``(n, 4)`` int64 ``(top, left, height, width)`` in the stored images, on the
            CPU (e.g. ``transforms.resized_crop_params``); None: ``centre_boxes``.
    """
    with _fd2() as said, one_thread():
        if batch.device.type == "cpu":
            images, damaged = _decode_cpu(batch, tuple(size), boxes)
        else:
            boxes = centre_boxes(batch.sizes, size) if boxes is None else boxes
            images, damaged = resized_crop(_decode_gpu(batch), boxes, size), []
    return _named(said[0], batch, images, damaged)


def _decode_gpu(batch: Encoded) -> list[torch.Tensor]:
    """One nvJPEG call for the batch: ``(H, W, C)`` views, sizes checked."""
    files, sizes, dev = batch.files(), batch.sizes.tolist(), batch.device
    todo = [i for i in range(len(files)) if i not in batch.decoded]
    try:
        done = dict(zip(todo, read([files[i] for i in todo], batch.channels, dev)))
    except RuntimeError as err:  # name the first file that does not decode
        for i in todo:
            try:
                read([files[i]], batch.channels, torch.device("cpu"))
            except RuntimeError as bad:
                raise _undecodable(batch, i, bad) from None
        raise FormatError(
            f"{batch.source}: the batch did not decode on {dev}, though each file "
            f"does on the CPU ({err})"
        ) from None
    images = [done[i] if i in done else batch.decoded[i].to(dev) for i in range(len(files))]
    for i, im in enumerate(images):
        _check_size(im.shape[1:], sizes[i], batch, i)
    return [im.permute(1, 2, 0) for im in images]


def _decode_cpu(
    batch: Encoded, size: tuple[int, int], boxes: torch.Tensor | None
) -> tuple[torch.Tensor, list]:
    """The thread pool: each thread decodes its share of the files and writes each image
    straight into its slot of the batch: decoded there (simplejpeg) or stacked there
    (``decoder()``) when every file already is the training size (CIFAR-10), else resized
    into it one at a time (photos). Returns the batch and the files libjpeg warned about
    (simplejpeg's; the other decoders' warnings are read from fd 2). Per CIFAR-10 file,
    1 thread, loaded 2-core machine: 60 us before issue 21, 26 with TorchCodec's op (19-22
    of it), 15 with simplejpeg's (12 of it the call itself: the loop's Python and a
    header read, which a ``plain`` store's files skip, make the rest)."""
    n, one, at = len(batch), _one(batch.channels), batch.offsets
    whole = bool((batch.sizes == torch.tensor(size)).all()) and (
        boxes is None or bool((boxes == torch.tensor([0, 0, *size])).all())
    )  # every file the training size, none cropped: no boxes (CIFAR's)
    sizes = [list(size)] * n if whole else batch.sizes.tolist()
    boxes = None if whole else (centre_boxes(batch.sizes, size) if boxes is None else boxes)
    turbo, damaged, heads = cpu_decoder().startswith("simplejpeg"), [], batch.heads or [None] * n
    if turbo:  # numpy views: 0.2 us a file, a tensor view 1-2
        data = batch.data.numpy()
        files = [data[a:b] for a, b in zip(at, at[1:])]
    else:
        files = batch.data[at[0] : at[-1]].split([b - a for a, b in zip(at, at[1:])])  # 1 call
    out = torch.empty((n, *size, batch.channels), dtype=torch.uint8)
    # files whose header says they decode into their slot as they are: the training size,
    # upright, 1 or 3 channels (CIFAR's); 0.5 us a file of Python beside the decode's 12
    fits, want = {(*size, 1, 1), (*size, 3, 1)}, (*size, batch.channels)
    plain_head = (*size, batch.channels, 1) if batch.plain and whole else None  # read none
    if turbo and batch.heads is None and plain_head is None:  # 0.4 us a file, one by one 1.9
        heads = jpeg_headers(files)
    space = "GRAY" if batch.channels == 1 else "RGB"
    if turbo:
        import simplejpeg

    def upright(i: int, into: np.ndarray | None = None):  # (H, W, C), a tensor or an array
        image = batch.decoded.get(i)
        if image is None and turbo:
            image, bad = _turbo(files[i], batch.channels, into, heads[i])
            damaged.extend([i] * bad)
        elif image is not None:
            image = image.permute(1, 2, 0).numpy()
        if image is None:
            try:
                file = torch.from_numpy(files[i]) if turbo else files[i]
                image = one(file).permute(1, 2, 0)
            except RuntimeError as bad:
                raise _undecodable(batch, i, bad) from None
        _check_size(image.shape[:2], sizes[i], batch, i)
        return image

    def part(rows: range) -> None:
        if whole and not turbo:
            torch.stack(list(map(upright, rows)), out=out[rows.start : rows.stop])
            return
        slots = out.numpy()  # numpy views of the slots: 0.2 us each, a tensor's 1-2
        for i in rows:
            if whole and turbo and i not in batch.decoded:  # the hot loop: straight into the slot
                if (heads[i] or plain_head) in fits:  # heads: read above, unless plain
                    try:
                        if simplejpeg.decode_jpeg(files[i], space, buffer=slots[i]).shape == want:
                            continue
                    except ValueError:  # damaged: decoded again below, leniently, and named
                        pass
            if not whole:
                image = upright(i)
                image = torch.from_numpy(image) if isinstance(image, np.ndarray) else image
                crop_into(image, boxes[i], out[i])
            else:
                slot = slots[i]
                image = upright(i, slot)
                if image is not slot:  # not decoded in its slot
                    slot[...] = image

    threads, boxes = count(), None if whole else boxes.tolist()
    step = -(-n // threads) or 1  # contiguous shares: an error names the first bad file
    shares = [range(a, min(a + step, n)) for a in range(0, n, step)]
    if len(shares) > 1:
        list(pool(threads).map(part, shares))
    elif shares:  # one: decoded here (a pool thread waits for a core to wake on a busy machine)
        part(shares[0])
    return out, sorted(damaged)


def _undecodable(batch: Encoded, i: int, err: Exception) -> FormatError:
    return FormatError(f"{batch.sample(i)}: not a decodable JPEG ({err})")


def _check_size(hw: torch.Size, size: list[int], batch: Encoded, i: int) -> None:
    """A decoded image's ``(H, W)`` must be what sizes.npy gives its file: the crop boxes
    are drawn from those (too large: out of the image; too small: the wrong crop)."""
    if list(hw) != size:
        raise FormatError(
            f"{batch.sample(i)}: the file is "
            f"{hw[0]}x{hw[1]}, sizes.npy says {size[0]}x{size[1]} "
            f"(an edited store, or one written when convert ignored EXIF orientation: "
            f"convert it again)"
        )


def _named(said: str, batch: Encoded, out: torch.Tensor, known: list = ()) -> torch.Tensor:
    """``out``, after one warning per file of ``batch`` that libjpeg warned about: ``known``
    (simplejpeg's), and those found by decoding each again alone when fd 2 ``said``
    anything; text no file makes again was not libjpeg's: passed on."""
    if not said and not known:
        return out
    says = libjpeg_says(batch.files(), batch.channels) if said else []
    damaged = sorted({*known, *(i for i, text in enumerate(says) if text)})
    for i in damaged:
        warnings.warn(
            f"{batch.sample(i)}: damaged JPEG data (libjpeg decodes "
            f"it with a warning, part of the image is wrong); `latecast info --verify` checks "
            f"a store",
            stacklevel=4,
        )
    if said and not any(says):
        os.write(2, said.encode())
    return out


def libjpeg_says(files: list, channels: int) -> list[str]:
    """What libjpeg writes to fd 2 while decoding each file alone on the CPU ("" for a file
    it decodes cleanly); a file it cannot decode at all raises as in ``decode``."""
    said = []
    for f in files:
        if not len(f):  # wrap: a file decoded on the host (no JPEG) stands empty here
            said.append("")
            continue
        with _fd2() as text, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Python's own (torchvision's deprecation) stay out
            read([f], channels, torch.device("cpu"))
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
