"""``latecast`` command line: argparse -> frozen dataclass configs -> library functions.

Exit codes: 0 success, 2 bad usage (argparse), 1 a ``LatecastError`` (one line on stderr,
no traceback unless ``--debug``). With ``--json`` the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import warnings
from dataclasses import MISSING, fields
from typing import Callable

from .config import DATASET_HELP, kind
from .errors import LatecastError


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="last stdout line: one JSON object")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")


def _options(module: str, name: str) -> Callable[[argparse.ArgumentParser], None]:
    """An ``add`` function declaring one flag per field of the config dataclass ``name`` in
    ``latecast.module``: ``--name-with-dashes``, its type, default and help from the field
    (``config.option``). Imported when called: torch loads inside ``main``'s handlers."""

    def add(p: argparse.ArgumentParser) -> None:
        cls = getattr(importlib.import_module(f"latecast.{module}"), name)
        for f in fields(cls):
            meta, default = f.metadata, f.default
            shown = (
                "" if default in (None, MISSING) or kind(f) == "bool" else " (default: %(default)s)"
            )
            if meta["positional"]:
                optional = {} if default is MISSING else {"nargs": "?", "default": default}
                p.add_argument(f.name, **optional, help=meta["help"] + shown)
                continue
            names = [n for n in (meta["short"], "--" + f.name.replace("_", "-")) if n]
            if kind(f) == "bool":
                p.add_argument(
                    *names,
                    action=argparse.BooleanOptionalAction,
                    default=default,
                    help=meta["help"],
                )
            else:
                p.add_argument(
                    *names,
                    type={"int": int, "float": float}.get(kind(f), str),
                    default=default,
                    metavar=meta["metavar"],
                    help=meta["help"] + shown,
                )

    return add


def _config(cls, args: argparse.Namespace):
    """Build the dataclass ``cls`` from the parsed flags that share its field names."""
    given = vars(args)
    return cls(**{f.name: given[f.name] for f in fields(cls) if f.name in given})


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


# -- train -------------------------------------------------------------------------------


def _run_train(args: argparse.Namespace) -> dict:
    from .train import TrainConfig, train

    summary = train(_config(TrainConfig, args))
    if summary["rank"] != 0:  # under torchrun only rank 0 reports (and prints the JSON)
        args.json = False
        return summary
    saved = 1 - summary["h2d_bytes"] / max(summary["h2d_bytes_float32"], 1)
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
    print(
        f"host->device: {_human_bytes(summary['h2d_bytes'])} moved; float32 would have moved "
        f"{_human_bytes(summary['h2d_bytes_float32'])} ({saved:.0%} less)"
        + (  # JPEG: compressed bytes; decoded uint8 is the other comparison
            f", uint8 {_human_bytes(summary['h2d_bytes_uint8'])}"
            if summary["transfer"] == "jpeg"
            else ""
        )
    )
    return summary


# -- info --------------------------------------------------------------------------------


def _add_info(p: argparse.ArgumentParser) -> None:
    p.add_argument("dataset", nargs="?", default="mnist", help=DATASET_HELP)
    p.add_argument("--data-root", default=None, help="folder with the dataset's files")


def _run_info(args: argparse.Namespace) -> dict:
    from .datasets import load_dataset
    from .transfer import MOVERS, movers_for

    info = {}
    for split in ("train", "test"):
        ds = load_dataset(args.dataset, split, root=args.data_root)
        info[split] = {
            "samples": len(ds),
            "image_shape": list(ds.image_shape),
            "encoding": getattr(ds, "encoding", "raw"),
            "classes": len(ds.classes),
            "image_bytes": ds.image_bytes,
            "label_bytes": ds.label_bytes,
            "epoch_bytes": {s: MOVERS[s].epoch_bytes(ds) for s in movers_for(ds)},
        }
        if split == "train":
            info["mean"], info["std"] = list(ds.mean), list(ds.std)
    tr = info["train"]
    stored = (
        "uint8"
        if tr["encoding"] == "raw"
        else f"{tr['encoding']} ({_human_bytes(tr['image_bytes'])})"
    )
    print(
        f"{args.dataset}: train {tr['samples']} x {tuple(tr['image_shape'])} {stored}, "
        f"test {info['test']['samples']}, {tr['classes']} classes, "
        f"mean {[round(m, 4) for m in info['mean']]} std {[round(s, 4) for s in info['std']]}"
    )
    print(f"{'strategy':<10} {'host->device per epoch':>24} {'once':>12}")
    for name, b in tr["epoch_bytes"].items():
        print(f"{name:<10} {_human_bytes(b['per_epoch']):>24} {_human_bytes(b['once']):>12}")
    return {"dataset": args.dataset, **info}


# -- profile -----------------------------------------------------------------------------


def _need_bench_extra(command: str) -> None:
    """profile and bench compare against torchvision and plot with matplotlib."""
    from .errors import ConfigError

    for module in ("torchvision", "matplotlib", "PIL"):
        try:
            __import__(module)
        except ImportError:
            raise ConfigError(
                f"latecast {command} needs {module}: pip install 'latecast[bench]'"
            ) from None


def _run_profile(args: argparse.Namespace) -> dict:
    from .profiling import ProfileConfig, profile

    _need_bench_extra("profile")
    result = profile(_config(ProfileConfig, args))
    print(
        f"wrote report.md, report.json, profile.png and {len(result['rows'])} traces to "
        f"{args.output_dir}"
    )
    return result


# -- bench -------------------------------------------------------------------------------


def _run_bench(args: argparse.Namespace) -> dict:
    from .bench import BenchConfig, bench

    _need_bench_extra("bench")
    result = bench(_config(BenchConfig, args))
    print(f"wrote bench.json, bench.md and bench.png to {args.output_dir}")
    return result


# -- convert -----------------------------------------------------------------------------


def _run_convert(args: argparse.Namespace) -> dict:
    import time

    from .convert import ConvertConfig, convert
    from .store import SPLIT_NAMES, open_store

    start = time.perf_counter()
    out, skipped = convert(_config(ConvertConfig, args))
    seconds = time.perf_counter() - start
    names = [s for s in SPLIT_NAMES if (out / s).is_dir()] or [None]
    splits = {s or "train": open_store(out, s) for s in names}
    ds, n = splits["train"], sum(map(len, splits.values()))
    encoding = getattr(ds, "encoding", "raw")
    print(
        f"{out}: {', '.join(f'{s} {len(d)}' for s, d in splits.items())} images "
        f"{ds.image_shape} {encoding} ({_human_bytes(ds.image_bytes)} train), "
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


COMMANDS = {
    "train": (
        _options("train", "TrainConfig"),
        _run_train,
        "train a reference model (default: bundled MNIST)",
    ),
    "info": (_add_info, _run_info, "dataset shapes and bytes per epoch per strategy"),
    "profile": (
        _options("profiling", "ProfileConfig"),
        _run_profile,
        "each transfer strategy under torch.profiler, vs the usual loop",
    ),
    "bench": (
        _options("bench", "BenchConfig"),
        _run_bench,
        "loader and training throughput vs torchvision's DataLoader",
    ),
    "convert": (
        _options("convert", "ConvertConfig"),
        _run_convert,
        "an image folder into a compact store (uint8 pixels or JPEG bytes)",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="latecast",
        description=("Move bytes, not floats: uint8 batches to the device, normalized there."),
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (add, _, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        add(p)
        _common(p)
    return parser


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    return f"latecast: warning: {message}\n"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.debug:  # warnings as one line each, without the source line under them
        warnings.formatwarning = _one_line_warning
    try:
        result = COMMANDS[args.command][1](args)
    except LatecastError as err:
        if args.debug:
            raise
        print(f"latecast: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("latecast: interrupted", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
