"""IDX reader/writer: round trips, every bad input, fuzzing."""

from __future__ import annotations

import gzip
import os
import random
import struct
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from latecast.errors import ConfigError, FormatError, LatecastError
from latecast.storage.fileio import atomic_write
from latecast.storage.idxfile import TYPES, check_role, parse_idx, read_idx, write_idx

SHAPES = [(7,), (3, 5), (4, 2, 3), (2, 1, 3, 2), (0, 4)]


def idx_bytes(array: np.ndarray, code: int) -> bytes:
    """An IDX file built by hand from the spec: the oracle the reader is checked against."""
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(TYPES[code]).tobytes()


def sample(code: int, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Values that span the type, extremes included."""
    dtype = TYPES[code].newbyteorder("=")
    rng = np.random.default_rng(seed)
    if dtype.kind == "f":
        values = rng.standard_normal(shape) * 1e3
        flat = values.reshape(-1)
        flat[:3] = [np.finfo(dtype).max, np.finfo(dtype).tiny, -0.0][: flat.size]
        return values.astype(dtype)
    info = np.iinfo(dtype)
    values = rng.integers(info.min, info.max, size=shape, endpoint=True).astype(dtype)
    values.reshape(-1)[:2] = [info.min, info.max][: values.size]
    return values


def fuzz_idx(data: bytes) -> None:
    """One fuzz case: ``parse_idx`` returns a consistent array or raises a LatecastError."""
    try:
        array = parse_idx(data, "fuzz.idx")
    except LatecastError as e:
        assert "fuzz.idx" in str(e)
        return
    raw = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
    assert array.dtype.isnative and array.flags.writeable
    assert 4 + 4 * array.ndim + array.nbytes == len(raw)
    assert raw[2] in TYPES and array.dtype == TYPES[raw[2]].newbyteorder("=")


# --- round trips ------------------------------------------------------------------------


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("code", sorted(TYPES))
def test_round_trip(tmp_path, code, shape, compress):
    array = sample(code, shape)
    path = tmp_path / "data.idx"
    write_idx(path, array, compress=compress)
    raw = gzip.decompress(path.read_bytes()) if compress else path.read_bytes()
    assert raw == idx_bytes(array, code)
    back = read_idx(path)
    assert back.dtype == array.dtype and back.shape == array.shape and back.dtype.isnative
    np.testing.assert_array_equal(back, array)
    np.testing.assert_array_equal(parse_idx(path.read_bytes(), "x"), array)


def test_gzip_detected_by_bytes_not_name(tmp_path):
    labels = np.arange(10, dtype=np.uint8)
    path = tmp_path / "labels-idx1-ubyte"  # gzipped, but no .gz suffix
    path.write_bytes(gzip.compress(idx_bytes(labels, 0x08)))
    np.testing.assert_array_equal(read_idx(path), labels)


def test_compressed_write_is_deterministic(tmp_path):
    array = sample(0x0C, (4, 4))
    write_idx(tmp_path / "a", array, compress=True)
    write_idx(tmp_path / "b", array, compress=True)
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()


@pytest.mark.parametrize(
    "array",
    [
        np.zeros(3, np.int64),
        np.zeros((), np.uint8),
        np.zeros((1,) * 33, np.uint8),
        np.broadcast_to(np.uint8(0), (2**32,)),
    ],
)  # a view: no memory
def test_write_refuses_what_idx_cannot_hold(tmp_path, array):
    with pytest.raises(ConfigError):
        write_idx(tmp_path / "x", array)
    assert not (tmp_path / "x").exists()


def test_atomic_write_keeps_the_old_file_on_error(tmp_path):
    path = tmp_path / "data.idx"
    write_idx(path, np.arange(5, dtype=np.uint8))
    before = path.read_bytes()
    with pytest.raises(RuntimeError):
        with atomic_write(path) as f:
            f.write(b"half a file")
            raise RuntimeError("crash mid-write")
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["data.idx"]  # no temp file left behind


# --- every bad input names the file -----------------------------------------------------

VALID = idx_bytes(np.arange(24, dtype=np.uint8).reshape(2, 3, 4), 0x08)  # 16 + 24 bytes
BAD = {
    "longer": (VALID + b"\0", ["40", "41"]),
    "shorter": (VALID[:-1], ["40", "39"]),
    "html": (b"<!DOCTYPE html><html><body>Not Found</body></html>", ["HTML page"]),
    "html gzipped": (gzip.compress(b"\n<html>rate limited</html>"), ["HTML page"]),
    "unknown type": (b"\0\0\x0a\x01\0\0\0\x01\x05", ["0x0A", "0x08 (uint8)", "0x0E (float64)"]),
    "ndim 0": (b"\0\0\x08\x00", ["0 dimensions"]),
    "ndim 100": (b"\0\0\x08\x64" + b"\0\0\0\x01" * 100 + b"\x07", ["100 dimensions", "1 to 32"]),
    "header cut short": (b"\0\0\x08\x03\0\0\0\x02\0\0", ["cut short", "16"]),
    "magic cut short": (b"\0\0", ["cut short"]),
    "not idx": (b"PK\x03\x04zipfile", ["not an IDX file", "50 4b 03 04"]),
    "empty": (b"", ["empty"]),
    "absurd dims": (b"\0\0\x08\x02\x80\0\0\0\x80\0\0\0", ["4,611,686,018,427,387,916", "12 bytes"]),
    "absurd dims gzipped": (gzip.compress(b"\0\0\x0d\x02\x80\0\0\0\x80\0\0\0"), ["18,446,744"]),
    "gzip longer": (gzip.compress(VALID + b"extra"), ["40", "45"]),
    "gzip shorter": (gzip.compress(VALID[:-3]), ["40", "37"]),
    "gzip truncated": (gzip.compress(VALID)[:-6], ["gzip"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_a_clear_error_naming_the_file(tmp_path, case):
    data, words = BAD[case]
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(data)
    for read in (lambda: read_idx(path), lambda: parse_idx(data, str(path))):
        with pytest.raises(FormatError) as err:
            read()
        message = str(err.value)
        assert str(path) in message and "\n" not in message
        for word in words:
            assert word in message


def test_absurd_header_allocates_nothing(tmp_path):
    path = tmp_path / "huge-idx3-ubyte"
    path.write_bytes(b"\0\0\x0e\x03" + struct.pack(">3I", 2**31, 2**31, 2**31) + b"\0" * 64)
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match="needs"):
            read_idx(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_missing_file_is_a_format_error(tmp_path):
    with pytest.raises(FormatError, match="nothing-here"):
        read_idx(tmp_path / "nothing-here")


def test_check_role_names_role_and_file():
    images = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(FormatError) as err:
        check_role(images, "labels", "t10k-labels-idx1-ubyte")
    assert str(err.value) == (
        "expected labels (type 0x08, 1 dimension) but t10k-labels-idx1-ubyte "
        "holds float32 images of shape (2, 3, 4)"
    )
    with pytest.raises(
        FormatError, match="expected images .* holds uint8 labels of shape \\(5,\\)"
    ):
        check_role(np.zeros(5, np.uint8), "images", "f")
    ok = np.zeros((1, 2, 2), np.uint8)
    assert check_role(ok, "images", "f") is ok


# --- properties and fuzzing -------------------------------------------------------------

valid_files = st.builds(
    lambda code, shape, seed, gz: (lambda raw: gzip.compress(raw, mtime=0) if gz else raw)(
        idx_bytes(sample(code, tuple(shape), seed), code)
    ),
    st.sampled_from(sorted(TYPES)),
    st.lists(st.integers(0, 4), min_size=1, max_size=3),
    st.integers(0, 99),
    st.booleans(),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_files, st.data())
def test_any_truncation_is_a_latecast_error(data, draw):
    cut = draw.draw(st.integers(0, len(data) - 1))
    with pytest.raises(LatecastError):
        parse_idx(data[:cut], "cut.idx")


@settings(max_examples=300, deadline=None)
@given(valid_files, st.data())
def test_header_byte_flip_is_an_error_or_consistent(data, draw):
    raw = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
    header = 4 + 4 * raw[3]
    position = draw.draw(st.integers(0, header - 1))
    value = draw.draw(st.integers(0, 255).filter(lambda v: v != raw[position]))
    flipped = raw[:position] + bytes([value]) + raw[position + 1 :]
    fuzz_idx(flipped)
    fuzz_idx(gzip.compress(flipped))


def fuzz_corpus() -> list[bytes]:
    """Valid files of every type, then truncations, byte flips and garbage made from them."""
    rng = random.Random(1234)
    corpus = []
    for code in sorted(TYPES):
        for shape in [(3,), (2, 3), (1, 2, 2)]:
            raw = idx_bytes(sample(code, shape), code)
            packed = gzip.compress(raw, mtime=0)
            corpus += [raw, packed]
            corpus += [raw[:k] for k in range(len(raw))]
            corpus += [packed[:k] for k in range(0, len(packed), 3)]
            for pos in range(min(len(raw), 20)):
                for value in (0x00, 0x01, 0x7F, 0x80, 0xFF, raw[pos] ^ 0x10):
                    corpus.append(raw[:pos] + bytes([value]) + raw[pos + 1 :])
            for _ in range(20):
                pos = rng.randrange(len(packed))
                corpus.append(packed[:pos] + bytes([rng.randrange(256)]) + packed[pos + 1 :])
    corpus += [bytes(rng.randrange(256) for _ in range(rng.randrange(40))) for _ in range(300)]
    corpus += [b"\0\0" + bytes([c, n]) + b"\0\0\0\x01" * 4 for c in range(256) for n in (0, 1, 4)]
    return corpus


def test_fuzz_corpus():
    corpus = fuzz_corpus()
    assert len(corpus) > 2000
    for data in corpus:
        fuzz_idx(data)


def test_a_file_of_no_images_or_labels_is_named(tmp_path, run_cli):
    """A valid header of 0 items (or 0-pixel images) got 'cannot compute mean/std of an
    empty dataset', naming no file."""
    for shape, role in [((0, 28, 28), "images"), ((0,), "labels"), ((3, 0, 28), "images")]:
        path = tmp_path / f"{role}-idx"
        write_idx(path, np.zeros(shape, np.uint8))
        with pytest.raises(FormatError, match=rf"^{path}: {role} of shape .*that is none$"):
            check_role(read_idx(path), role, str(path))
    for split in ("train", "t10k"):
        write_idx(tmp_path / f"{split}-images-idx3-ubyte", np.zeros((0, 28, 28), np.uint8))
        write_idx(tmp_path / f"{split}-labels-idx1-ubyte", np.zeros((0,), np.uint8))
    proc = run_cli("info", "mnist", "--data-root", tmp_path)
    assert proc.rc == 1 and proc.err == (
        f"latecast: error: {tmp_path}/train-images-idx3-ubyte: images of shape (0, 28, 28), "
        "that is none\n"
    )


def test_a_header_of_a_zero_and_huge_dimensions_is_a_format_error():
    """A flipped ndim byte: a 0 dimension (no bytes claimed, the size agrees) beside ones
    numpy cannot multiply (found by the property test: a ValueError, now a FormatError)."""
    dims = (3, 4, 2**31, 2**32 - 1, 2**20, 0, 2**31)
    data = bytes([0, 0, 0x0E, len(dims)]) + struct.pack(f">{len(dims)}I", *dims)
    with pytest.raises(FormatError, match=r"huge.idx: IDX header .* is no array numpy can hold"):
        parse_idx(data, "huge.idx")
