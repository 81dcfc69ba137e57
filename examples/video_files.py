"""Action recognition from encoded video files: the DataLoader yields each clip's mp4 bytes,
``latecast.video(frames=8, size=32)`` picks 8 frames from a seeded random start, the host
decodes only those to YUV 4:2:0 planes (1.5 bytes a pixel; on a CUDA device with TorchCodec
the files cross and NVDEC decodes them there), and the device makes them RGB, resizes,
flips and normalizes them into ``(N, C, T, H, W)`` for a 3-D conv net.

python examples/video_files.py [--clips 24] [--epochs 2]
(synthetic H.264 clips made here by PyAV: a bright square moving up, moving down, or still;
12 frames of 40x40)
"""

import argparse
import io
import math

import av
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import latecast

MEAN, STD = (0.43216, 0.394666, 0.37645), (0.22803, 0.22145, 0.216989)  # torchvision's video
FRAMES, SIDE = 12, 40
MOTIONS = ("up", "down", "still")  # not left or right: a flip would change the label


def mp4(frames: np.ndarray) -> bytes:
    """uint8 ``(T, H, W, 3)`` frames as an H.264 mp4 file at 25 fps."""
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=25)
        stream.width, stream.height, stream.pix_fmt = SIDE, SIDE, "yuv420p"
        for frame in frames:
            out.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        out.mux(stream.encode())
    return buf.getvalue()


class Files(Dataset):
    """``(mp4 bytes, label)``, as a folder of video files read by a Dataset gives them."""

    def __init__(self, n: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.labels = rng.integers(0, len(MOTIONS), n)
        self.files = []
        for label in self.labels:
            clip = rng.integers(0, 60, (FRAMES, SIDE, SIDE, 3), dtype=np.uint8)  # dim noise
            y, x = rng.integers(14, 19, 2)  # 2 pixels a frame from the middle frame: inside
            for t in range(FRAMES):
                top = y + (-2, 2, 0)[label] * (t - FRAMES // 2)
                clip[t, top : top + 8, x : x + 8] = 255
            self.files.append(mp4(clip))

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple:
        return self.files[i], int(self.labels[i])


def files_and_labels(items: list) -> tuple:
    return [f for f, _ in items], torch.tensor([label for _, label in items])


args = argparse.ArgumentParser()
args.add_argument("--clips", type=int, default=24)
args.add_argument("--epochs", type=int, default=2)
args = args.parse_args()
torch.manual_seed(0)
data = Files(args.clips)

# --8<-- [start:wrap]
dl = DataLoader(data, batch_size=8, shuffle=True, collate_fn=files_and_labels)  # mp4 bytes
train = latecast.wrap(
    dl,
    mean=MEAN,
    std=STD,
    augment=latecast.Augment(flip=0.5),  # one draw a clip, for all its frames
    fields={0: latecast.video(frames=8, size=32)},  # 8 frames from a random start
)
# --8<-- [end:wrap]
model = torch.nn.Sequential(  # (N, 3, 8, 32, 32) -> a motion
    torch.nn.Conv3d(3, 8, 3, padding=1),
    torch.nn.ReLU(),
    torch.nn.AdaptiveMaxPool3d(1),
    torch.nn.Flatten(),
    torch.nn.Linear(8, len(MOTIONS)),
).to(train.device)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
losses = []
for _ in range(args.epochs):
    for clips, labels in train:  # float32 (N, C, T, H, W), normalized; int64
        loss = F.cross_entropy(model(clips), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
assert all(map(math.isfinite, losses)), losses
s = train.stats  # image_bytes: the frames taken as YUV 4:2:0, 1.5 bytes a pixel
print(f"{len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}; {s}")
