"""``latecast train --check`` under generated argument lists: every option (read from
``TrainConfig``) gets valid, out-of-range and odd values and paths; each list ends with exit
0, 1 or 2, one stderr line for 1 and 2, strict JSON, and writes nothing."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import fields

import pytest
from _helpers import held, tree
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from latecast.data import from_arrays
from latecast.movers import MOVERS
from latecast.storage.datasets import BUNDLED, load_dataset
from latecast.storage.options import kind
from latecast.storage.store import write_store
from latecast.trainer.loop import PRESETS, TrainConfig
from latecast.trainer.models import MODELS

pytestmark = pytest.mark.slow  # 300 generated runs: about half a minute on 2 cores

ODD = st.sampled_from(
    ["", " ", "nan", "inf", "-inf", "-1", "0", "1e400", "1_0", "0x10", "ü", "日本", "a\nb", "-"]
    + ["%s", "{}", "..", "/", "True", "none", "\x1b[31m", "3.5", "-0", "9" * 30]
) | st.text(max_size=12)
INTS = st.integers(-3, 3) | st.sampled_from([2**31, 2**63, 2**64, -(2**63), 10**30, 65])
FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, 1e-300])


def values(name: str, k: str, paths: dict[str, str]) -> st.SearchStrategy[str]:
    """Valid values (three times as likely) or anything else, as the command line gets them."""
    valid = {
        "dataset": st.sampled_from(["mnist", "mnist", paths["store"], "cifar10", "kmnist"]),
        "preset": st.sampled_from(list(PRESETS)),
        "model": st.sampled_from(list(MODELS)),
        "epochs": st.integers(1, 4),
        "batch_size": st.sampled_from([1, 2, 64, 128, 256]),
        "lr": st.sampled_from([0.01, 0.1, 1.0]),
        "label_smoothing": st.sampled_from([0.0, 0.1, 0.9]),
        "augment": st.sampled_from(["none", "crop=4,flip,cutout=8,fill=reflect", "crop=60"]),
        "order": st.sampled_from(["random", "block", "block:8:4", "block:0:5", f"block:{2**63}:1"]),
        "mix": st.sampled_from(["none", "mixup=0", "mixup=0.2,cutmix", "cutmix=0"]),
        "momentum": st.sampled_from([0.0, 0.9, 1.5]),
        "weight_decay": st.sampled_from([0.0, 5e-4]),
        "transfer": st.sampled_from([*MOVERS, "auto"]),
        "device": st.sampled_from(["cpu", "auto", "cuda", "cuda:0", "cpu:1", "mps", "meta"]),
        "data_root": st.sampled_from([paths["mnist-raw"], paths["empty"]]),
        "output_dir": st.sampled_from([paths[p] for p in ("fresh", "empty", "prev", "deep")]),
        "resume": st.sampled_from(["auto", paths["ckpt"], paths["garbage"], paths["missing"]]),
        "limit_train": st.integers(1, 300),
        "limit_test": st.integers(1, 300),
    }.get(name)
    odd_paths = st.sampled_from([paths[p] for p in ("file", "under-file", "held", "long")])
    if valid is None:
        valid = {"int": st.integers(1, 100), "float": st.floats(0.1, 100.0)}.get(k, ODD)
    anything = {"int": INTS, "float": FLOATS}.get(k, ODD | odd_paths)
    return st.one_of(valid, valid, valid, anything, ODD).map(str)


@st.composite
def argument_lists(draw, paths: dict[str, str]) -> list[str]:
    chosen = draw(st.lists(st.sampled_from(fields(TrainConfig)), unique=True, max_size=8))
    argv = []
    for f in chosen:
        flag = "--" + f.name.replace("_", "-")
        if kind(f) == "bool":
            argv.append(flag if draw(st.booleans()) else f"--no-{flag[2:]}")
        elif f.metadata["positional"]:
            argv.insert(0, draw(values(f.name, kind(f), paths)))
        else:
            argv += [flag, draw(values(f.name, kind(f), paths))]
    if draw(st.booleans()):
        argv.append("--json")
    return [*argv, "--check"]  # last: a generated --no-check never wins


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """What the lists point at, a run holding one folder, an empty $LATECAST_DATA (datasets
    "not found" without the network)."""
    from latecast.tools.cli import main

    root = tmp_path_factory.mktemp("fuzz")
    train, test = load_dataset("mnist", "train"), load_dataset("mnist", "test")
    for split, ds in (("train", train), ("test", test)):
        small = from_arrays(ds.images[:256], ds.labels[:256], split=split, mean=ds.mean, std=ds.std)
        write_store(small, root / "store" / split)
    (root / "mnist-raw").mkdir()
    for gz in BUNDLED.glob("*.gz"):
        shutil.copy(gz, root / "mnist-raw")
    for name in ("empty", "nodata"):
        (root / name).mkdir()
    (root / "afile").write_text("a file")
    (root / "garbage.pt").write_bytes(os.urandom(512))
    argv = "train --model mlp --epochs 1 --limit-train 64 --limit-test 64 --no-progress".split()
    assert main([*argv, "--output-dir", str(root / "prev")]) == 0
    paths = {name: name for name in ("store", "mnist-raw", "empty", "prev", "held")}
    paths.update(fresh="runs/new", deep="a/b/c/d", ckpt="prev/checkpoint.pt", long="x" * 300)
    paths.update({"garbage": "garbage.pt", "missing": "missing.pt", "file": "afile"})
    paths["under-file"] = "afile/run"
    with held(root / "held"), pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        patch.setenv("LATECAST_DATA", str(root / "nodata"))
        patch.setenv("LATECAST_MIRRORS", "https://127.0.0.1:9/")  # refused at once, if reached
        yield root, paths


def strict_json(line: str) -> dict:
    def refuse(name):
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(line, parse_constant=refuse)


def test_check_under_300_generated_argument_lists(sandbox, run_cli):
    root, paths = sandbox
    before = tree(root)
    seen: dict[int, int] = {}

    @settings(
        max_examples=300,
        deadline=None,
        derandomize=True,  # the same 300 lists on every run: CI stays reproducible
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(argument_lists(paths))
    def one(argv: list[str]) -> None:
        proc = run_cli("train", *argv)
        seen[proc.rc] = seen.get(proc.rc, 0) + 1
        assert proc.rc in (0, 1, 2), (argv, proc.rc, proc.err)
        assert "Traceback" not in proc.err + proc.out, (argv, proc.err)
        if proc.rc:
            lines = proc.err.splitlines()
            assert len(lines) == 1 and ": error: " in lines[0], (argv, proc.err)
            assert "internal error" not in lines[0], (argv, lines[0])
        else:
            assert "--json" in argv or "check passed" in proc.out, (argv, proc.out)
            if "--json" in argv:
                assert strict_json(proc.out.strip().splitlines()[-1])["checked"] is True

    one()
    assert tree(root) == before  # --check wrote nothing, anywhere in the sandbox
    assert min(seen.get(rc, 0) for rc in (0, 1, 2)) >= 10, seen  # every outcome explored


@pytest.mark.parametrize(
    "argv,rc,says",
    [
        (["--limit-train", "64", "--model", "mlp"], 0, "check passed: mlp on mnist (64 train"),
        (["--epochs", "many"], 2, "invalid int value: 'many'"),
        (["--lr", "nan"], 1, "lr must be a number > 0"),
        (["--output-dir", "afile"], 1, "afile is not a folder"),
        (["--output-dir", "held"], 1, "in use by another latecast run"),
        (["--resume", "garbage.pt"], 1, "garbage.pt: not a readable checkpoint"),
    ],
)
def test_check_in_a_real_process(argv, rc, says, sandbox, run_cli):
    proc = run_cli("train", *argv, "--check", process=True)  # in the sandbox folder
    assert proc.rc == rc and says in (proc.out if rc == 0 else proc.err), proc.out + proc.err
    assert "Traceback" not in proc.err and len(proc.err.splitlines()) == (rc != 0)


def test_main_in_process_leaves_the_warnings_format_as_it_found_it(run_cli, tmp_path):
    """The CLI shows warnings one line each while it runs; called in-process (a notebook, a
    script's own ``main([...])``), the caller's warnings look as before once it returns."""
    import warnings

    before = warnings.formatwarning
    assert run_cli("info", tmp_path / "nowhere").rc == 1
    assert run_cli("info", "--json", tmp_path / "nowhere").rc == 1
    assert warnings.formatwarning is before
