"""latecast: move bytes, not floats.

Image datasets are uint8; latecast keeps them uint8 across the host->device copy (4x fewer
image bytes than float32, 8x fewer label bytes than int64) and casts, normalizes and
augments on the device, whole batches at a time.

Example:
    >>> import latecast
    >>> train = latecast.load_dataset("mnist")
    >>> loader = latecast.Loader(train, batch_size=256, device="cuda", transfer="auto")
    >>> for images, labels in loader:   # float (N, C, H, W) normalized on the device
    ...     ...
"""

from __future__ import annotations

import importlib
import sys
import types

__version__ = "0.1.0"
# name -> module. Imported on first use (PEP 562): `import latecast` and the command line
# start without torch (about 2 s), so a Ctrl-C during start-up reaches the CLI's handler.
_EXPORTS = {
    "Augment": "transforms",
    "Dataset": "data",
    "LatecastError": "errors",
    "Loader": "loader",
    "TrainConfig": "train",
    "convert_folder": "convert",
    "from_arrays": "data",
    "load_dataset": "datasets",
    "normalize": "transforms",
    "open_store": "store",
    "train": "train",
    "wrap": "wrap",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'latecast' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value) -> None:
        # Importing the module latecast.train (or .wrap) sets the package's `train` to that
        # module; the package's name stays the function, as when it was imported eagerly.
        if isinstance(value, types.ModuleType) and _EXPORTS.get(name) == name:
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
