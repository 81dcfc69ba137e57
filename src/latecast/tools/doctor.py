"""``latecast doctor``: run anyone's training script, unmodified, and say what crosses the
host->device bus wider than it needs to, and the change that narrows it (docs/doctor.md).
``launch.py`` runs it, ``observe.py`` records each move per line, ``advice.py`` writes the
edits; here the verdict per site (8-bit pixels ``(k/255 - mean)/std``: uint8, images or
video clips; PCM-16 audio ``k/32768``: int16; 16-bit images windowed or normalized: int16
or uint16; integers: the narrowest dtype holding them) and the report. Without a GPU
``.to(device)`` counts as a move."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from ..errors import ConfigError, LatecastError
from ..fields import NARROW, fits
from ..storage.fileio import atomic_write
from ..storage.options import option, validate
from ..trainer.rundir import check_path
from .advice import Advice, Edit
from .launch import PROFILED, WARMUP, run_script, target
from .observe import Observer, Site, short_path
from .text import human_bytes, markdown_table


@dataclass(frozen=True)
class DoctorConfig:
    module: str | None = option(None, "run a module, as python -m MODULE", short="-m")
    steps: int = option(50, "stop the script after this many optimizer steps", low=1)
    eval_steps: int = option(
        0, "after --steps, end the training pass; watch N batches of the evaluation after", low=0
    )
    output_dir: str | None = option(None, "also write doctor.md there")
    profile: bool = option(False, "CUDA: torch.profiler over a few steps, Memcpy HtoD vs kernels")

    def __post_init__(self) -> None:
        validate(self)


class ScriptError(LatecastError):
    """The script raised or exited non-zero: its error, doctor's ``result`` so far (``--json``
    prints it) and the script's own exit code."""

    def __init__(self, message: str, result: dict) -> None:
        super().__init__(message)
        self.result, self.exit_code = result, result["exit_status"]


def grid(u: np.ndarray, eps: float) -> tuple[float, float] | None:
    """``(mean, std)`` when every value of ``u`` is ``(k/255 - mean)/std`` for integers k in
    0..255 within the rounding of a float with machine epsilon ``eps``, else None; the darkest
    value is k = 0 unless another k gives a mean of 4 decimals."""
    fit = levels(u, eps, 255)
    if fit is None:
        return None
    step, darkest, span = fit
    std = 1 / (255 * step)
    means = [k0 / 255 - darkest * std for k0 in range(256 - span)]
    nice = [m for m in means if abs(m - round(m, 4)) < 1e-6]
    return (means[0] if not nice or means[0] in nice else nice[0]), std


def levels(u: np.ndarray, eps: float, most: int) -> tuple[float, float, int] | None:
    """``(step, darkest, span)`` when every value of ``u`` is ``darkest + k * step`` for
    integers k in 0..span, span <= ``most``, within the rounding of a float with machine
    epsilon ``eps``, else None. The step is the smallest sharp gap, refitted by least squares
    over a window of levels widening 4x a pass."""
    found = np.unique(u)
    gaps = np.diff(found)
    sharp = gaps > 100 * eps * np.maximum(np.abs(found[:-1]), np.abs(found[1:]))
    if len(found) < 3 or not sharp.any():
        return None
    i = np.flatnonzero(sharp)[np.argmin(gaps[sharp])]
    step, origin, width = gaps[i], found[i], 8
    while True:
        near = np.abs(found - origin) <= width * step
        k = np.rint((found[near] - origin) / step)
        step, origin = np.polyfit(k, found[near], 1)  # level = step * k + origin
        if near.all():
            break
        width *= 4
    off = found - origin - k * step
    if k[-1] - k[0] > most or np.abs(off).max() > 0.1 * step + eps * np.abs(found).max():
        return None
    return step, origin + k[0] * step, int(k[-1] - k[0])


def verdict(s: Site, stored: tuple | bool = False) -> dict:
    """What a site moves now, what it could move, and the change; ``stored``: its DataLoader
    read 16-bit values (``LoaderSeen.stored``), so a grid of 256 levels or fewer (a narrow
    window) is 16-bit values windowed, not 8-bit pixels."""
    u = np.concatenate(s.samples, axis=1) if s.samples else np.zeros((1, 0))
    now, then, stats, lo, hi = s.dtype, s.dtype, None, None, None
    finite = bool(np.isfinite(u).all())
    sixteen = bool(stored) and s.axis is not None and len(s.shape) == 4
    if s.latecast:
        kind = "latecast"
    elif now.itemsize == 1 or u.size == 0:
        kind = "narrow"
    elif finite and (u == np.rint(u)).all():
        lo, hi = int(u.min()), int(u.max())
        kind, then = "integers", next(d for d in NARROW if fits(d, lo, hi))
    elif finite and pcm16(s, u):
        kind, then = "audio", torch.int16
    else:
        eps = torch.finfo(now).eps
        found = [grid(c, eps) for c in u] if finite and not sixteen else [None]
        kind = ("video clips" if len(s.shape) == 5 else "8-bit image") if all(found) else "float"
        if all(found):
            then, stats = torch.uint8, [list(x) for x in zip(*found)]
        elif finite and s.axis is not None and len(s.shape) == 4:  # scaled from 16 bits?
            found = [levels(c, eps, 65535) for c in u]
            if all(found) and (sixteen or max(f[2] for f in found) > 255):
                kind, stats = "16-bit image", [list(x) for x in zip(*found)]
                then = torch.int16 if max(f[2] for f in found) <= 32767 else torch.uint16
    return {
        "kind": kind,
        "could_cross": _name(then),
        "factor": now.itemsize / then.itemsize,
        "range": None if lo is None else [lo, hi],
        "mean": stats and kind != "16-bit image" and stats[0] or None,
        "std": stats and kind != "16-bit image" and stats[1] or None,
        "change": _change(s, kind, then, stats, lo, hi, stored),
    }


def pcm16(s: Site, u: np.ndarray) -> bool:
    """Audio: ``(N, L)`` or ``(N, C, L)``, L long, every value k/32768 in [-1, 1) (PCM-16 as
    ``torchaudio.load`` and ``soundfile.read`` scale it), not all silence."""
    if len(s.shape) not in (2, 3) or s.shape[-1] < 1000 or not u.size:
        return False
    k = u * 32768
    return bool((k == np.rint(k)).all() and k.min() >= -32768 and k.max() <= 32767 and k.any())


LAYOUT = {1: "NCTHW", 2: "NTCHW", 4: "NTHWC"}  # a clip batch's layout by its channel axis


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _change(s: Site, kind: str, then: torch.dtype, stats, lo, hi, stored=False) -> str:
    now, factor = _name(s.dtype), s.dtype.itemsize // then.itemsize
    if kind in ("8-bit image", "video clips"):
        m, sd = (tuple(round(float(x), 4) for x in v) for v in stats)
        norm = f"mean={m}, std={sd}" if any(m) or any(x != 1 for x in sd) else ""
    if kind == "8-bit image":
        if s.axis is None:  # not an image batch latecast.wrap would recognise
            return f"move it as uint8 and normalize on the device ({norm or 'k/255'}), {factor}x"
        given = f" + `Normalize({norm})`" if norm else ""
        wrap = f"latecast.wrap(loader{', ' + norm if norm else ''})"
        return (
            f"8-bit pixels{' normalized with ' + norm if norm else ''}: they could cross as "
            f"uint8, normalized on the device, {factor}x fewer bytes: make the dataset yield "
            f"uint8 (`PILToTensor()` for `ToTensor()`{given}) and pass every DataLoader that "
            f"uses it through `{wrap}`"
        )
    if kind == "audio":
        return (
            f"PCM-16 samples scaled to [-1, 1) (k/32768): they could cross as int16, scaled on "
            f"the device, {factor}x fewer bytes: make the dataset read them as stored "
            f'(`soundfile.read(path, dtype="int16")`, or `wave`\'s '
            f"`np.frombuffer(w.readframes(n), np.int16)`) and pass its DataLoader through "
            f"`latecast.wrap(loader, fields={{0: latecast.waveform({s.shape[-1]})}})` "
            f"(0: the waveforms' place in the batch)"
        )
    if kind == "video clips":
        layout = LAYOUT.get(s.axis, "auto")
        frames = s.shape[2] if layout == "NCTHW" else s.shape[1]
        out = ', out="NTCHW"' if layout == "NTCHW" else ""
        return (
            f"8-bit video frames{' normalized with ' + norm if norm else ''}: they could cross "
            f"as uint8, normalized on the device, {factor}x fewer bytes: make the dataset yield "
            f"the decoded uint8 frames, unscaled, and pass its DataLoader through "
            f"`latecast.wrap(loader, {norm + ', ' if norm else ''}fields={{0: latecast.clip("
            f'{frames}, "{layout}"{out})}})` (0: the clips\' place in the batch)'
        )
    if kind == "16-bit image":
        step, darkest, span = (stats[0][0], stats[1][0], stats[2][0])
        if isinstance(stored, tuple):  # MONAI's ScaleIntensityRange(d): its window and key
            (low, high), key = stored
            return (
                f"16-bit values windowed on the host by MONAI's ScaleIntensityRange(d) "
                f"(a_min={low:g}, a_max={high:g}): they could cross as the {_name(then)} "
                f"stored, windowed on the device, {factor}x fewer bytes: drop it (and load "
                f"as stored, `LoadImaged(..., dtype=None)`), pass the DataLoader through "
                f"`latecast.wrap(loader, fields={{{key!r}: latecast.image16(window=({low:g}, "
                f"{high:g}))}})` and write the thresholds of the transforms after it in stored "
                f"units (`CropForegroundd`'s `select_fn=lambda x: x > {low:g}`, "
                f"`image_threshold={low:g}`: docs/dataloader.md)"
            )
        if abs(darkest) < 1e-6 and abs(darkest + span * step - 1) < 1e-6:
            spec = f"window=(LOW, LOW + {span})"  # clamped to a window, mapped to [0, 1]
        else:
            spec = f"mean=MEAN, std={tuple(round(1 / float(x), 4) for x in stats[0])}"
        return (
            f"16-bit values, windowed or normalized on the host ({span + 1} levels a channel): "
            f"they could cross as the {_name(then)} stored, windowed on the device, {factor}x "
            f"fewer bytes: make the dataset yield them as stored and pass its DataLoader "
            f"through `latecast.wrap(loader, fields={{0: latecast.image16({spec})}})` (in "
            f"stored units; LOW and MEAN are yours: the values alone do not tell the offset)"
        )
    if kind == "integers" and factor > 1:
        if s.dtype.is_floating_point and len(s.shape) == 4 and then.itemsize == 2:
            return (  # TorchGeo's tiles: read as stored, cast to float32 by the dataset
                f"{now} holding only integers {lo}..{hi}, 4-dim (images, bands): "
                f"16-bit values as stored: they could cross as {_name(then)}, {factor}x: make "
                f"the dataset yield them as stored (TorchGeo's: a `transforms=` that casts "
                f'`sample["image"]` back to torch.{_name(then)}) and declare them in '
                f"`latecast.wrap(loader, fields={{KEY: latecast.image16(mean=0, std=1, "
                f"channels={s.shape[s.axis or 1]})}})` "
                f"(float on the device, the values as they are now; or your per-band mean/std "
                f"there, in stored units, and your own normalize dropped: docs/dataloader.md)"
            )
        if s.dtype.is_floating_point:
            return f"{now} holding only integers {lo}..{hi}: move them as {_name(then)}, {factor}x"
        if s.loaders:
            return (
                f"{now} in {lo}..{hi}: they cross as {_name(then)} through `latecast.wrap`, "
                f"{now} again on the device, {factor}x"
            )
        widen = ".long()" if s.dtype == torch.int64 else f".to(torch.{now})"
        return (  # made per call: wrap's read-ahead would move the script's random draws
            f"{now} in {lo}..{hi}, made per call: move them as {_name(then)} and widen them on "
            f"the device, {factor}x: in plain PyTorch make them {_name(then)} on the host and "
            f"move them with `x.to(device, non_blocking=True){widen}`; the latecast way, "
            f"through a `latecast.Mover`, which does both"
        )
    if kind == "latecast":
        return f"{now} bytes of latecast's own copy: nothing to change"
    why = {"narrow": "already narrow", "float": "not on an 8-bit grid"}
    return f"{now} {why.get(kind, f'in {lo}..{hi}: no narrower dtype holds them')}: nothing to gain"


def diagnose(script: str, obs: Observer, outcome: dict) -> dict:
    """The result: the sites of the training steps (per step) and of evaluation (per batch)
    with verdicts and totals, the moves before the first step, the script's DataLoaders."""
    steps, sites, evaluation, setup, advised = obs.steps, [], [], [], []
    for s in obs.sites.values():
        row = {"site": s.where, "dtype": _name(s.dtype), "shape": list(s.shape)}
        row.update(latecast=s.latecast, loaders=sorted(s.loaders))
        row.update(pinned=s.pinned, devices=sorted(s.targets), calls=s.calls)
        # before the first step: a model's one-time move (no step at all: no per-step rows)
        if (steps >= 2 or steps == 0) and s.last_step == 0 and not s.evaluation:
            setup += [] if s.latecast else [{**row, "bytes": s.nbytes}]  # not its constants
            continue
        stored = [obs.loaders[i].stored for i in sorted(s.loaders) if obs.loaders[i].stored]
        row.update(verdict(s, stored[0] if stored else False))
        advised += [(s, row)] if row["factor"] > 1 and not s.latecast else []
        if s.evaluation:
            per, unit, into = s.calls, "batch", evaluation
        else:  # per optimizer step; one after --steps trains on a batch too
            per, unit, into = max(steps + obs.late_steps, 1), "step", sites
            row["calls_per_step"] = s.calls / per
        row[f"bytes_per_{unit}"] = s.nbytes / per
        row[f"bytes_per_{unit}_then"] = s.nbytes / per / row["factor"]
        into.append(row)
    advice = Advice(obs.loaders, lambda p: short_path(p, obs.start), torch.cuda.is_available())
    for s, row in sorted(advised, key=lambda sr: sr[1]["kind"] == "integers"):  # labels last
        advice.site(s, row)
    now = sum(r["bytes_per_step"] for r in sites)
    then = sum(r["bytes_per_step_then"] for r in sites)
    factor = now / then if then else 1.0
    return {
        "script": script,
        "steps": steps,
        **outcome,
        "eval_batches": obs.eval_batches,
        "on_cpu": any("cpu" in r["devices"] for r in sites + evaluation + setup),
        "sites": sites,
        "evaluation": evaluation,
        "setup": setup,
        "total": dict(bytes_per_step=now, bytes_per_step_then=then, factor=factor),
        "edits": [asdict(e) for e in advice.edits()],
        "loaders": [
            {
                "made_at": f"{short_path(x.file, obs.start)}:{x.line}",
                "class": x.cls,
                "dataset": x.dataset,
                "transform": [name for name, _ in x.transform],
                "workers": x.workers,
            }
            for x in obs.loaders
        ],
    }


def _rows(sites: list[dict], per: str) -> list[list[str]]:
    """The table's rows for sites counted ``per`` ``step`` or ``batch``."""
    return [
        [
            s["site"] + (" (latecast)" if s["latecast"] else ""),
            f"{s['calls_per_step']:.3g}" if per == "step" else str(s["calls"]),
            f"{s['dtype']} {tuple(s['shape'])}" + (" pinned" if s["pinned"] else ""),
            s["could_cross"],
            f"{human_bytes(s[f'bytes_per_{per}'])} -> {human_bytes(s[f'bytes_per_{per}_then'])}",
            f"{s['factor']:.1f}x",
        ]
        for s in sites
    ]


def report(r: dict, cfg: DoctorConfig) -> str:
    n, k = cfg.steps, r["eval_batches"]
    ended = {
        "steps": f"stopped at --steps {n}",
        "eval": f"stopped at the end of the evaluation after --steps {n}, "
        f"{k} batch{'es' * (k != 1)} watched",
        "training": f"stopped after --steps {n}: it trained on, no evaluation in between",
        "end": "the script ended",
    }
    how = ended.get(r["ended"], f"the script {r['error'] or 'exited with status 0'}")
    lines = [f"latecast doctor: {r['script']}, {r['steps']} optimizer steps ({how})"]
    if r["on_cpu"]:
        lines.append(
            "no accelerator here: the script's .to(device) targets the CPU and moves nothing;\n"
            "each such call is counted as what would cross the bus on a GPU"
        )
    if not r["sites"] and not r["evaluation"] and not r["setup"]:
        lines.append("no tensor was moved to a device: nothing crosses the bus in what ran")
    if r["sites"]:
        head = "site|per step|crosses now|could cross|bytes/step now -> then|factor".split("|")
        t = r["total"]
        total = f"{human_bytes(t['bytes_per_step'])} -> {human_bytes(t['bytes_per_step_then'])}"
        total_row = ["total", "", "", "", total, f"{t['factor']:.1f}x"]
        lines += ["", markdown_table(head, [*_rows(r["sites"], "step"), total_row], pad=True)]
    if r["evaluation"]:
        head = "site|batches|crosses now|could cross|bytes/batch now -> then|factor".split("|")
        lines += ["", "evaluation (moved with gradients off):"]
        lines.append(markdown_table(head, _rows(r["evaluation"], "batch"), pad=True))
    changes = [s for s in r["sites"] + r["evaluation"] if s["factor"] > 1]
    if r["error"] and not r["steps"]:  # no verdict on a training step that never ran
        lines += ["", f"no optimizer step ran: the script {r['error']} before its first step"]
        lines += ["what it moved until then could cross narrower:"] if changes else []
    elif r["sites"] or r["evaluation"]:
        nothing = "every tensor crosses as narrow as its values allow"
        if all(s["latecast"] for s in r["sites"] + r["evaluation"]):
            nothing = "latecast moves every batch"
        lines += ["", "what to change:" if changes else f"nothing to change: {nothing}"]
    lines += [f"- {s['site']} {s['dtype']} {tuple(s['shape'])}: {s['change']}" for s in changes]
    if r["edits"]:
        lines += ["", "the edits, to apply as written (--json lists them too):"]
        lines += [x for e in r["edits"] for x in Edit(**e).shown()]
    if r["setup"]:
        by_site = {}
        for s in r["setup"]:
            by_site[s["site"]] = by_site.get(s["site"], 0) + s["bytes"]
        once = ", ".join(f"{site} ({human_bytes(b)})" for site, b in by_site.items())
        when = "once before the first step" if r["steps"] else "with no step run"
        lines += ["", f"moved {when}, not counted per step: {once}"]
    if cfg.profile:
        p = r["profile"]
        lines.append(
            f"profile of {p['steps']} steps: Memcpy HtoD {p['memcpy_htod_ms']:.3f} ms a step, "
            f"kernels {p['kernel_ms']:.3f} ms: the copies are {p['memcpy_share']:.0%} of the two"
            if p
            else f"profile: the script stopped before step {WARMUP + PROFILED}, nothing profiled"
        )
    return "\n".join(lines)


def doctor(
    cfg: DoctorConfig, command: list[str], *, show: bool = True, debug: bool = False
) -> dict:
    """Run the script; where ``show`` (rank 0) print the report (and write ``doctor.md``);
    the result. A script that fails is one ``ScriptError`` carrying the result."""
    if cfg.profile and not torch.cuda.is_available():
        raise ConfigError("--profile needs CUDA (it times Memcpy HtoD on the GPU): none here")
    if cfg.profile and cfg.steps < WARMUP + PROFILED:
        raise ConfigError(f"--profile needs --steps >= {WARMUP + PROFILED}, got {cfg.steps}")
    # relative to where doctor started, wherever the script changes directory to
    out = check_path(cfg.output_dir).absolute() if cfg.output_dir else None
    script = target(cfg, command)
    obs = Observer()
    r = diagnose(script.name, obs, run_script(script, obs, cfg, debug))
    if show:
        text = report(r, cfg)
        print(text)
        if out is not None:
            with atomic_write(out / "doctor.md") as f:
                f.write(f"# latecast doctor\n\n{text}\n".encode())
            print(f"wrote {out / 'doctor.md'}")
    if r["error"]:
        raise ScriptError(f"{script.name} {r['error']}", result=r)
    return r
