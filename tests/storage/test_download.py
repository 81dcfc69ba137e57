"""Downloads against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import os
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from _helpers import cifar_records

from latecast.errors import DownloadError, FormatError
from latecast.storage import datasets
from latecast.storage.datasets import load_dataset
from latecast.storage.download import download, extract_tar
from latecast.storage.idxfile import write_idx

Route = Callable[[BaseHTTPRequestHandler], None]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def body(data: bytes, content_type: str = "application/octet-stream") -> Route:
    def send(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    return send


def status(code: int) -> Route:
    return lambda h: h.send_error(code)


def dropped(data: bytes) -> Route:
    """Promise the whole file, send half of it, hang up."""

    def send(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data[: len(data) // 2])
        h.wfile.flush()
        h.close_connection = True

    return send


def redirect(location: str) -> Route:
    def send(h: BaseHTTPRequestHandler) -> None:
        h.send_response(302)
        h.send_header("Location", location)
        h.send_header("Content-Length", "0")
        h.end_headers()

    return send


class Server:
    def __init__(self, port: int) -> None:
        self.port = port
        self.routes: dict[str, Route] = {}
        self.hits: list[str] = []

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture
def server():
    """A real ThreadingHTTPServer on 127.0.0.1; unknown paths answer 404."""
    holder: dict[str, Server] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            srv = holder["server"]
            srv.hits.append(self.path)
            srv.routes.get(self.path, status(404))(self)

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    holder["server"] = Server(httpd.server_address[1])
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield holder["server"]
    httpd.shutdown()
    httpd.server_close()


DATA = os.urandom(100_000)


def assert_clean(dest: Path) -> None:
    assert not dest.exists() and not dest.with_name(dest.name + ".part").exists()


def refused(urls: list[str], dest: Path, match: str | None = None, digest: str = sha(DATA)) -> str:
    """``download`` from ``urls`` fails (a ``DownloadError`` matching ``match``, after a
    warning) and leaves no file; its message."""
    with pytest.raises(DownloadError, match=match) as err, pytest.warns(UserWarning):
        download(urls, dest, digest)
    assert_clean(dest)
    return str(err.value)


# --- download() -------------------------------------------------------------------------


def test_download_ok(server, tmp_path):
    server.routes["/a.gz"] = body(DATA)
    dest = tmp_path / "sub" / "a.gz"
    assert download([server.url("/a.gz")], dest, sha(DATA)) == dest
    assert dest.read_bytes() == DATA and os.listdir(dest.parent) == ["a.gz"]


def test_404_then_good_second_mirror(server, tmp_path):
    server.routes["/two/a.gz"] = body(DATA)
    with pytest.warns(UserWarning, match="HTTP 404"):
        download([server.url("/one/a.gz"), server.url("/two/a.gz")], tmp_path / "a.gz", sha(DATA))
    assert (tmp_path / "a.gz").read_bytes() == DATA and server.hits == ["/one/a.gz", "/two/a.gz"]


@pytest.mark.parametrize(
    "page", [body(b"<!DOCTYPE html><html>sign in</html>", "text/html"),
             body(b"\n<html><body>quota exceeded</body></html>")],
)  # fmt: skip
def test_html_page_then_good_mirror(server, tmp_path, page):
    server.routes["/html"], server.routes["/good"] = page, body(DATA)
    with pytest.warns(UserWarning, match="HTML page"):
        download([server.url("/html"), server.url("/good")], tmp_path / "a", sha(DATA))
    assert (tmp_path / "a").read_bytes() == DATA


def test_wrong_hash_names_url_and_both_hashes_and_removes_the_file(server, tmp_path):
    server.routes["/a.gz"] = body(DATA)
    message = refused([server.url("/a.gz")], tmp_path / "a.gz", digest="ab" * 32)
    assert server.url("/a.gz") in message and "ab" * 32 in message and sha(DATA) in message


CUT = {
    "dropped": (dropped(DATA), "connection dropped after 50,000 of 100,000 bytes"),
    "truncated": (body(DATA[:-10]), "SHA-256 mismatch"),
}


@pytest.mark.parametrize("cut", CUT)
def test_a_dropped_or_truncated_file_never_leaves_a_file(server, tmp_path, cut):
    server.routes["/a.gz"], said = CUT[cut]
    refused([server.url("/a.gz")], tmp_path / "a.gz", said)


def test_timeout_moves_on_to_the_next_mirror(server, tmp_path):
    done = threading.Event()  # the first mirror answers nothing until the download is over
    server.routes["/slow"], server.routes["/good"] = lambda h: done.wait(120), body(DATA)
    with pytest.warns(UserWarning, match="timed out after 2 s"):
        download([server.url("/slow"), server.url("/good")], tmp_path / "a", sha(DATA), timeout=2)
    done.set()
    assert (tmp_path / "a").read_bytes() == DATA


def test_stale_part_file_never_counts(server, tmp_path):
    (tmp_path / "a.gz.part").write_bytes(DATA[:500])  # left by a killed earlier run
    server.routes["/a.gz"] = dropped(DATA)
    refused([server.url("/a.gz")], tmp_path / "a.gz")
    server.routes["/a.gz"] = body(DATA)
    download([server.url("/a.gz")], tmp_path / "a.gz", sha(DATA))
    assert (tmp_path / "a.gz").read_bytes() == DATA


def test_all_mirrors_fail_one_error_listing_each(server, tmp_path):
    server.routes["/html"] = body(b"<html></html>", "text/html")
    server.routes["/forbidden"] = status(403)
    server.routes["/wrong"] = body(b"other bytes")
    urls = [server.url(p) for p in ("/html", "/forbidden", "/missing", "/wrong")]
    message = refused(urls, tmp_path / "a.gz")
    assert "\n" not in message
    for url, reason in zip(urls, ["HTML page", "HTTP 403", "HTTP 404", "SHA-256 mismatch"]):
        assert f"{url}: {reason}" in message
    assert "by hand" in message and sha(DATA) in message and str(tmp_path / "a.gz") in message


@pytest.mark.parametrize(
    "url", ["http://example.com/a.gz", "ftp://127.0.0.1/a.gz", "file:///etc/passwd",
            "http://127.0.0.1.example.com/a.gz"],
)  # fmt: skip
def test_plain_http_and_other_schemes_are_refused(tmp_path, url):
    refused([url], tmp_path / "a.gz", "only https://")


def test_redirect_to_plain_http_is_refused(server, tmp_path):
    server.routes["/a.gz"] = redirect("http://example.com/a.gz")
    refused([server.url("/a.gz")], tmp_path / "a.gz", "refused http://example.com/a.gz")


def test_redirect_to_loopback_is_followed(server, tmp_path):
    server.routes["/old"], server.routes["/new"] = redirect(server.url("/new")), body(DATA)
    download([server.url("/old")], tmp_path / "a", sha(DATA))
    assert (tmp_path / "a").read_bytes() == DATA


def test_builtin_mirrors_are_https_and_pinned():
    for name, spec in datasets.DATASETS.items():
        assert all(m.startswith("https://") for m in spec.mirrors), name
        assert all(len(h) == 64 and int(h, 16) >= 0 for h in spec.sha256.values()), name
        assert spec.bundled or spec.mirrors and spec.sha256, name


# --- load_dataset downloads -------------------------------------------------------------


def idx_gz(array: np.ndarray, tmp: Path) -> bytes:
    path = tmp / "f.gz"
    write_idx(path, array, compress=True)
    return path.read_bytes()


@pytest.fixture
def fashion_files(tmp_path, monkeypatch) -> dict[str, bytes]:
    """Generated Fashion-MNIST-format files, their hashes pinned in place of the real ones."""
    rng = np.random.default_rng(0)
    files = {}
    for prefix, n in (("train", 10), ("t10k", 4)):
        images, labels = (
            rng.integers(0, 256, (n, 28, 28), np.uint8),
            np.arange(n, dtype=np.uint8) % 10,
        )
        files[f"{prefix}-images-idx3-ubyte.gz"] = idx_gz(images, tmp_path)
        files[f"{prefix}-labels-idx1-ubyte.gz"] = idx_gz(labels, tmp_path)
    for name in ("fashion-mnist", "kmnist"):
        pin(monkeypatch, name, files)
    return files


def pin(monkeypatch, name: str, files: dict[str, bytes]) -> None:
    """Dataset ``name``'s hashes pinned to those of ``files``' bytes."""
    sums = {k: sha(v) for k, v in files.items()}
    monkeypatch.setitem(
        datasets.DATASETS, name, dataclasses.replace(datasets.DATASETS[name], sha256=sums)
    )


def test_load_dataset_downloads_from_the_first_good_mirror(server, fashion_files, fresh_cache):
    for fname, data in fashion_files.items():
        server.routes[f"/good/{fname}"] = body(data)
        server.routes[f"/bad/{fname}"] = body(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.warns(UserWarning, match="SHA-256 mismatch"):
        mirrors = [server.url("/bad"), server.url("/good/")]
        test = load_dataset("fashion-mnist", "test", mirrors=mirrors)
    assert test.images.shape == (4, 28, 28, 1) and test.labels.tolist() == [0, 1, 2, 3]
    assert test.classes[0] == "T-shirt/top"
    downloaded = sorted(p.name for p in (fresh_cache / "downloads" / "fashion-mnist").iterdir())
    assert downloaded == sorted(fashion_files)  # test split, then train for the mean/std
    hits = len(server.hits)
    assert len(load_dataset("fashion-mnist", "train", mirrors=[server.url("/good")])) == 10
    assert len(server.hits) == hits  # already there: nothing downloaded again


def test_latecast_mirrors_env(server, fashion_files, fresh_cache, monkeypatch):
    for fname, data in fashion_files.items():
        server.routes[f"/m/{fname}"] = body(data)
    monkeypatch.setenv("LATECAST_MIRRORS", f"{server.url('/nothing')}, {server.url('/m')}")
    with pytest.warns(UserWarning, match="HTTP 404"):
        assert len(load_dataset("kmnist", "train")) == 10


def test_all_mirrors_failing_in_load_dataset(server, fashion_files, fresh_cache):
    said = "could not download train-images-idx3-ubyte.gz: .*by hand"
    with pytest.raises(DownloadError, match=said), pytest.warns(UserWarning):
        load_dataset("kmnist", mirrors=[server.url("/a"), server.url("/b")])


def tar_gz(members: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buffer.getvalue()


def cifar10_members() -> tuple[dict[str, bytes], np.ndarray]:
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
    records = cifar_records(images, np.array([3, 9], np.uint8))
    names = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
    members = {f"cifar-10-batches-bin/{n}": records for n in names}
    members["cifar-10-batches-bin/readme.html"] = b"<html>not wanted</html>"
    return members, images


def serve_cifar(server, monkeypatch, archive: bytes) -> None:
    server.routes["/kriz/cifar-10-binary.tar.gz"] = body(archive)
    pin(monkeypatch, "cifar10", {"cifar-10-binary.tar.gz": archive})


def test_cifar_archive_is_downloaded_and_unpacked(server, fresh_cache, monkeypatch):
    members, images = cifar10_members()
    serve_cifar(server, monkeypatch, tar_gz(members))
    ds = load_dataset("cifar10", "test", mirrors=[server.url("/kriz")])
    np.testing.assert_array_equal(ds.images, images)
    assert ds.labels.tolist() == [3, 9] and len(load_dataset("cifar10")) == 10
    home = fresh_cache / "downloads" / "cifar10"
    assert sorted(os.listdir(home)) == ["cifar-10-batches-bin"]  # archive removed after unpacking
    assert "readme.html" not in os.listdir(home / "cifar-10-batches-bin")  # only expected names


@pytest.mark.parametrize(
    "evil", [{"../x": b"escaped"}, {"/tmp/latecast-abs-x": b"escaped"},
             {"cifar-10-batches-bin/../../x": b"escaped"}, "symlink"],
)  # fmt: skip
def test_unsafe_archive_member_rejects_everything(server, fresh_cache, monkeypatch, tmp_path, evil):
    members, _ = cifar10_members()
    if evil == "symlink":
        archive = tar_gz(members, {"cifar-10-batches-bin/link": "/etc/passwd"})
    else:
        archive = tar_gz({**members, **evil})
    serve_cifar(server, monkeypatch, archive)
    with pytest.raises(FormatError, match="refusing the archive, member .* nothing was extracted"):
        load_dataset("cifar10", "test", mirrors=[server.url("/kriz")])
    home = fresh_cache / "downloads" / "cifar10"
    assert os.listdir(home) == []  # no member written, archive removed
    assert not (fresh_cache / "downloads" / "x").exists()
    assert not Path("/tmp/latecast-abs-x").exists()


def test_extract_tar_reads_only_wanted_members(tmp_path):
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(tar_gz({"d/keep.bin": b"1", "./d/also.bin": b"2", "d/skip.bin": b"3"}))
    written = extract_tar(archive, tmp_path / "out", {"d/keep.bin", "d/also.bin"})
    assert sorted(p.name for p in written) == ["also.bin", "keep.bin"]
    assert sorted(os.listdir(tmp_path / "out" / "d")) == ["also.bin", "keep.bin"]


def test_corrupt_archive_is_a_format_error(tmp_path):
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(gzip.compress(b"not a tar file at all" * 30))
    with pytest.raises(FormatError, match="corrupt archive"):
        extract_tar(archive, tmp_path / "out", {"x"})
