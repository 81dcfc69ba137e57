"""The header of a JPEG file, read without its pixels and without torch (``convert``'s workers
load none): its size as it shows upright, its channels and its EXIF orientation."""

from __future__ import annotations

import struct
from typing import Iterable

JPEG_SIDE = 65_535  # pixels: the largest height or width a JPEG file can have
MAX_PIXELS = 10_000 * 10_000  # larger images are refused from their header, before decoding
SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_FRAME = struct.Struct(">HHB")  # a frame header's height, width and channels


def too_big(head: tuple | None) -> str | None:
    """Why an image whose header says ``(H, W, ...)`` is refused: over ``MAX_PIXELS`` (a
    decompression bomb), else None."""
    if head is None or head[0] * head[1] <= MAX_PIXELS:
        return None
    return f"{head[1]}x{head[0]} image is larger than the {MAX_PIXELS:,} pixels allowed"


def jpeg_header(data) -> tuple[int, int, int, int] | None:
    """``(H, W, channels, EXIF orientation)`` of a JPEG file (any buffer of its bytes), H and W
    as it shows upright; None for what is not a readable JPEG. Reads no pixels."""
    return _walk(data)[0]


def jpeg_headers(files: Iterable) -> list[tuple[int, int, int, int] | None]:
    """``jpeg_header`` of each file: a file that starts as the last one walked, up to its frame
    header (one encoder's: the same markers, tables and EXIF), is read there, not walked."""
    out: list = []
    prefix, at, head = b"", 0, None
    for data in files:
        if prefix and len(data) > at + 9 and _starts(data, prefix):  # the last head's EXIF
            head = _upright(*_FRAME.unpack_from(data, at + 5), head[3])
        else:
            head, at = _walk(data)
            prefix = bytes(memoryview(data).cast("B")[: at + 2]) if head else b""
        out.append(head)
    return out


def _starts(data, prefix: bytes) -> bool:
    if isinstance(data, bytes):
        return data.startswith(prefix)
    if getattr(data, "itemsize", 0) == 1 and data.ndim == 1:  # an array of bytes: slice it,
        return data[: len(prefix)].tobytes() == prefix  # 2.5x faster than a memoryview cast
    return bytes(memoryview(data).cast("B")[: len(prefix)]) == prefix


def _upright(h: int, w: int, c: int, orientation: int) -> tuple[int, int, int, int]:
    """The header as it shows upright: orientations 5-8 turn the image a quarter."""
    return (w, h, c, orientation) if orientation >= 5 else (h, w, c, orientation)


def _walk(data) -> tuple[tuple[int, int, int, int] | None, int]:
    """``jpeg_header(data)`` and where its frame header (SOF) starts."""
    mv, i, orientation = memoryview(data).cast("B"), 2, 1
    if len(mv) < 4 or mv[0] != 0xFF or mv[1] != 0xD8:
        return None, 0
    while i + 9 < len(mv) and mv[i] == 0xFF and mv[i + 1] != 0xDA:  # 0xDA: the scan, no frame
        marker, length = mv[i + 1], mv[i + 2] << 8 | mv[i + 3]
        if marker == 0xFF:  # a fill byte
            i += 1
            continue
        if marker == 0xE1 and mv[i + 4 : i + 10] == b"Exif\0\0":
            orientation = _orientation(bytes(mv[i + 10 : i + 2 + length]))
        if marker in SOF:
            return _upright(*_FRAME.unpack_from(mv, i + 5), orientation), i
        i += 2 + length
    return None, 0


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
