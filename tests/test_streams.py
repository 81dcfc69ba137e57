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
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
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
    out = run(ROOT / "examples" / "hf_datasets.py", "--parquet", "photos.parquet", cwd=tmp_path)
    jpeg_bytes = sum(len(r["bytes"]) for r in rows)
    assert "40 photos in 1 epochs of 40" in out and f"host->device {jpeg_bytes} JPEG" in out
