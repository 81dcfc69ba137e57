"""Reference models, chosen by name from ``MODELS``, built for an input shape ``(C, H, W)``
(any size and channel count): ``mlp`` and ``cnn`` for 28x28 grayscale, ``resnet9`` for 32x32
colour (larger photos get a stride-4 stem first)."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..errors import ConfigError


def mlp(in_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """Two hidden layers of 256: ~98% on MNIST, a floor for the data path, not a contender."""
    c, h, w = in_shape
    hidden = [nn.Flatten(), nn.Linear(c * h * w, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU()]
    return nn.Sequential(*hidden, nn.Linear(256, num_classes))


def _conv_bn(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    conv = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
    return nn.Sequential(conv, nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


def cnn(in_shape: tuple[int, int, int], num_classes: int, width: int = 32) -> nn.Module:
    """Small conv net with batch norm: conv-bn-relu blocks, two 2x2 pools, linear head."""
    c, h, w = in_shape
    return nn.Sequential(
        _conv_bn(c, width),
        nn.MaxPool2d(2),  # (N, w, H/2, W/2)
        _conv_bn(width, 2 * width),
        nn.MaxPool2d(2),  # (N, 2w, H/4, W/4)
        _conv_bn(2 * width, 2 * width),
        nn.AdaptiveMaxPool2d(1),
        nn.Flatten(),  # (N, 2w)
        nn.Linear(2 * width, num_classes),
    )


class _Residual(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.body = nn.Sequential(_conv_bn(width, width), _conv_bn(width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


def resnet9(in_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """The ResNet-9 of the DAWNBench CIFAR-10 entries (Page, 2018): a prep conv, three stages
    of conv-bn-relu + 2x2 pool, residual pairs after the first and the last, global max pool,
    a linear head scaled by 1/8. Above 64 px a stride-2 prep conv and a 2x2 max pool first
    (ResNet's stem): the body runs on a quarter of the side."""
    c, large = in_shape[0], max(in_shape[1:]) > 64
    w0, w1, w2, w3 = 64, 128, 256, 512
    return nn.Sequential(
        _conv_bn(c, w0, stride=2 if large else 1),
        nn.MaxPool2d(2) if large else nn.Identity(),
        _conv_bn(w0, w1),
        nn.MaxPool2d(2),
        _Residual(w1),  # (N, w1, H/2, W/2)
        _conv_bn(w1, w2),
        nn.MaxPool2d(2),  # (N, w2, H/4, W/4)
        _conv_bn(w2, w3),
        nn.MaxPool2d(2),
        _Residual(w3),  # (N, w3, H/8, W/8)
        nn.AdaptiveMaxPool2d(1),
        nn.Flatten(),
        nn.Linear(w3, num_classes, bias=False),
        _Scale(0.125),
    )


class _Scale(nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


MODELS: dict[str, Callable[..., nn.Module]] = {"mlp": mlp, "cnn": cnn, "resnet9": resnet9}


def build_model(name: str, in_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """The model called ``name`` for ``(C, H, W)`` inputs and ``num_classes`` outputs."""
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; valid: {', '.join(MODELS)}")
    return MODELS[name](in_shape, num_classes)
