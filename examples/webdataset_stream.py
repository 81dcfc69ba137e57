"""Photos streamed as WebDataset tar shards over HTTP, decoded on the device by latecast.

The DataLoader workers only read the shards and batch the JPEG files, as bytes (no
`.decode()`: no decoding, no crop, no ToTensor on the host). `latecast.wrap` sends the
files across in its pinned buffer and decodes them on the device in one batched call, with
the RandomResizedCrop, flip and normalize there. Under `torchrun`, `split_by_node` gives
each rank its own shards (and `split_by_worker` each worker its own of those).

python examples/webdataset_stream.py --shards DIR   # writes DIR/shard-*.tar when missing
                                                    # (CIFAR-10 JPEGs from ../shared, else
                                                    # generated photos), serves DIR on
                                                    # 127.0.0.1 and trains from it
torchrun --nproc_per_node=2 examples/webdataset_stream.py --url 'http://HOST:PORT/shard-{000..009}.tar'
(--report DIR: each rank writes the keys it read to DIR/rank-K.json)
"""

import argparse
import functools
import http.server
import io
import json
import os
import tarfile
import threading
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import webdataset as wds
from PIL import Image
from torch.utils.data import DataLoader

import latecast

ROOT = Path(__file__).resolve().parents[1]  # the checkout: ../shared beside it, or shared/ in it
COPIES = [r / "shared/datasets/cifar10-jpg/cifar10-jpg.tar.gz" for r in (ROOT / "..", ROOT)]
CIFAR = next((p for p in COPIES if p.exists()), COPIES[0])
MEAN, STD = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)


def photos(n: int):
    """``(jpeg bytes, label)``: CIFAR-10's test JPEGs, classes interleaved, when the copy is
    in ../shared; else generated 48x64 photos of 10 classes (a bright block per class)."""
    if CIFAR.exists():
        with tarfile.open(CIFAR) as tar:
            files = [m for m in tar.getmembers() if m.name.startswith("test/") and m.isfile()]
            classes = sorted({m.name.split("/")[1] for m in files})
            by_class = [[m for m in files if m.name.split("/")[1] == c] for c in classes]
            for i in range(n):
                m = by_class[i % 10][i // 10]
                yield tar.extractfile(m).read(), i % 10
        return
    rng = np.random.default_rng(0)
    for i in range(n):
        img = rng.integers(60, 120, (48, 64, 3), dtype=np.uint8)
        img[(i % 10) * 4 : (i % 10) * 4 + 12, 8:40] = 230
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, "JPEG", quality=90)
        yield buf.getvalue(), i % 10


def write_shards(folder: Path, shards: int, per_shard: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    data = photos(shards * per_shard)
    for s in range(shards):
        with wds.TarWriter(str(folder / f"shard-{s:03d}.tar")) as sink:
            for k in range(per_shard):
                jpg, label = next(data)
                sink.write({"__key__": f"{s:03d}{k:05d}", "jpg": jpg, "cls": label})


def serve(folder: Path) -> int:
    """A real HTTP server for ``folder`` on 127.0.0.1, in a thread; its port."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:  # one line per request otherwise
            pass

    handler = functools.partial(Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]


args = argparse.ArgumentParser()
args.add_argument("--shards", type=Path, help="folder of shards, written when missing")
args.add_argument("--url", help="shard URLs, brace notation; default: --shards served here")
args.add_argument("--count", type=int, default=10, help="shards written")
args.add_argument("--per-shard", type=int, default=64)
args.add_argument("--size", type=int, default=32, help="training size")
args.add_argument("--batch-size", type=int, default=32)
args.add_argument("--workers", type=int, default=2)
args.add_argument("--epochs", type=int, default=1)
args.add_argument("--report", type=Path, help="folder for each rank's keys")
args = args.parse_args()
if args.url is None:
    if not list(args.shards.glob("shard-*.tar")):
        write_shards(args.shards, args.count, args.per_shard)
    last = len(list(args.shards.glob("shard-*.tar"))) - 1
    args.url = f"http://127.0.0.1:{serve(args.shards)}/shard-{{000..{last:03d}}}.tar"

# bytes in, bytes out: the files stay JPEG, the label and key are read as text
# --8<-- [start:wrap]
dataset = (
    wds.WebDataset(args.url, nodesplitter=wds.split_by_node, shardshuffle=False)
    .to_tuple("jpg", "cls", "__key__")
    .map_tuple(None, lambda c: int(c), None)
    .batched(args.batch_size, partial=True)  # ([bytes], tensor of labels, [keys])
)
dl = DataLoader(dataset, batch_size=None, num_workers=args.workers)
aug = latecast.Augment(resized_crop=0.35, flip=0.5)
train = latecast.wrap(dl, mean=MEAN, std=STD, augment=aug, fields={0: latecast.jpeg(args.size)})
# --8<-- [end:wrap]
rank = int(os.environ.get("RANK", 0))
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 16, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
    torch.nn.Flatten(), torch.nn.Linear(16, 10),
).to(train.device)  # fmt: skip
opt = torch.optim.SGD(model.parameters(), lr=0.05)

keys = []
for epoch in range(args.epochs):
    train.set_epoch(epoch)
    for images, labels, names in train:  # float32 (N, 3, S, S) on the device, int64, keys
        loss = F.cross_entropy(model(images), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        keys += names if epoch == 0 else []
s = train.stats
print(
    f"rank {rank}: {len(keys)} photos an epoch, loss {loss.item():.3f}; decoded by {s.decoder}; "
    f"host->device {s.image_bytes} JPEG bytes (uint8 would be {s.decoded_bytes}, float32 "
    f"{s.usual_bytes})"
)
if args.report:
    args.report.mkdir(parents=True, exist_ok=True)
    (args.report / f"rank-{rank}.json").write_text(json.dumps(keys))
