"""``latecast profile``: the same training steps once per data path, under ``torch.profiler``.

Rows: latecast's movers, ``baseline`` (torchvision ``ToTensor()+Normalize``, ``.to(device)``)
and ``baseline-u8`` (uint8 tensors normalized after the copy). Each: a fresh model of
``latecast train``'s recipe, ``1 + warmup`` unrecorded steps, ``steps`` recorded with ranges
``data``, ``h2d``, ``normalize``, ``step``: step time, data wait and CPU from host timers, kernel
and ``Memcpy HtoD`` time and bytes from the Chrome trace. A picture, not the benchmark."""

from __future__ import annotations

import itertools
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import torch
from torch.profiler import ProfilerActivity, record_function

from ..data import Dataset
from ..distributed import resolve_device
from ..errors import ConfigError
from ..kinds.jpeg import JpegStore
from ..loader import Loader
from ..movers import MOVERS
from ..storage.datasets import load_dataset
from ..storage.options import option
from ..trainer.baseline import Float32, transfers
from ..trainer.loop import TrainConfig, recipe, stopwatch, train_step
from . import measure

ROWS = (Float32.name, *MOVERS, JpegStore.name, "baseline", "baseline-u8")
NO_DEVICE = "n/a (no device)"


@dataclass(frozen=True)
class ProfileConfig(measure.MeasureConfig):
    steps: int = option(20, "recorded training steps per row", low=1)
    warmup: int = option(3, "profiler warm-up steps before them (after 1 wait step)", low=0)
    transfer: str = option("all", f"all, or a comma list of {','.join(ROWS)}")
    workers: int = option(0, "baseline DataLoader workers (0: their work is traced)", low=0)
    output_dir: str = option("runs/profile", "reports, plot and Chrome traces go here")

    def __post_init__(self) -> None:
        super().__post_init__()
        self.rows()

    def rows(self) -> list[str]:
        given = [t.strip() for t in self.transfer.split(",") if t.strip()]
        names = list(ROWS) if self.transfer == "all" else given
        bad = [n for n in names if n not in ROWS]
        if bad or not names:
            raise ConfigError(
                f"--transfer {self.transfer!r}: unknown row(s) {bad}; "
                f"valid: all or a comma list of {', '.join(ROWS)}"
            )
        return names


def _latecast(
    ds: Dataset, name: str, device: torch.device, cfg: ProfileConfig, channels_last: bool
) -> Iterator:
    """``(images, labels, bytes copied)`` of a ``Loader`` on mover ``name``: its whole work
    under ``data``, its copy inside as ``h2d`` (the mover's label)."""
    mover = transfers(ds)[name]
    loader = Loader(
        ds,
        cfg.batch_size,
        device=device,
        transfer=mover,
        seed=cfg.seed,
        channels_last=channels_last,
    )
    before = loader.start().stats.h2d_bytes  # resident uploads the dataset here, unrecorded
    for images, labels in _fetched(loader):
        after = loader.stats.h2d_bytes
        yield images, labels, after - before
        before = after


def _usual(ds: Dataset, device: torch.device, cfg: ProfileConfig, uint8: bool) -> Iterator:
    """The usual code: float32 normalized on the CPU per image, then ``.to(device)``; with
    ``uint8``, the same DataLoader over uint8 tensors (a 16-bit store's: uint16, its mean/std
    in stored units), cast and normalized after the copy.
    ``pin_memory=False``, as the code is most often written: pageable copies."""
    if uint8:  # (N, C, H, W) uint8 in memory, as people hold it (`MNIST(...).data.unsqueeze(1)`)
        images = torch.from_numpy(np.array(ds.images)).permute(0, 3, 1, 2).contiguous()
        data = torch.utils.data.TensorDataset(images, torch.from_numpy(np.array(ds.labels)))
        dl = measure.dataloader(data, cfg.batch_size, cfg.workers, cfg.seed, persistent=False)
        scale = 255 if ds.images.dtype == np.uint8 else 1  # uint16: mean/std in stored units
        mean = torch.tensor(ds.mean, device=device).view(1, -1, 1, 1)  # (1, C, 1, 1)
        std = torch.tensor(ds.std, device=device).view(1, -1, 1, 1)
    else:
        dl = measure.torchvision_loader(
            ds, cfg.batch_size, cfg.workers, device, cfg.seed, pin=False
        )
    for x, y in _fetched(dl):
        with record_function("h2d"):
            x_dev, y_dev = x.to(device), y.to(device)
        if uint8:
            with record_function("normalize"):
                x_dev, y_dev = (x_dev.float() / scale - mean) / std, y_dev.long()
        yield x_dev, y_dev, x.nbytes + y.nbytes


def _fetched(batches: Iterable) -> Iterator:
    """Pass after pass over ``batches``, each fetch under ``data``."""
    for it in map(iter, itertools.repeat(batches)):
        while True:
            with record_function("data"):
                batch = next(it, None)
            if batch is None:
                break
            yield batch


def trace_totals(path: Path) -> tuple[float, dict[str, dict]]:
    """(device kernel µs, {"Memcpy HtoD (...)": {us, count, bytes}}) from a Chrome trace."""
    kernel_us, memcpy = 0.0, {}
    for e in json.loads(path.read_text()).get("traceEvents", []):
        cat, name = str(e.get("cat", "")).lower(), str(e.get("name", ""))
        if e.get("ph") != "X":
            continue
        if cat == "kernel":
            kernel_us += e.get("dur", 0)
        elif "memcpy" in cat and name.startswith("Memcpy HtoD"):
            m = memcpy.setdefault(name, {"us": 0.0, "count": 0, "bytes": 0})
            m["us"] += e.get("dur", 0)
            m["count"] += 1
            m["bytes"] += int((e.get("args") or {}).get("bytes", 0))
    return kernel_us, memcpy


def profile_row(
    ds: Dataset, name: str, device: torch.device, cfg: ProfileConfig, out: Path
) -> dict:
    """``1 + warmup + steps`` steps of ``latecast train``'s recipe on row ``name``'s batches."""
    skip = 1 + cfg.warmup
    settings = TrainConfig(
        dataset=cfg.dataset, epochs=1, seed=cfg.seed, batch_size=cfg.batch_size, device=str(device)
    )
    config, model, opt, sched = recipe(settings, ds, device, skip + cfg.steps)
    if name in ("baseline", "baseline-u8"):
        source = _usual(ds, device, cfg, uint8=name == "baseline-u8")
    else:
        source = _latecast(ds, name, device, cfg, config.channels_last)
    trace = out / f"trace-{name}.json"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    wait = cpu = step_phase = nbytes = 0.0
    with torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=1, warmup=cfg.warmup, active=cfg.steps),
        on_trace_ready=lambda p: p.export_chrome_trace(str(trace)),
    ) as prof:
        for i in range(skip + cfg.steps):
            if i == skip:  # the recorded window starts with an idle device
                lap = stopwatch(device)
            t0, c0 = time.perf_counter(), time.process_time()
            x, y, copied = next(source)  # fetch + copy + normalize: the data wait
            t1, c1 = time.perf_counter(), time.process_time()
            with record_function("step"):
                loss = train_step(model, opt, sched, x, y, config)
            if i >= skip:
                wait, cpu, nbytes = wait + t1 - t0, cpu + c1 - c0, nbytes + copied
                step_phase += time.perf_counter() - t1
            if i == skip + cfg.steps - 1:
                elapsed = lap()  # stopped here: the next prof.step() exports the trace
            prof.step()
    source.close()  # stop DataLoader workers, if any
    n = cfg.steps
    kernel_us, memcpy = trace_totals(trace)
    on_device = device.type == "cuda"
    copies = {
        k: {"ms": v["us"] / 1e3 / n, "count": v["count"] / n, "bytes": v["bytes"] / n}
        for k, v in memcpy.items()
    }
    row = {
        "step_ms": 1e3 * elapsed / n,
        "data_wait_ms": 1e3 * wait / n,
        "data_cpu_ms": 1e3 * cpu / n,
        "h2d_bytes_per_step": nbytes / n,
        # On CPU the model's kernels run on the host: the step phase's wall time.
        "kernel_ms": kernel_us / 1e3 / n if on_device else 1e3 * step_phase / n,
        "memcpy": copies if on_device else None,
        "loss": loss.item(),
        "trace": trace.name,
    }
    row["data_wait_pct"] = 100 * row["data_wait_ms"] / row["step_ms"]
    if on_device:
        totals = [sum(v[f] for v in copies.values()) for f in ("ms", "count", "bytes")]
        row["memcpy_ms"], row["memcpy_count"], row["profiler_bytes_per_step"] = totals
    return row


def _memcpy_cell(row: dict, kind: str) -> str:
    if row["memcpy"] is None:
        return NO_DEVICE
    found = [m for name, m in row["memcpy"].items() if kind in name]  # "(Pinned -> Device)"
    if not found:
        return "0"
    return f"{sum(m['ms'] for m in found):.3f} ms ({sum(m['count'] for m in found):.1f}x)"


def report_markdown(r: dict) -> list[str]:
    rows = [
        [
            name,
            f"{v['step_ms']:.2f}",
            f"{v['kernel_ms']:.2f}",
            _memcpy_cell(v, "Pinned"),
            _memcpy_cell(v, "Pageable"),
            f"{v['h2d_bytes_per_step']:,.0f}",
            NO_DEVICE if v["memcpy"] is None else f"{v['profiler_bytes_per_step']:,.0f}",
            f"{v['data_cpu_ms']:.2f}",
            f"{v['data_wait_ms']:.2f} ({v['data_wait_pct']:.1f}%)",
        ]
        for name, v in r["rows"].items()
    ]
    header = f"row|step ms|{_kernels(r)} ms|Memcpy HtoD Pinned|Memcpy HtoD Pageable|bytes h2d "
    header += "(loader)|bytes h2d (profiler)|data CPU ms|data wait ms (% step)"
    c = r["config"]
    return [
        f"{c['steps']} recorded steps per row after {1 + c['warmup']} unrecorded, batch "
        f"{c['batch_size']}. Times per step, under the profiler.",
        measure.markdown_table(header.split("|"), rows),
    ]


def panels(r: dict) -> list[measure.Panel]:
    """Step time per row, and its parts side by side (on a GPU they overlap)."""
    part = {_kernels(r): "kernel_ms", "memcpy HtoD": "memcpy_ms", "data wait": "data_wait_ms"}
    parts = {k: {n: v.get(f, 0.0) for n, v in r["rows"].items()} for k, f in part.items()}
    steps = {"step": {n: v["step_ms"] for n, v in r["rows"].items()}}
    return [("ms per step", steps, False), ("ms per step, by part", parts, False)]


def _kernels(r: dict) -> str:
    return "device kernels" if r["device"].startswith("cuda") else "model step (CPU)"


def profile(cfg: ProfileConfig) -> dict:
    """Profile every row of ``cfg``; write report.md, report.json, profile.png and traces."""
    device = resolve_device(cfg.device)
    ds = load_dataset(cfg.dataset, "train", root=cfg.data_root)
    pixels = isinstance(ds, Dataset)  # the baseline rows read decoded pixels
    names = [n for n in cfg.rows() if n in transfers(ds) or (pixels and n.startswith("baseline"))]
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = {}
    for name in names:
        rows[name] = profile_row(ds, name, device, cfg, out)
        print(f"profiled {name}: {rows[name]['step_ms']:.2f} ms/step", flush=True)
    timed = ("step_ms", "kernel_ms")
    bad = [k for k, v in rows.items() if not all(math.isfinite(v[f]) and v[f] > 0 for f in timed)]
    result = {
        "config": asdict(cfg),
        **measure.run_info(device),
        "dataset": ds.name,
        "steps_per_epoch": math.ceil(len(ds) / cfg.batch_size),
        "rows": rows,
        "not_finite": bad,
    }
    files = [out / "report.json", out / "report.md", out / "profile.png"]
    measure.write_report(result, "profile", report_markdown(result), panels(result), files)
    return result
