"""Strict reader and writer for IDX files (MNIST, Fashion-MNIST, KMNIST): a magic
``00 00 <type> <ndim>``, ``ndim`` big-endian uint32 dimensions, then the values, big-endian, in
C order; gzip recognised by its first bytes. The header is checked against the file's size
before anything is allocated. Every problem is a ``FormatError`` naming the file.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import math
import os
import struct
import zlib
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..errors import ConfigError, FormatError
from .fileio import atomic_write

# type code -> dtype as stored (big-endian), from the IDX description on the MNIST page
_CODES = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
TYPES: dict[int, np.dtype] = {code: np.dtype(t) for code, t in _CODES.items()}
_VALID = ", ".join(f"0x{code:02X} ({dt.name})" for code, dt in TYPES.items())
# deflate never compresses better than about 1032:1, so a gzip of n bytes cannot hold more
# than ~1032 n bytes: a header promising more is rejected before decompressing anything
_GZIP_RATIO = 1032
_CHUNK = 1 << 20
_MAX_NDIM = 32  # numpy 1.x's limit (2.x: 64); IDX itself allows 255
# role -> number of dimensions; both roles are uint8 (type 0x08)
ROLES: dict[str, int] = {"images": 3, "labels": 1}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """An IDX file (gzip detected from its bytes) as a native-byte-order numpy array."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return _read(f, os.fstat(f.fileno()).st_size, str(path))
    except OSError as e:
        raise FormatError(f"{path}: cannot read the file: {e.strerror or e}") from e


def parse_idx(data: bytes, name: str) -> np.ndarray:
    """The bytes of an IDX file (gzipped or not) as ``read_idx`` reads it; ``name`` in messages."""
    return _read(io.BytesIO(data), len(data), name)


def _read(f: BinaryIO, size: int, name: str) -> np.ndarray:
    if size == 0:
        raise FormatError(f"{name}: empty file (0 bytes), expected an IDX file")
    gzipped = f.read(2) == b"\x1f\x8b"
    f.seek(0)
    if not gzipped:
        return _parse(f, name, size, limit=size)
    try:
        with gzip.GzipFile(fileobj=f, mode="rb") as gz:
            return _parse(gz, name, None, limit=size * _GZIP_RATIO + 1024)
    except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError
        raise FormatError(f"{name}: corrupt or truncated gzip stream ({e})") from e


def _parse(f: BinaryIO, name: str, size: int | None, limit: int) -> np.ndarray:
    """``size`` is the exact size of a plain file; None for a gzip stream (``limit`` bounds it)."""
    what = "the file" if size is not None else "the decompressed data"
    magic = f.read(4)
    if magic.lstrip()[:1] == b"<":
        raise FormatError(
            f"{name}: looks like an HTML page (starts with '<'), not an IDX file; "
            "was it saved from a web page or an error response?"
        )
    if len(magic) < 4:
        raise FormatError(
            f"{name}: IDX header cut short: {what} has {len(magic)} bytes, the magic alone needs 4"
        )
    if magic[:2] != b"\0\0":
        raise FormatError(
            f"{name}: not an IDX file: starts with {magic.hex(' ')}, expected 00 00 <type> <ndim>"
        )
    code, ndim = magic[2], magic[3]
    if code not in TYPES:
        raise FormatError(f"{name}: unknown IDX type code 0x{code:02X}; valid codes: {_VALID}")
    if not 1 <= ndim <= _MAX_NDIM:
        raise FormatError(f"{name}: IDX header has {ndim} dimensions, expected 1 to {_MAX_NDIM}")
    raw_dims = f.read(4 * ndim)
    header = 4 + 4 * ndim
    if len(raw_dims) < 4 * ndim:
        raise FormatError(
            f"{name}: IDX header cut short: {ndim} dimensions need {header} header "
            f"bytes, {what} has {4 + len(raw_dims)}"
        )
    dims = struct.unpack(f">{ndim}I", raw_dims)
    dtype = TYPES[code]
    nbytes = math.prod(dims) * dtype.itemsize  # Python ints: no overflow, nothing allocated
    expected = header + nbytes
    described = f"{dtype.name} {dims}"
    if size is not None and expected != size or expected > limit:
        found = f"at most {limit:,} bytes when decompressed" if size is None else f"{size:,} bytes"
        raise FormatError(
            f"{name}: IDX header ({described}) needs {expected:,} bytes but {what} holds {found}"
        )
    payload = f.read(nbytes)
    if size is None:  # gzip: the decompressed length is only known by reading it
        actual = header + len(payload) + sum(map(len, iter(lambda: f.read(_CHUNK), b"")))
        if actual != expected:
            raise FormatError(
                f"{name}: IDX header ({described}) needs {expected:,} bytes but "
                f"{what} holds {actual:,} bytes"
            )
    try:  # (N, ...) big-endian -> native order; astype copies, so the result is writable
        return np.frombuffer(payload, dtype).reshape(dims).astype(dtype.newbyteorder("="))
    except ValueError as e:  # a dimension 0 beside ones whose product numpy cannot hold
        raise FormatError(f"{name}: IDX header ({described}) is no array numpy can hold") from e


def check_role(array: np.ndarray, role: str, name: str) -> np.ndarray:
    """``array`` (read from ``name``) once it fits ``role``: ``"images"`` uint8 ``(N, H, W)``,
    ``"labels"`` uint8 ``(N,)``."""
    ndim = ROLES[role]
    if array.dtype != np.uint8 or array.ndim != ndim:
        kind = next((r for r, n in ROLES.items() if n == array.ndim), "data")
        raise FormatError(
            f"expected {role} (type 0x08, {ndim} dimension{'s' if ndim > 1 else ''}) "
            f"but {name} holds {array.dtype} {kind} of shape {tuple(array.shape)}"
        )
    if 0 in array.shape:  # a valid IDX header of nothing: "empty dataset" would name no file
        raise FormatError(f"{name}: {role} of shape {tuple(array.shape)}, that is none")
    return array


def write_idx(path: str | os.PathLike, array: np.ndarray, *, compress: bool = False) -> None:
    """``array`` (uint8, int8, int16, int32, float32 or float64, 1 to 32 dimensions) as an
    IDX file at ``path``, atomically; ``compress``: gzipped, with no timestamp."""
    array = np.asarray(array)
    code = next((c for c, dt in TYPES.items() if dt.str[1:] == array.dtype.str[1:]), None)
    if code is None:
        raise ConfigError(f"IDX cannot store {array.dtype}; valid types: {_VALID}")
    if not 1 <= array.ndim <= _MAX_NDIM or max(array.shape) >= 2**32:
        raise ConfigError(
            f"IDX needs 1..{_MAX_NDIM} dimensions each below 2^32, got shape {array.shape}"
        )
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    body = np.ascontiguousarray(array, dtype=TYPES[code]).tobytes()
    with atomic_write(path) as f, contextlib.ExitStack() as stack:
        out = stack.enter_context(gzip.GzipFile(fileobj=f, mode="wb", mtime=0)) if compress else f
        out.write(header)
        out.write(body)
