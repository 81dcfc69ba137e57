"""The wheel, installed into a fresh venv with no checkout on its path, carries MNIST and
``py.typed`` and trains from outside the checkout. Its dependencies come from this
interpreter by a ``.pth`` path line (which runs none of the ``.pth`` files there: an
editable latecast stays out)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VERSION = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M)[1]


def run(*argv, cwd: Path, env: dict) -> str:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"{argv}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def build_wheel(tmp: Path) -> Path:
    """The wheel of a copy of what pyproject.toml packages (the checkout gets no build/)."""
    tree = tmp / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "src", tree / "src", ignore=ignore)
    pip = [sys.executable, "-m", "pip", "wheel", str(tree), "--no-deps"]
    if importlib.util.find_spec("setuptools"):  # no index needed (venvs of 3.12+ lack it)
        pip.append("--no-build-isolation")
    run(*pip, "-q", "-w", str(tmp / "dist"), cwd=tmp, env=os.environ)
    (wheel,) = (tmp / "dist").glob("latecast-*.whl")
    return wheel


def fresh_venv(tmp: Path, wheel: Path) -> Path:
    """A venv holding the wheel's latecast; the dependencies from the running interpreter."""
    venv = tmp / "fresh"
    run(sys.executable, "-m", "venv", "--without-pip", str(venv), cwd=tmp, env=clean_env())
    python = str(venv / "bin" / "python")
    where = "import sysconfig; print(sysconfig.get_path('purelib'))"
    packages = Path(run(python, "-c", where, cwd=tmp, env=clean_env()).strip())
    (packages / "dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps"]
    run(*pip, "--no-index", str(wheel), cwd=tmp, env=clean_env())  # pip on fresh's behalf
    return venv


def clean_env() -> dict:
    """This environment without what would put the checkout on the path (PYTHONPATH=src)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


@pytest.mark.slow
def test_the_wheel_installs_into_a_fresh_venv_and_trains_outside_the_checkout(tmp_path):
    wheel = build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    bundled = {f"latecast/bundled/{n}" for n in ("SHA256SUMS", "train-images-idx3-ubyte.gz")}
    assert {"latecast/py.typed", *bundled} <= names, sorted(names)

    venv = fresh_venv(tmp_path, wheel)
    away = tmp_path / "elsewhere"  # no checkout here or above: tmp is outside it
    away.mkdir()
    env = clean_env()
    code = "import latecast; latecast.wrap; print(latecast.__file__)"
    where = run(str(venv / "bin" / "python"), "-c", code, cwd=away, env=env)
    assert Path(where.strip()).is_relative_to(venv), where  # the wheel's, not the checkout's
    assert run(str(venv / "bin" / "latecast"), "--version", cwd=away, env=env).strip() == (
        f"latecast {VERSION}"
    )
    argv = ["train", "--epochs", "1", "--limit-train", "2048", "--device", "cpu", "--json"]
    out = run(str(venv / "bin" / "latecast"), *argv, cwd=away, env=env)
    assert '"test_accuracy"' in out.splitlines()[-1], out[-2000:]
