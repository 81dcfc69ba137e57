"""``latecast`` command line: argparse -> frozen dataclass configs -> library functions.

Exit codes: 0 success, 2 bad usage (argparse), 1 a ``LatecastError`` or what the system
refused (a full disk, no permission), 130 Ctrl-C; errors are one line on stderr, no
traceback unless ``--debug``. With ``--json`` the last stdout line is one strict JSON object:
the result, or on an error ``{"error": the same message, "exit_code": 1}`` (bad usage: 2);
Ctrl-C (130) prints none."""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import re
import sys
import warnings
from dataclasses import MISSING, fields
from typing import Callable

from .. import __version__
from ..errors import LatecastError
from ..storage.options import DATASET_HELP, TYPES, kind
from .text import human_bytes


def _options(module: str, name: str) -> Callable[[argparse.ArgumentParser], None]:
    """An ``add`` declaring a flag per field of the dataclass ``latecast.module.name``
    (``options.option``), importing it only when called (torch loads with most)."""

    def add(p: argparse.ArgumentParser) -> None:
        cls = getattr(importlib.import_module(f"latecast.{module}"), name)
        for f in fields(cls):
            meta, default = f.metadata, f.default
            hide = default in (None, MISSING) or kind(f) == "bool"
            shown = "" if hide else " (default: %(default)s)"
            if meta["positional"]:
                optional = {} if default is MISSING else {"nargs": "?", "default": default}
                p.add_argument(f.name, **optional, help=meta["help"] + shown)
                continue
            names = [n for n in (meta["short"], "--" + f.name.replace("_", "-")) if n]
            if kind(f) == "bool":
                how = {"action": argparse.BooleanOptionalAction}
            else:
                how = {"type": TYPES[kind(f)], "metavar": meta["metavar"]}
            p.add_argument(*names, default=default, help=meta["help"] + shown, **how)

    return add


def _config(cls, args: argparse.Namespace):
    """Build the dataclass ``cls`` from the parsed flags that share its field names."""
    given = vars(args)
    return cls(**{f.name: given[f.name] for f in fields(cls) if f.name in given})


def _run_train(args: argparse.Namespace) -> dict:
    from ..trainer.loop import TrainConfig, train

    summary = train(_config(TrainConfig, args))
    if summary["rank"] != 0:  # under torchrun only rank 0 reports (and prints the JSON)
        args.json = False
        return summary
    if summary.get("checked"):
        _print_check(summary)
        return summary
    moved, f32 = summary["h2d_bytes"], summary["h2d_bytes_float32"]
    print(
        f"test accuracy {summary['test_accuracy']:.4f} after {summary['epochs']} epochs, "
        f"{summary['train_seconds']:.1f} s of training on {summary['device']} "
        f"({summary['transfer']})"
    )
    up = ", ".join(f"{k} {v:.2f}" for k, v in summary["startup"].items())
    print(
        f"clock {summary['clock_seconds']:.3f} s (first step to final evaluation); "
        f"start-up {summary['startup_seconds']:.2f} s ({up}); off the clock: evaluations "
        f"{summary['eval_seconds']:.2f} s, checkpoints {summary['save_seconds']:.2f} s"
    )
    # float32 is 0 when a resumed run had nothing left to train; more than float32 when the
    # resident upload of the whole dataset outweighs the few samples trained since
    r = moved / max(f32, 1)
    versus = (f" ({1 - r:.0%} less)" if r <= 1 else f" ({r:.1f}x as much)") if f32 else ""
    jpeg = summary["transfer"] == "jpeg"  # compressed bytes: decoded uint8 the other comparison
    uint8 = f", uint8 {human_bytes(summary['h2d_bytes_uint8'])}" if jpeg else ""
    print(
        f"host->device: {human_bytes(moved)} moved; float32 would have moved "
        f"{human_bytes(f32)}{versus}{uint8}"
    )
    return summary


def _print_check(found: dict) -> None:
    c, (h, w, ch) = found["config"], found["image_shape"]
    start = f"replaces {', '.join(found['replaces'])}" if found["replaces"] else "starts a new run"
    if found["resume_from"]:
        start = f"resumes {found['resume_from']} at step {found['start_step']}"
    print(
        f"check passed: {c['model']} on {c['dataset']} ({found['train_samples']} train / "
        f"{found['test_samples']} test images {h}x{w}x{ch}, {found['classes']} classes), "
        f"{c['epochs']} epochs of {found['steps_per_epoch']} steps at batch {c['batch_size']} "
        f"on {found['device']} ({found['transfer']}); in {c['output_dir']} it {start}"
    )


def _add_info(p: argparse.ArgumentParser) -> None:
    p.add_argument("dataset", nargs="?", default="mnist", help=DATASET_HELP)
    p.add_argument("--data-root", default=None, help="folder with the dataset's files")
    verify = "read every image byte: each JPEG file's structure, and the SHA-256 kept when "
    verify += "the store was written (shards: every shard whole against its index)"
    p.add_argument("--verify", action="store_true", help=verify)


def _run_info(args: argparse.Namespace) -> dict:
    from ..storage import stream
    from ..storage.datasets import load_dataset
    from ..storage.store import verify
    from ..trainer.baseline import transfers

    info, verified = {}, {}
    for split in ("train", "test"):
        ds = load_dataset(args.dataset, split, root=args.data_root)
        if args.verify and isinstance(ds, stream.StreamedDataset):  # shards: against their index
            verified[split] = stream.verify(ds)
        elif args.verify:
            verified[split] = verify(ds, f"{args.dataset} ({split} split)")
        info[split] = {
            "samples": len(ds),
            "image_shape": list(ds.image_shape),
            "encoding": getattr(ds, "encoding", "raw"),
            "classes": len(ds.classes),
            "image_bytes": ds.image_bytes,
            "label_bytes": ds.label_bytes,
            "epoch_bytes": {s: m.epoch_bytes(ds) for s, m in transfers(ds).items()},
        }
        if split == "train":
            info["mean"], info["std"] = list(ds.mean), list(ds.std)
    tr = info["train"]
    if tr["encoding"] != "raw":
        from ..kinds.decode import decoder

        info["decoder"] = decoder()
    coded = f"{tr['encoding']} ({human_bytes(tr['image_bytes'])}, decoded by {info.get('decoder')})"
    stored = str(ds.images.dtype) if tr["encoding"] == "raw" else coded  # uint8 or uint16
    print(
        f"{args.dataset}: train {tr['samples']} x {tuple(tr['image_shape'])} {stored}, "
        f"test {info['test']['samples']}, {tr['classes']} classes, "
        f"mean {[round(m, 4) for m in info['mean']]} std {[round(s, 4) for s in info['std']]}"
    )
    print(f"{'strategy':<10} {'host->device per epoch':>24} {'once':>12}")
    for name, b in tr["epoch_bytes"].items():
        print(f"{name:<10} {human_bytes(b['per_epoch']):>24} {human_bytes(b['once']):>12}")
    for split, hashed in verified.items():
        said = ", SHA-256 as written" if hashed else "; no SHA-256 to compare (no store)"
        said = hashed if isinstance(hashed, str) else "every image read" + said
        print(f"verified {split}: {said}")
    return {"dataset": args.dataset, **info, **({"verified": verified} if args.verify else {})}


def _add_index(p: argparse.ArgumentParser) -> None:
    shards = "WebDataset tar shards: path/shard-*.tar, http://.../shard-{000..009}.tar, s3://..."
    output = "default: index.json beside the shards; over HTTP give it, then upload it there"
    p.add_argument("shards", help=shards)
    p.add_argument("--output", default=None, help=f"where to write the index ({output})")


def _run_index(args: argparse.Namespace) -> dict:
    from ..storage.shards import write_index

    path, entries = write_index(args.shards, args.output)
    samples, size = sum(e["nsamples"] for e in entries), sum(e["filesize"] for e in entries)
    empty = [e["url"] for e in entries if not e["nsamples"]]
    print(
        f"{path}: {len(entries)} shards, {samples} samples, {human_bytes(size)} read and hashed"
        + (f"; empty (skipped when training): {', '.join(empty)}" if empty else "")
    )
    return {"index": path, "shards": len(entries), "samples": samples, "bytes": size,
            "empty": empty}  # fmt: skip


def _need_bench_extra(command: str) -> None:
    """profile and bench compare against torchvision and plot with matplotlib."""
    from ..errors import ConfigError

    for module in ("torchvision", "matplotlib", "PIL"):
        try:
            __import__(module)
        except ImportError:
            need = f"latecast {command} needs {module}: pip install 'latecast[bench]'"
            raise ConfigError(need) from None


def _run_profile(args: argparse.Namespace) -> dict:
    from .profiling import ProfileConfig, profile

    _need_bench_extra("profile")
    result = profile(_config(ProfileConfig, args))
    rows = len(result["rows"])
    print(f"wrote report.md, report.json, profile.png and {rows} traces to {args.output_dir}")
    return result


def _run_bench(args: argparse.Namespace) -> dict:
    from .bench import BenchConfig, bench

    _need_bench_extra("bench")
    result = bench(_config(BenchConfig, args))
    print(f"wrote bench.json, bench.md and bench.png to {args.output_dir}")
    return result


def _run_convert(args: argparse.Namespace) -> dict:
    import time

    from ..storage.convert import ConvertConfig, convert
    from ..storage.store import SPLIT_NAMES, open_store

    start = time.perf_counter()
    out, skipped = convert(_config(ConvertConfig, args))
    seconds = time.perf_counter() - start
    names = [s for s in SPLIT_NAMES if (out / s).is_dir()] or [None]
    splits = {s or "train": open_store(out, s) for s in names}
    ds, n = splits["train"], sum(map(len, splits.values()))
    encoding = getattr(ds, "encoding", "raw")
    print(
        f"{out}: {', '.join(f'{s} {len(d)}' for s, d in splits.items())} images "
        f"{ds.image_shape} {encoding} ({human_bytes(ds.image_bytes)} train), "
        f"{ds.num_classes} classes; {seconds:.1f} s, {n / seconds:,.0f} images/s"
        + (f"; skipped {len(skipped)} (listed in {out}/skipped.txt)" if skipped else "")
    )
    return {
        "store": str(out),
        "samples": len(ds),
        "splits": {s: len(d) for s, d in splits.items()},
        "image_shape": list(ds.image_shape),
        "encoding": encoding,
        "image_bytes": ds.image_bytes,
        "classes": list(ds.classes),
        "skipped": skipped,
        "seconds": seconds,
        "images_per_second": n / seconds,
    }


def _add_doctor(p: argparse.ArgumentParser) -> None:
    _options("tools.doctor", "DoctorConfig")(p)
    what = "the training script and its arguments (python train.py ..., python -m pkg.train)"
    p.add_argument("script", nargs=argparse.REMAINDER, metavar="-- SCRIPT [ARGS...]", help=what)


def _run_doctor(args: argparse.Namespace) -> dict:
    from .doctor import DoctorConfig, doctor

    rank0 = os.environ.get("RANK", "0") == "0"  # under torchrun only rank 0 reports
    args.json &= rank0
    return doctor(_config(DoctorConfig, args), args.script, show=rank0, debug=args.debug)


COMMANDS = {  # name: (declares its options, runs it)
    "train": (_options("trainer.loop", "TrainConfig"), _run_train),
    "info": (_add_info, _run_info),
    "index": (_add_index, _run_index),
    "profile": (_options("tools.profiling", "ProfileConfig"), _run_profile),
    "bench": (_options("tools.bench", "BenchConfig"), _run_bench),
    "convert": (_options("storage.convert", "ConvertConfig"), _run_convert),
    "doctor": (_add_doctor, _run_doctor),
}
HELP = {
    "train": "train a reference model (default: bundled MNIST)",
    "info": "dataset shapes and bytes per epoch per strategy",
    "index": "index WebDataset shards ahead, once for many runs (train does it if not)",
    "profile": "each transfer strategy under torch.profiler, vs the usual loop",
    "bench": "loader and training throughput vs torchvision's DataLoader",
    "convert": "an image folder into a compact store (uint8 pixels or JPEG bytes)",
    "doctor": "run your training script: what crosses host->device, and what could",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line like every other error; --help has the usage
        line = f"{_one_line(message)} (see {self.prog} --help)"
        sys.stderr.write(f"{self.prog}: error: {line}\n")
        stop = SystemExit(2)
        stop.line = line  # for the --json line (_main)
        raise stop


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser, with the options of ``command`` alone (``latecast --help`` imports none)."""
    parser = _Parser(
        prog="latecast",
        description=("Move bytes, not floats: uint8 batches to the device, normalized there."),
    )
    parser.add_argument("--version", action="version", version=f"latecast {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (add, _) in COMMANDS.items():
        p = sub.add_parser(name, help=HELP[name], description=HELP[name])
        if name == command:
            add(p)
            p.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
            p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    return parser


def _one_line(text: object) -> str:
    """``text`` on one line, control characters escaped as ``repr`` would."""
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: repr(m.group())[1:-1], str(text).strip())


def _strict(value):
    """``value`` with NaN and infinities as null: the ``--json`` line is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit code. Ctrl-C at any point, even while torch is importing,
    is one line and exit code 130."""
    if "torch" not in sys.modules and not {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"} & set(os.environ):
        os.environ["GOMP_SPINCOUNT"] = "2000"  # read once, as torch loads: see threads.py
    try:
        try:
            return _main(argv)
        except RuntimeError as err:  # a class body's __set_name__ wraps a Ctrl-C landing in it
            if isinstance(err.__cause__, KeyboardInterrupt):
                raise err.__cause__ from None
            raise
    except KeyboardInterrupt:
        # Interrupted inside an exec()/eval() of a string (dataclasses and namedtuples make
        # their methods so), CPython keeps its "unhandled KeyboardInterrupt" flag set although
        # the interrupt was handled here, and kills itself with SIGINT at exit instead of
        # returning 130; a string exec() that completes clears the flag.
        exec("")
        print("latecast: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str] | None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in words if not a.startswith("-")), None)  # -h is all before it
    try:
        args = build_parser(command).parse_args(words)
    except SystemExit as stop:  # bad usage: with --json (latecast's, not a script's after --)
        ours = words[: words.index("--")] if "--" in words else words
        if hasattr(stop, "line") and "--json" in ours:
            print(json.dumps({"error": stop.line, "exit_code": 2}))
        raise
    shown, code = warnings.formatwarning, 0  # put back after: main() may be called in-process
    if not args.debug:  # warnings as one line each, without the source line under them
        warnings.formatwarning = lambda message, *_: f"latecast: warning: {_one_line(message)}\n"
    try:
        result = COMMANDS[args.command][1](args)
    except Exception as err:
        if args.debug:
            raise
        # what the command had done before it failed (doctor's report of a failing script)
        done = getattr(err, "result", None) or {}
        code = getattr(err, "exit_code", 1)  # a doctored script's own
        result = {**done, "error": _one_line(_message(err)), "exit_code": code}
        print(f"latecast: error: {result['error']}", file=sys.stderr)
    finally:
        warnings.formatwarning = shown
    if args.json:  # the last stdout line, also on an error
        print(json.dumps(_strict(result), default=str, allow_nan=False))
    return code


def _message(err: Exception) -> str:
    """A LatecastError's own message; what the system refused (OSError) or ran out of
    (host or device memory) as it says it; anything else is a bug in latecast, said so."""
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    if isinstance(err, LatecastError):
        return str(err)
    if isinstance(err, (OSError, MemoryError)) or type(err).__name__ == "OutOfMemoryError":
        return first
    return f"internal error ({type(err).__name__}: {first}); please report it (--debug: traceback)"


if __name__ == "__main__":
    sys.exit(main())
