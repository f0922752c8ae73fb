"""A Clever-Hans model whose strategies are known: the check that SpRAy finds them.

:func:`planted_model` decides class 0 by red wherever it is; :func:`planted_images` draws
class-0 images with a red tag in the corner (the shortcut, as the copyright tag of Lapuschkin et
al. 2019) or a red object near the centre (the honest strategy), and returns which, so the
clustering can be scored and the eigengap checked (2 strategies).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

TAG = 5  # side of the corner tag, pixels


def planted_model() -> nn.Sequential:
    """A hand-set CNN ``(B, 3, H, W)`` in [0, 1] -> logits ``(B, 2)`` (class 0 by red, 1 by
    blue); the layer to explain is ``"1"``, the ReLU of its red, green and blue detectors."""
    conv = nn.Conv2d(3, 3, kernel_size=1)
    head = nn.Linear(3, 2)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor([[2.0, -1, -1], [-1, 2, -1], [-1, -1, 2]])[:, :, None, None])
        conv.bias.zero_()
        head.weight.copy_(torch.tensor([[40.0, 0.0, 0.0], [0.0, 0.0, 40.0]]))
        head.bias.copy_(torch.tensor([0.0, 0.2]))
    return nn.Sequential(conv, nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), head)


def planted_images(
    tagged: int, objects: int, side: int = 32, seed: int = 0
) -> tuple[torch.Tensor, np.ndarray]:
    """``tagged`` corner-tag images and ``objects`` object images of class 0, shuffled ->
    ``(images (N, 3, side, side), truth (N,))`` with truth 1 for a tag image, 0 for an object.

    The background is grey noise; the object is a red disc of radius ``side/6`` within
    ``side/8`` pixels of the centre; the tag a ``TAG x TAG`` red square in the bottom-right
    corner."""
    rng = np.random.default_rng(seed)
    count = tagged + objects
    images = 0.4 + 0.1 * rng.random((count, 1, side, side)).repeat(3, axis=1)
    yy, xx = np.mgrid[:side, :side]
    truth = np.r_[np.ones(tagged, int), np.zeros(objects, int)]
    for k in range(count):
        if truth[k]:
            images[k, :, -TAG - 1 : -1, -TAG - 1 : -1] = np.array([1.0, 0.0, 0.0])[:, None, None]
        else:
            cy, cx = side / 2 + rng.uniform(-side / 8, side / 8, 2)
            disc = (yy - cy) ** 2 + (xx - cx) ** 2 <= (side / 6) ** 2
            images[k][:, disc] = np.array([0.9, 0.1, 0.1])[:, None]
    order = rng.permutation(count)
    return torch.tensor(images[order], dtype=torch.float32), truth[order]
