"""`latecast profile` on CPU with tiny settings: every row, finite numbers, all files written."""

import json
import math

import pytest
import torch
from _helpers import PNG, assert_report, one_line_error

from latecast.tools.measure import write_report
from latecast.tools.profiling import (
    ROWS,
    ProfileConfig,
    panels,
    profile,
    report_markdown,
    trace_totals,
)

BATCH = 16


@pytest.fixture(scope="module")
def run(tmp_path_factory, run_cli):
    out = tmp_path_factory.mktemp("profile")
    argv = "--device cpu --steps 2 --warmup 1 --json".split()
    rc, result = run_cli("profile", *argv, "-b", BATCH, "--output-dir", out)
    assert rc == 0
    return out, result


def test_every_row_is_measured(run):
    out, result = run
    assert list(result["rows"]) == [r for r in ROWS if r != "jpeg"]  # jpeg: encoded stores
    assert result == json.loads((out / "report.json").read_text())
    for name, row in result["rows"].items():
        for field in ("step_ms", "kernel_ms", "data_wait_ms", "data_cpu_ms", "data_wait_pct"):
            assert math.isfinite(row[field]) and row[field] > 0, (name, field, row[field])
        assert row["memcpy"] is None  # no device: the profiler has no copy rows
        ranges = {
            e.get("name") for e in json.loads((out / row["trace"]).read_text())["traceEvents"]
        }
        assert {"data", "step"} <= ranges, name
        # the copy of each step; resident copies its epoch order once, before the recorded steps
        assert ("h2d" in ranges) == (name != "resident"), name
        assert ("normalize" in ranges) == (name == "baseline-u8"), name


def test_bytes_per_step_follow_the_strategy(run):
    rows = run[1]["rows"]
    pixels = 28 * 28
    assert rows["float32"]["h2d_bytes_per_step"] == BATCH * (pixels * 4 + 8)
    assert rows["baseline"]["h2d_bytes_per_step"] == BATCH * (pixels * 4 + 8)
    for name in ("uint8", "prefetch", "baseline-u8"):
        assert rows[name]["h2d_bytes_per_step"] == BATCH * (pixels + 1), name
    assert rows["resident"]["h2d_bytes_per_step"] == 0  # after its one upload


def test_report_and_plot(run):
    out, _ = run
    rows = {name: name != "jpeg" for name in ROWS}  # jpeg: encoded stores only
    assert "n/a (no device)" in assert_report(out / "report.md", out / "profile.png", rows)


def test_gpu_trace_and_report_paths(tmp_path):
    """What a CUDA run's trace holds (kernels, HtoD copies with bytes), parsed on any machine."""
    events = [
        {"ph": "X", "cat": "kernel", "name": "k", "dur": 30.0},
        {
            "ph": "X",
            "cat": "gpu_memcpy",
            "name": "Memcpy HtoD (Pinned -> Device)",
            "dur": 5.0,
            "args": {"bytes": 1000},
        },
        {
            "ph": "X",
            "cat": "gpu_memcpy",
            "name": "Memcpy HtoD (Pinned -> Device)",
            "dur": 7.0,
            "args": {"bytes": 3000},
        },
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "dur": 9.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 50.0},
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    kernel_us, memcpy = trace_totals(path)
    assert kernel_us == 30.0
    assert memcpy == {"Memcpy HtoD (Pinned -> Device)": {"us": 12.0, "count": 2, "bytes": 4000}}
    timing = dict(step_ms=2.0, kernel_ms=1.0, data_wait_ms=0.01, data_cpu_ms=0.01)
    copies = dict(h2d_bytes_per_step=4000.0, memcpy_ms=0.012, memcpy_count=2.0)
    htod = {"Memcpy HtoD (Pinned -> Device)": {"ms": 0.012, "count": 2.0, "bytes": 4000.0}}
    row = {**timing, **copies, "data_wait_pct": 0.5, "profiler_bytes_per_step": 4000.0}
    row["memcpy"] = htod
    where = dict(device="cuda:0", gpu="Test GPU", cpu="x", torch="t", git="g", date="d")
    config = {"steps": 1, "warmup": 0, "batch_size": 4}
    result = {**where, "dataset": "mnist", "config": config, "rows": {"uint8": row}}
    files = [tmp_path / "r.json", tmp_path / "r.md", tmp_path / "p.png"]
    write_report(result, "profile", report_markdown(result), panels(result), files)
    md = files[1].read_text()
    assert "0.012 ms (2.0x)" in md and "device kernels" in md and "(Test GPU)" in md
    assert json.loads(files[0].read_text()) == result
    assert files[2].read_bytes().startswith(PNG)


def test_unknown_row_is_a_one_line_error(run_cli):
    r = run_cli("profile", "--transfer", "uint8,nope", "--device", "cpu")
    one_line_error(r, "nope")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_copies_match_the_loader_accounting(tmp_path):
    """The profiler's Memcpy HtoD bytes equal what the loaders count; uint8 packs images
    and labels into one pinned copy; resident copies nothing per step."""
    rows, out = "float32,uint8,resident,baseline", str(tmp_path)
    r = profile(ProfileConfig(steps=3, warmup=1, batch_size=64, device="cuda", transfer=rows,
                              output_dir=out))  # fmt: skip
    rows = r["rows"]
    assert all("Pageable" in k for k in rows["float32"]["memcpy"]), rows["float32"]["memcpy"]
    assert all("Pinned" in k for k in rows["uint8"]["memcpy"]), rows["uint8"]["memcpy"]
    assert rows["uint8"]["memcpy_count"] == 1
    for name in ("float32", "uint8", "baseline"):
        assert rows[name]["profiler_bytes_per_step"] == rows[name]["h2d_bytes_per_step"], name
    assert rows["resident"]["profiler_bytes_per_step"] == 0, rows["resident"]["memcpy"]
    assert rows["uint8"]["memcpy_ms"] > 0 and rows["resident"]["kernel_ms"] > 0


def store16(root, n: int = 40):
    """A 16-bit store (uint16 images past 255, mean/std in stored units) at ``root``."""
    import numpy as np

    from latecast.data import from_arrays
    from latecast.storage.store import write_store

    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        images = rng.integers(0, 65536, (n, 12, 10, 1), dtype=np.uint16)
        write_store(from_arrays(images, np.arange(n) % 2, split=split, name="d16"), root / split)
    return root


def test_a_16_bit_store_is_profiled_its_baselines_as_the_float32_pipeline(tmp_path, run_cli):
    from latecast.storage.store import open_store
    from latecast.tools.profiling import _usual

    store = store16(tmp_path / "d16")
    argv = ["--device", "cpu", "--steps", "2", "--warmup", "1", "-b", "8", "--json"]
    r = run_cli("profile", store, *argv, "--output-dir", tmp_path / "out")
    assert r.rc == 0, r.err
    rows = r.json["rows"]
    assert list(rows) == [row for row in ROWS if row != "jpeg"]
    assert all(math.isfinite(row["loss"]) and row["step_ms"] > 0 for row in rows.values())
    for name in ("float32", "baseline"):
        assert rows[name]["h2d_bytes_per_step"] == 8 * (12 * 10 * 4 + 8), name
    for name in ("uint8", "prefetch", "baseline-u8"):  # 2 bytes a pixel, as stored
        assert rows[name]["h2d_bytes_per_step"] == 8 * (12 * 10 * 2 + 1), name
    ds = open_store(store)
    x = torch.from_numpy(ds.images.astype("float32")).permute(0, 3, 1, 2)
    usual = (x - torch.tensor(ds.mean)[:, None, None]) / torch.tensor(ds.std)[:, None, None]
    cfg = ProfileConfig(batch_size=len(ds), workers=0)
    for uint8 in (False, True):  # one shuffled batch of every image: the same values
        got = next(_usual(ds, torch.device("cpu"), cfg, uint8=uint8))[0]
        assert got.dtype == torch.float32 and got.shape == usual.shape
        torch.testing.assert_close(got.flatten().sort()[0], usual.flatten().sort()[0])
