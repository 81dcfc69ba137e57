"""The smallest complete use of latecast: a plain PyTorch loop on MNIST.

python examples/plain_loop.py   (raises if the model does not reach 97% test accuracy)
"""

import torch
import torch.nn.functional as F

import latecast

device = "cuda" if torch.cuda.is_available() else "cpu"
train = latecast.load_dataset("mnist", "train")
test = latecast.load_dataset("mnist", "test")
loader = latecast.Loader(train, batch_size=256, device=device, seed=0)
model = torch.nn.Sequential(
    torch.nn.Flatten(), torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
).to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)

for _ in range(2):
    for images, labels in loader:  # normalized float32 (N, 1, 28, 28) already on `device`
        loss = F.cross_entropy(model(images), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

correct = 0
with torch.no_grad():
    for images, labels in latecast.Loader(test, 1000, device=device, shuffle=False):
        correct += (model(images).argmax(1) == labels).sum().item()
accuracy = correct / len(test)
print(f"test accuracy {accuracy:.4f}; {loader.stats}")
if accuracy < 0.97:
    raise SystemExit(f"expected >= 97% test accuracy, got {accuracy:.2%}")
