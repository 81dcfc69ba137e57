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

from .convert import convert_folder
from .data import Dataset, from_arrays
from .datasets import load_dataset
from .errors import LatecastError
from .loader import Loader
from .store import open_store
from .train import TrainConfig, train
from .transforms import Augment, normalize
from .wrap import wrap

__version__ = "0.1.0"
__all__ = [
    "Augment",
    "Dataset",
    "LatecastError",
    "Loader",
    "TrainConfig",
    "convert_folder",
    "from_arrays",
    "load_dataset",
    "normalize",
    "open_store",
    "train",
    "wrap",
]
