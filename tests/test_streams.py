"""Photos from real streaming components (issue 16): WebDataset shards read over a real
``http.server`` on 127.0.0.1 by 2 ``torchrun`` ranks, and a Hugging Face ``datasets``
parquet with ``Image(decode=False)``, both through ``latecast.wrap`` as the examples do."""

from __future__ import annotations

import functools
import http.server
import io
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 300  # seconds for one launch; a hang fails instead of blocking CI
pytestmark = pytest.mark.slow  # each test starts Python processes with DataLoader workers


def run(*argv, cwd: Path) -> str:
    env = {**os.environ, "HF_HOME": str(cwd / "hf"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, *map(str, argv)], capture_output=True, text=True, timeout=TIMEOUT,
        cwd=cwd, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture
def served(tmp_path):
    """A real HTTP server on 127.0.0.1 for ``tmp_path / "shards"``: its base URL."""
    folder = tmp_path / "shards"
    folder.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield folder, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_webdataset_shards_over_http_two_ranks_read_disjoint_shards_every_sample_once(served):
    pytest.importorskip("webdataset")
    folder, base = served
    example = ROOT / "examples" / "webdataset_stream.py"
    one = run(
        example,
        "--shards",
        folder,
        "--count",
        4,
        "--per-shard",
        24,
        "--report",
        "one",
        cwd=folder.parent,
    )  # fmt: skip  (writes the shards, serves them itself)
    every = json.loads((folder.parent / "one" / "rank-0.json").read_text())
    assert "rank 0: 96 photos an epoch" in one and len(set(every)) == 96
    url = f"{base}/shard-{{000..003}}.tar"
    out = run("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", example,
              "--url", url, "--report", "two", cwd=folder.parent)  # fmt: skip
    ranks = [json.loads((folder.parent / "two" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    shards = [{k[:3] for k in keys} for keys in ranks]  # a key starts with its shard's number
    assert len(ranks[0]) == len(ranks[1]) == 48 and not shards[0] & shards[1]
    assert sorted(ranks[0] + ranks[1]) == sorted(every)  # together: every sample once
    assert "rank 1: 48 photos an epoch" in out and "JPEG bytes" in out


def test_hugging_face_datasets_parquet_with_undecoded_images(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = []
    for i in range(40):
        buf = io.BytesIO()
        Image.fromarray(np.full((40, 50, 3), 5 * i, np.uint8)).save(buf, "JPEG")
        rows.append({"bytes": buf.getvalue(), "path": f"{i}.jpg"})
    features = datasets.Features(image=datasets.Image(), label=datasets.Value("int64"))
    ds = datasets.Dataset.from_dict({"image": rows, "label": [i % 10 for i in range(40)]},
                                    features=features)  # fmt: skip
    ds.to_parquet(str(tmp_path / "photos.parquet"))
    out = run(ROOT / "examples" / "hf_photos.py", "--parquet", "photos.parquet", cwd=tmp_path)
    jpeg_bytes = sum(len(r["bytes"]) for r in rows)
    assert "40 photos in 1 epochs of 40" in out and f"host->device {jpeg_bytes} JPEG" in out


def write_shard(path: Path, first: int, n: int) -> None:
    """A WebDataset shard (plain tar: KEY.jpg, KEY.cls) of n generated 24x32 photos."""
    import tarfile

    with tarfile.open(path, "w") as tar:
        for i in range(first, first + n):
            img = np.full((24, 32, 3), 40 + 20 * (i % 4), np.uint8)
            img[(i % 4) * 5 : (i % 4) * 5 + 6, 4:20] = 240
            buf = io.BytesIO()
            Image.fromarray(img).save(buf, "JPEG", quality=90)
            for ext, data in (("jpg", buf.getvalue()), ("cls", str(i % 4).encode())):
                info = tarfile.TarInfo(f"{i:06d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_latecast_train_on_shards_over_http_and_a_resume_with_other_shards_is_refused(
    served, run_cli
):
    """``latecast train URL`` reads the shards over HTTP (the last is the test split) and
    decodes the JPEG files on the device; a resume whose shards changed by one byte is one
    line naming the data fingerprint."""
    folder, base = served
    for s in range(3):
        write_shard(folder / f"shard-{s:03d}.tar", 16 * s, 16)
    url, out = f"{base}/shard-{{000..002}}.tar", folder.parent / "run"
    argv = ["train", url, "--model", "cnn", "-b", "8", "--device", "cpu", "--no-progress"]
    rc, summary = run_cli(*argv, "--epochs", "1", "--output-dir", out, "--json")
    assert rc == 0 and summary["transfer"] == "jpeg" and summary["dataset"] == url
    assert summary["decoder"].split()[0] in ("simplejpeg", "torchcodec", "torchvision")
    assert summary["step"] == 4  # 32 train samples (two shards), batches of 8
    import tarfile

    with tarfile.open(folder / "shard-001.tar") as tar:
        last = [m for m in tar.getmembers() if m.name.endswith(".jpg")][-1]
    data = bytearray((folder / "shard-001.tar").read_bytes())
    data[last.offset_data + last.size // 2] ^= 1  # inside the last file's scan data
    (folder / "shard-001.tar").write_bytes(bytes(data))
    proc = run_cli(*argv, "--epochs", "1", "--output-dir", out, "--resume", "auto")
    assert proc.rc == 1 and "data_fingerprint" in proc.err, proc.err[-2000:]


def test_shards_that_cannot_train_are_one_line(tmp_path, run_cli):
    import tarfile

    write_shard(tmp_path / "a-000.tar", 0, 4)
    with tarfile.open(tmp_path / "a-001.tar", "w") as tar:  # a sample without its label
        info = tarfile.TarInfo("000009.jpg")
        tar.addfile(info, io.BytesIO(b""))
    for spec, why in [
        (f"{tmp_path}/a-000.tar", "1 shard(s); give two or more"),
        (f"{tmp_path}/a-*.tar", "sample '000009' has no .jpg and .cls"),
        (f"{tmp_path}/none-*.tar", "0 shard(s)"),
    ]:
        proc = run_cli("train", spec, "--check", "--output-dir", tmp_path / "run")
        assert proc.rc == 1 and why in proc.err and len(proc.err.strip().splitlines()) == 1
