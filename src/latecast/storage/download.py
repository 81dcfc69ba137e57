"""Downloads checked against a pinned SHA-256, https only, and tar extraction that refuses
an archive with any unsafe member before writing anything.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import tarfile
import urllib.error
import urllib.parse
import urllib.request
import warnings
import zlib
from pathlib import Path, PurePosixPath
from typing import Sequence

from ..errors import DownloadError, FormatError
from .fileio import atomic_write

_CHUNK = 1 << 20


def download(
    urls: Sequence[str], dest: str | os.PathLike, sha256: str, *, timeout: float = 60.0
) -> Path:
    """``dest``, downloaded from the first of ``urls`` that serves it with the SHA-256
    ``sha256``: streamed into ``<dest>.part``, renamed once the hash matches; a failing
    mirror is said and the next tried. https:// only (http:// to 127.0.0.1/localhost, never
    through a redirect); ``timeout``: seconds to connect and per read. ``DownloadError``
    listing every mirror's failure when all fail."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    failures = []
    for url in urls:
        try:
            actual = _fetch_url(url, part, timeout)
            if actual != sha256.lower():
                raise DownloadError(
                    f"SHA-256 mismatch: expected {sha256}, got {actual}; file removed"
                )
            os.replace(part, dest)
            return dest
        except (DownloadError, OSError, ValueError, http.client.HTTPException) as e:
            failures.append(f"{url}: {_reason(e, timeout)}")
            warnings.warn(f"download failed, {failures[-1]}", stacklevel=2)
        finally:
            part.unlink(missing_ok=True)
    raise DownloadError(
        f"could not download {dest.name}: {'; '.join(failures) or 'no mirrors given'}. "
        f"To place it by hand: fetch it from any of those URLs, check that its "
        f"SHA-256 is {sha256}, and save it as {dest}"
    )


def _check_url(url: str) -> bool:
    """True for a loopback test URL; raises for anything but https://."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "https":
        return False
    if parts.scheme == "http" and parts.hostname in ("127.0.0.1", "localhost", "::1"):
        return True
    raise DownloadError(
        f"refused {url}: only https:// is used (http:// only to 127.0.0.1/localhost)"
    )


class _HttpsOnlyRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        _check_url(newurl)  # a redirect must never downgrade to plain http
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(_HttpsOnlyRedirects)
# loopback test servers bypass any configured proxy
_LOCAL_OPENER = urllib.request.build_opener(_HttpsOnlyRedirects, urllib.request.ProxyHandler({}))


def _fetch_url(url: str, part: Path, timeout: float) -> str:
    """Stream ``url`` into ``part``; return its SHA-256. Raises unless the body is complete."""
    opener = _LOCAL_OPENER if _check_url(url) else _OPENER
    request = urllib.request.Request(url, headers={"User-Agent": "latecast"})
    digest, received = hashlib.sha256(), 0
    with opener.open(request, timeout=timeout) as resp, open(part, "wb") as out:
        length = resp.headers.get("Content-Length")
        while chunk := resp.read(_CHUNK):
            if received == 0 and (
                "text/html" in resp.headers.get("Content-Type", "")
                or chunk.lstrip()[:14].lower().startswith((b"<!doctype", b"<html"))
            ):
                raise DownloadError("HTML page, not the file (an error or sign-in page?)")
            digest.update(chunk)
            out.write(chunk)
            received += len(chunk)
    if length is not None and received != int(length):  # http.client does not raise on this
        raise DownloadError(f"connection dropped after {received:,} of {int(length):,} bytes")
    return digest.hexdigest()


def _reason(e: BaseException, timeout: float) -> str:
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code} {e.reason}"
    reason = getattr(e, "reason", e)  # URLError wraps the socket error
    if isinstance(reason, TimeoutError):
        return f"timed out after {timeout:g} s"
    return str(reason) or type(reason).__name__


def extract_tar(
    archive: str | os.PathLike, dest: str | os.PathLike, wanted: set[str]
) -> list[Path]:
    """The ``wanted`` regular files of a tar ``archive`` extracted under ``dest``, each
    atomically, once every member is checked: an absolute name, a ``..``, a link or a device
    refuses the whole archive (``FormatError``) before anything is written."""
    archive, dest = Path(archive), Path(dest)
    written = []
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            for m in members:
                if why := _unsafe(m):
                    raise FormatError(
                        f"{archive}: refusing the archive, member {m.name!r} is "
                        f"{why}; nothing was extracted"
                    )
            for m in members:
                name = str(PurePosixPath(m.name))
                if m.isfile() and name in wanted:
                    with tar.extractfile(m) as src, atomic_write(dest / name) as out:
                        shutil.copyfileobj(src, out, _CHUNK)
                    written.append(dest / name)
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        raise FormatError(f"{archive}: corrupt archive ({e})") from e
    return written


def _unsafe(member: tarfile.TarInfo) -> str:
    path = PurePosixPath(member.name)
    if path.is_absolute() or member.name.startswith("\\"):
        return "an absolute path"
    if ".." in path.parts:
        return "outside the archive ('..')"
    if member.issym() or member.islnk():
        return "a link"
    if not (member.isfile() or member.isdir()):
        return "not a regular file"
    return ""
