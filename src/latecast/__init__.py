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

__version__ = "0.1.0"
# name -> module. Imported on first use (PEP 562): `import latecast` and the command line
# start without torch (about 2 s), so a Ctrl-C during start-up reaches the CLI's handler.
_EXPORTS = {
    "Augment": "transforms",
    "Dataset": "data",
    "Erasing": "transforms",
    "LatecastError": "errors",
    "Loader": "loader",
    "Mover": "integrations.dataloader",
    "TrainConfig": "trainer.loop",
    "clip": "kinds.video",
    "convert_folder": "storage.convert",
    "from_arrays": "data",
    "image16": "kinds.image16",
    "jpeg": "kinds.jpeg",
    "jpeg_folder": "storage.folder",
    "load_dataset": "storage.datasets",
    "normalize": "transforms",
    "open_store": "storage.store",
    "PrepareOnDevice": "integrations.lightning",
    "train": "trainer.loop",
    "video": "kinds.encoded",
    "waveform": "kinds.audio",
    "wrap": "integrations.dataloader",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'latecast' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
