"""WebDataset tar shards read through fsspec (local, ``http(s)://``, ``s3://``, ``gs://``),
and their index.

``Tar`` streams a shard's 512-byte records (gzip unpacked as it goes); members group into
samples by WebDataset's key rule. A shard cut short is a ``FormatError`` naming it and the
byte; failed reads are retried from the byte reached (``Retry``), said once. The index
(``latecast index``, or ``train`` without one; wids' layout) adds each shard's SHA-256 and
channels and each sample's key, label, CRC-32 and offset: reads are checked against it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import glob
import hashlib
import itertools
import json
import os
import posixpath
import re
import time
import warnings
import zlib
from dataclasses import dataclass
from typing import Callable, Iterator, TypeVar

import numpy as np

from ..errors import ConfigError, FormatError
from ..kinds.jpegheader import jpeg_header, too_big
from .fileio import atomic_write, cache_dir

INDEX, KIND, VERSION = "index.json", "wids-shard-index-v1", 1
RETRY_WAITS = (0.5, 1.0, 2.0, 4.0)  # seconds before each retry of a failed read: 7.5 s in all
CHUNK = 1 << 20  # bytes asked of the source per read
_BRACES = re.compile(r"\{(\d+)\.\.(\d+)\}")
_KEY = re.compile(r"^((?:.*/|)[^./][^.]*)\.([^/]*)$")  # WebDataset's: key, then extension
_REMOTE = ("http://", "https://", "s3://", "gs://", "gcs://")
_ZERO = bytes(512)
T = TypeVar("T")
_WRITE = contextvars.ContextVar("latecast_index_written", default=True)  # nothing_written's
_kept: dict[str, dict] = {}  # where an index would be -> the index, built and not written
_unkept: set[str] = set()  # where an index could not be written (said once)


def is_shards(name: str) -> bool:
    tars = name.endswith((".tar", ".tar.gz", ".tgz")) or glob.has_magic(name) and ".tar" in name
    return name.startswith(_REMOTE) or tars


def filesystem(url: str):
    """``(fs, path)`` of ``url`` through fsspec; a missing package is one line naming it."""
    try:
        import fsspec

        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as err:  # fsspec itself; aiohttp for http(s), s3fs, gcsfs
        raise ConfigError(
            f"{url}: cannot read it here ({err}); pip install 'latecast[streams]'"
        ) from None


def expand(spec: str) -> list[str]:
    """``shard-{000..009}.tar`` -> the ten names (padded as written); ``*``, ``?`` -> the files
    matching, sorted (local, or through fsspec)."""
    if m := _BRACES.search(spec):
        a, b = m.groups()
        return [
            name
            for k in range(int(a), int(b) + 1)
            for name in expand(spec[: m.start()] + str(k).zfill(len(a)) + spec[m.end() :])
        ]
    if not glob.has_magic(spec) or spec.startswith(("http://", "https://")):
        return [spec]
    if "://" not in spec:
        return sorted(glob.glob(spec))
    fs, path = filesystem(spec)
    return sorted(fs.unstrip_protocol(p) for p in fs.glob(path))


def _expanded(spec: str) -> list[str]:
    urls = expand(spec)
    if not urls:
        raise ConfigError(f"{spec}: no shards match it")
    return urls


def _transient(err: BaseException) -> bool:
    """A failure worth a retry: the network's, not a missing or forbidden file."""
    if isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return False
    if isinstance(err, (OSError, EOFError, asyncio.TimeoutError)):
        return True
    library = type(err).__module__.split(".")[0]
    return library in ("aiohttp", "botocore", "aiobotocore") and getattr(err, "status", 500) >= 500


class Retry:
    """Runs steps on one shard's source, retried with backoff (``RETRY_WAITS``) while they fail
    the network's way, said once; then, or on another failure, a ``FormatError`` naming it."""

    def __init__(self, url: str) -> None:
        self.url, self.said = url, False

    def __call__(self, step: Callable[[], T], what: Callable[[], str], undo=None) -> T:
        """``step()``; ``what()`` says where it failed ("read failed at byte 1,024"); ``undo()``
        runs after each failure (closing what the step left half open)."""
        for attempt in itertools.count():
            try:
                return step()
            except Exception as err:
                if undo is not None:
                    undo()
                # fsspec's HTTP reports a failed HEAD and GET as a missing file: the answer inside
                cause = (err.__cause__ if isinstance(err, FileNotFoundError) else None) or err
                if isinstance(cause, FileNotFoundError) or getattr(cause, "status", 0) == 404:
                    raise FormatError(f"{self.url}: no such shard") from None
                said = (str(cause).strip().splitlines() or [""])[0][:200]
                why = f"{type(cause).__name__}: {said}"
                if not _transient(cause):
                    raise FormatError(f"{self.url}: cannot read it ({why})") from None
                if attempt == len(RETRY_WAITS):
                    raise FormatError(
                        f"{self.url}: {what()} ({why}), also after {len(RETRY_WAITS)} retries"
                    ) from None
                if not self.said:
                    warnings.warn(
                        f"{self.url}: {what()} ({why}); retrying from there (up to "
                        f"{len(RETRY_WAITS)} times)",
                        stacklevel=3,
                    )
                    self.said = True
                time.sleep(RETRY_WAITS[attempt])


def shard_size(url: str) -> int | None:
    """The shard's length as its source announces it (None: unknown), retried as reads are."""
    fs, path = filesystem(url)
    return Retry(url)(lambda: fs.size(path), lambda: "asking its size failed")


class Source:
    """One shard's bytes from byte ``start`` (to ``size`` when known), hashed (SHA-256) when
    read from byte 0; a failed read is retried from the byte reached. Over HTTP the bytes
    before ``start`` are read and dropped (fsspec's HTTP stream cannot seek)."""

    def __init__(self, url: str, size: int | None, start: int = 0) -> None:
        self.url, self.size, self.pos, self.f, self.retry = url, size, start, None, Retry(url)
        self.fs, self.path = filesystem(url)
        self.hash = hashlib.sha256() if start == 0 else None

    def _open(self) -> None:
        http = self.url.startswith(("http://", "https://"))
        # HTTP with the size given asks no HEAD (whose failure fsspec calls a missing file);
        # elsewhere 8 MiB a request (s3fs's default block is 50 MiB)
        sized = {"block_size": 0, "size": self.size} if http else {"block_size": 8 * CHUNK}
        # kept at once: a skip that fails below leaves it to close() (aiohttp's connection)
        self.f = f = self.fs.open(self.path, "rb", **sized)
        if http:
            for left in range(self.pos, 0, -CHUNK):
                if not f.read(min(left, CHUNK)):
                    raise EOFError(f"it ended before byte {self.pos:,}")
        elif self.pos:
            f.seek(self.pos)

    def read(self, n: int = CHUNK) -> bytes:
        """Up to ``n`` bytes; ``b""`` only at the end (``size`` reached, or the source's end)."""
        if self.size is not None:
            n = min(n, self.size - self.pos)
            if n <= 0:
                return b""
        data = self.retry(lambda: self._read(n), lambda: f"read failed at byte {self.pos:,}",
                          self.close)  # fmt: skip
        self.pos += len(data)
        if self.hash is not None:
            self.hash.update(data)
        return data

    def _read(self, n: int) -> bytes:
        if self.f is None:
            self._open()
        data = self.f.read(n)
        if not data and self.size is not None:
            raise EOFError(f"it ended at byte {self.pos:,} of {self.size:,}")
        return data

    def close(self) -> None:
        if self.f is not None:
            with contextlib.suppress(Exception):  # a connection already gone: nothing to close
                self.f.close()
            self.f = None


class Tar:
    """The members of a tar stream read from ``source`` (gzip unpacked as it streams):
    ``(offset of the member's first header, name, data)`` for each regular file, offsets in
    the tar's own bytes; ``start``: the offset the source starts at (a sample's header)."""

    def __init__(self, source: Source, start: int = 0) -> None:
        self.src, self.at, self.buf, self.i, self.gz = source, start, b"", 0, None

    def _more(self) -> bytes:
        raw = self.src.read()
        if self.gz is None:
            gz = raw[:2] == b"\x1f\x8b" and self.src.pos == len(raw)
            self.gz = zlib.decompressobj(wbits=31) if gz else False
        if not self.gz:
            return raw
        out = self.gz.decompress(raw)
        while not out and raw:  # a gzip header alone unpacks to nothing
            raw = self.src.read()
            out = self.gz.decompress(raw)
        if not raw and not self.gz.eof:
            raise FormatError(f"{self.src.url}: the gzip stream is cut short")
        return out

    def _take(self, n: int, what: str) -> bytes:
        while len(self.buf) - self.i < n:
            more = self._more()
            if not more:
                have = len(self.buf) - self.i
                raise FormatError(
                    f"{self.src.url}: ends inside {what} at byte {self.at + have:,} (cut short?)"
                )
            self.buf, self.i = self.buf[self.i :] + more, 0
        out = self.buf[self.i : self.i + n]
        self.i, self.at = self.i + n, self.at + n
        return out

    def members(self) -> Iterator[tuple[int, str, bytes]]:
        first, long_name = None, None
        while True:
            at = self.at
            head = self._take(512, "a tar header (no end-of-archive blocks)")
            if head == _ZERO:
                return
            if sum(head[:148]) + 256 + sum(head[156:]) != _number(head[148:156], self.src.url):
                raise FormatError(f"{self.src.url}: not a tar header at byte {at:,}")
            size, kind = _number(head[124:136], self.src.url), head[156:157]
            data = self._take(size + -size % 512, f"a member at byte {at:,}")[:size]
            first = at if first is None else first
            if kind in (b"L", b"x"):  # GNU long name, pax header: for the member after them
                long_name = _long_name(kind, data) or long_name
                continue
            if kind in (b"0", b"\0", b"7"):
                name = long_name or _ustar_name(head)
                while name.startswith("./"):  # `tar -C dir .` writes ./000000.jpg
                    name = name[2:]
                yield first, name, data
            first, long_name = None, None

    def finish(self) -> None:
        """Read the rest of the source (what follows the end-of-archive blocks)."""
        while self._more():
            pass


def _number(field: bytes, url: str) -> int:
    if field[:1] == b"\x80":  # GNU base-256, for members of 8 GiB and more
        return int.from_bytes(field[1:], "big")
    try:
        return int(field.strip(b" \0") or b"0", 8)
    except ValueError:
        raise FormatError(f"{url}: not a tar file (a header field reads {field!r})") from None


def _ustar_name(head: bytes) -> str:
    name = head[:100].split(b"\0")[0].decode("utf-8", "replace")
    prefix = head[345:500].split(b"\0")[0].decode("utf-8", "replace")
    return f"{prefix}/{name}" if head[257:262] == b"ustar" and prefix else name


def _long_name(kind: bytes, data: bytes) -> str | None:
    if kind == b"L":
        return data.split(b"\0")[0].decode("utf-8", "replace")
    for record in data.decode("utf-8", "replace").splitlines():
        key, _, value = record.partition(" ")[2].partition("=")
        if key == "path":
            return value
    return None


def samples(tar: Tar) -> Iterator[tuple[int, str, dict[str, bytes]]]:
    """``(offset, key, {extension: data})`` per sample: members sharing WebDataset's key."""
    offset, key, fields = 0, None, {}
    for at, name, data in tar.members():
        found = _KEY.match(name)
        if not found:  # no extension (a README): WebDataset skips it too
            continue
        if found[1] != key:
            if key is not None:
                yield offset, key, fields
            offset, key, fields = at, found[1], {}
        ext = found[2].lower()
        if ext in fields:  # WebDataset: "duplicate file name"
            raise FormatError(f"{tar.src.url}: sample {key!r}: {name} twice (written twice?)")
        fields[ext] = data
    if key is not None:
        yield offset, key, fields


def checksum(fields: dict[str, bytes]) -> int:
    """A sample's CRC-32: over each member's extension and bytes, in the tar's order."""
    crc = 0
    for ext, data in fields.items():
        crc = zlib.crc32(data, zlib.crc32(ext.encode(), crc))
    return crc


def jpeg_and_label(url: str, key: str, fields: dict[str, bytes]):
    """A sample's ``(jpeg bytes, label, header)``; what latecast cannot train on is one line."""
    jpg, cls = fields.get("jpg", fields.get("jpeg")), fields.get("cls")
    if jpg is None or cls is None:
        has = ", ".join(f".{e}" for e in sorted(fields))
        raise FormatError(f"{url}: sample {key!r} has no .jpg and .cls (it has {has})")
    try:
        label = int(cls.decode().strip())
    except (UnicodeDecodeError, ValueError):
        raise FormatError(f"{url}: sample {key!r}: .cls {cls[:20]!r} is not an integer") from None
    head = jpeg_header(jpg)
    if head is None or not 0 <= label < 2**16:
        what = "its .jpg is not a JPEG file" if head is None else f"label {label} (0..65535)"
        raise FormatError(f"{url}: sample {key!r}: {what}")
    if why := too_big(head):  # refused from the header: decoding would allocate it
        raise FormatError(f"{url}: sample {key!r}: {why}")
    return jpg, label, head


# -- the index -------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Shard:
    """One shard as its index entry gives it."""

    url: str
    size: int  # bytes
    sha256: str
    channels: int  # 1 when every JPEG file is grey
    keys: list[str]
    offsets: np.ndarray  # (n,) int64: each sample's first tar header
    labels: np.ndarray  # (n,) int64
    crc32: np.ndarray  # (n,) each sample's ``checksum``
    gzip: bool = False  # a .tar.gz: read from its start, offsets count unpacked bytes
    redo: str = "run latecast index again"  # what indexes it again where its index is read

    def __len__(self) -> int:
        return len(self.keys)

    def probe(self) -> None:
        """Refuse a shard gone, or of another length than the index says."""
        size = shard_size(self.url)
        if size is not None and size != self.size:
            raise FormatError(
                f"{self.url}: {size:,} bytes, the index says {self.size:,} (changed or cut "
                f"short since it was indexed)"
            )

    def read(self, wanted: np.ndarray) -> Iterator[tuple[int, bytes, int, tuple]]:
        """``(sample, jpeg, label, header)`` of the samples ``wanted`` (sorted), checked
        against the index as they come (each sample's key, offset and CRC-32); a shard read
        whole is checked by its SHA-256 too."""
        self.probe()
        first, last = (0 if self.gzip else int(wanted[0])), int(wanted[-1])
        start = int(self.offsets[first]) if first else 0  # offsets count unpacked bytes
        src = Source(self.url, self.size, start)
        tar = Tar(src, start)
        try:
            k, want = first, iter(wanted.tolist())
            goal = next(want)
            for offset, key, fields in samples(tar):
                self._check(k, key, offset, fields)
                if k == goal:
                    jpg, label, h = jpeg_and_label(self.url, key, fields)
                    if label != self.labels[k]:
                        raise FormatError(
                            f"{self.url}: sample {key!r}: label {label}, the index says "
                            f"{self.labels[k]} (changed since it was indexed)"
                        )
                    yield k, jpg, label, h
                    goal = next(want, None)
                k += 1
                if goal is None and (src.hash is None or last < len(self) - 1):
                    return
            tar.finish()
            self._whole(src, k)
        finally:
            src.close()

    def _check(self, k: int, key: str, offset: int, fields: dict[str, bytes]) -> None:
        if k >= len(self) or key != self.keys[k] or offset != self.offsets[k]:
            said = f"{self.keys[k]!r} at byte {self.offsets[k]:,}" if k < len(self) else "none"
            raise FormatError(
                f"{self.url}: sample {k} is {key!r} at byte {offset:,}, the index says {said} "
                f"(changed since it was indexed: {self.redo})"
            )
        if (crc := checksum(fields)) != self.crc32[k]:
            raise FormatError(
                f"{self.url}: sample {key!r}: CRC-32 {crc:08x}, the index says "
                f"{int(self.crc32[k]):08x} (changed since it was indexed: {self.redo})"
            )

    def _whole(self, src: Source, count: int) -> None:
        """A shard read whole: its count, length and SHA-256 against the index."""
        found = src.hash.hexdigest()
        if count != len(self) or src.pos != self.size or found != self.sha256:
            raise FormatError(
                f"{self.url}: {count} samples, {src.pos:,} bytes, SHA-256 {found[:16]}..., the "
                f"index says {len(self)}, {self.size:,}, {self.sha256[:16]}... (changed since it "
                f"was indexed: {self.redo})"
            )


def index_entry(url: str) -> dict:
    """Read a shard whole (no index yet): its index entry. Empty shards are said, once."""
    src = Source(url, shard_size(url))
    rows, channels = {}, 1  # key -> (offset, label, CRC-32), in the shard's order
    try:
        tar = Tar(src)
        for offset, key, fields in samples(tar):
            _, label, head = jpeg_and_label(url, key, fields)
            if key in rows:
                raise FormatError(f"{url}: sample {key!r} twice (a key repeated in one shard)")
            rows[key] = (offset, label, checksum(fields))
            channels = max(channels, head[2])
        tar.finish()
    finally:
        src.close()
    if not rows:
        warnings.warn(f"{url}: no samples (an empty tar); skipped", stacklevel=2)
    offsets, labels, crcs = map(list, zip(*rows.values())) if rows else ([], [], [])
    return {
        "url": posixpath.basename(url),
        "nsamples": len(rows),
        "filesize": src.pos,
        "sha256": src.hash.hexdigest(),
        "channels": 3 if channels > 1 else 1,
        "keys": list(rows),
        "offsets": offsets,
        "labels": labels,
        "crc32": crcs,
        "gzip": bool(tar.gz),
    }


def index_path(urls: list[str], spec: str) -> str:
    """Where the index of ``urls`` lives: ``index.json`` in their folder (one for all)."""
    folders = {posixpath.dirname(u) for u in urls}
    if len(folders) != 1:
        raise ConfigError(f"{spec}: the shards must share one folder, they are in {len(folders)}")
    return posixpath.join(folders.pop(), INDEX)


def write_index(spec: str, output: str | None = None) -> tuple[str, list[dict]]:
    """Index the shards of ``spec`` (each read whole) into ``index.json`` beside them (or
    ``output``), atomically, keeping other shards' entries; ``(where, spec's entries)``."""
    urls = _expanded(spec)
    path = output or index_path(urls, spec)
    if output is None and path.startswith(("http://", "https://")):
        raise ConfigError(
            f"{spec}: an index cannot be written over HTTP: give --output FILE and upload it "
            f"as {path}"
        )
    index = _built(spec, urls, _read_json(path, missing_ok=True), progress=False)
    _put(path, index)
    entries = {e["url"]: e for e in index["shardlist"]}
    return path, [entries[posixpath.basename(u)] for u in urls]


def _built(spec: str, urls: list[str], old: dict, progress: bool) -> dict:
    """The index of ``urls`` (each read whole), ``old``'s entries of other shards kept."""
    entries = {e["url"]: e for e in old.get("shardlist", [])}
    shown = urls
    if progress:
        from tqdm import tqdm

        shown = tqdm(urls, desc="indexing shards", unit="shard", leave=False, disable=None)
    entries.update((e["url"], e) for e in map(index_entry, shown))
    index = {"__kind__": KIND, "wids_version": 1, "latecast_index": VERSION, "name": spec}
    index["shardlist"] = [entries[name] for name in sorted(entries)]
    return index


def _put(path: str, index: dict) -> None:
    """``index`` written at ``path`` whole or not at all."""
    text = json.dumps(index, separators=(",", ":")).encode()
    if "://" in path:
        fs, where = filesystem(path)
        fs.pipe_file(where, text)  # one PUT: an object store shows it whole or not at all
    else:
        with atomic_write(path) as f:
            f.write(text)


@contextlib.contextmanager
def nothing_written() -> Iterator[None]:
    """Within it an index ``read_index`` has to build is kept in memory for this process,
    never written (``train --check``)."""
    token = _WRITE.set(False)
    try:
        yield
    finally:
        _WRITE.reset(token)


def _read_json(path: str, missing_ok: bool = False) -> dict:
    fs, where = filesystem(path)
    try:
        return json.loads(fs.cat_file(where))
    except FileNotFoundError:
        if missing_ok:
            return {}
        raise
    except (ValueError, UnicodeDecodeError) as err:
        raise FormatError(f"{path}: not an index (not JSON: {err})") from None


def read_index(spec: str) -> list[Shard]:
    """The shards of ``spec`` as their index gives them, in ``spec``'s order; without an index
    one is built first (said)."""
    urls = _expanded(spec)
    path, found = find_index(urls, spec)
    if found:
        index = _read_json(path)
    else:  # built now, or earlier in this process and not written (--check)
        index = _kept.get(_location(path)) or _index_now(spec, urls, path)
        _keep(path, index)
    if not isinstance(index, dict) or index.get("latecast_index") != VERSION:
        raise FormatError(f"{path}: not a latecast shard index (version {VERSION})")
    try:
        entries = {e["url"]: e for e in index["shardlist"]}
    except (KeyError, TypeError):
        raise FormatError(f"{path}: its shardlist is not a list of entries with a url") from None
    return [_shard(url, entries.get(posixpath.basename(url)), path, spec) for url in urls]


def _redo(spec: str, path: str) -> str:
    """What to run to index ``spec`` again where ``train`` reads its index (``path``)."""
    if path.startswith(("http://", "https://")):  # beside the shards, on a web server
        return f"run latecast index '{spec}' --output index.json, then upload it as {path}"
    if posixpath.basename(path) != INDEX:  # the cache's, which train alone finds
        return f"run latecast index '{spec}' --output {path}"
    return "run latecast index again"


def _index_now(spec: str, urls: list[str], path: str) -> dict:
    """The index of ``urls``, each read whole now (said)."""
    what = (
        f"index them into {path} (kept for the next run; latecast index does it ahead)"
        if _WRITE.get()
        else f"check them, writing nothing (--check); train would keep their index in {path}"
    )
    warnings.warn(f"{spec}: no index of these shards: reading each once to {what}", stacklevel=3)
    return _built(spec, urls, {}, progress=True)


def _keep(path: str, index: dict) -> None:
    """``index`` written at ``path`` for the next run, or kept in memory for this process:
    within ``nothing_written``, or where it cannot be written (said once)."""
    where = _location(path)
    if _WRITE.get() and where not in _unkept:
        try:
            _put(path, index)
            _kept.pop(where, None)
            return
        except OSError as err:  # a cache folder not writable: the shards' reads kept anyway
            warnings.warn(
                f"{path}: cannot keep the shards' index there ({err.strerror or err}): kept in "
                f"memory for this run only, the next run reads every shard again (set "
                f"LATECAST_CACHE to a folder you may write)",
                stacklevel=4,
            )
            _unkept.add(where)
    _kept[where] = index


def _location(path: str) -> str:
    return path if "://" in path else os.path.realpath(path)


def find_index(urls: list[str], spec: str) -> tuple[str, bool]:
    """``(path, exists)`` of the index of ``urls``: ``index.json`` beside them if there, or if
    that folder is local and writable; else a cache file named by the shards' locations (full
    URLs, absolute paths) and sizes."""
    beside = index_path(urls, spec)
    fs, where = filesystem(beside)
    if fs.exists(where):
        return beside, True
    if "://" not in beside and os.access(posixpath.dirname(beside) or ".", os.W_OK):
        return beside, False
    sizes = [shard_size(url) for url in urls]
    # named by where the shards are, not by how they were typed: `shard-*.tar` in two folders
    # is two sets of shards, each with its own index
    where = [_location(url) for url in urls]
    key = hashlib.sha256(json.dumps([where, sizes]).encode()).hexdigest()[:32]
    cached = str(cache_dir() / "shard-index" / f"{key}.json")
    return cached, os.path.exists(cached)


def _shard(url: str, e: dict | None, path: str, spec: str) -> Shard:
    redo = _redo(spec, path)
    if e is None:
        again = f"run latecast index '{spec}' again" if redo.endswith(" again") else redo
        raise ConfigError(f"{path} has no entry for {url}: {again}")
    try:
        n = e["nsamples"]
        shard = Shard(
            url, int(e["filesize"]), str(e["sha256"]), int(e["channels"]),
            list(map(str, e["keys"])), np.array(e["offsets"], np.int64),
            np.array(e["labels"], np.int64), np.array(e["crc32"], np.int64), bool(e["gzip"]),
            redo,
        )  # fmt: skip
        ok = len(shard.keys) == len(shard.offsets) == len(shard.labels) == len(shard.crc32) == n
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise FormatError(f"{path}: the entry of {url} is damaged ({redo})")
    return shard
