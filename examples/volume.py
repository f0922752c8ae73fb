"""Grad-CAM and saliency on 3-D volumes (a Conv3d network on (B, C, D, H, W) inputs).

A toy volume with a bright cube in one corner and a network whose score depends on it: the map
is a (D, H, W) volume, upsampled trilinearly, and one of its slices is overlaid on the input's
slice. Random weights except where the toy needs them; nothing is downloaded.

    python examples/volume.py    # writes volume_slice.png
"""

import torch
from torch import nn

import camkit

torch.manual_seed(0)
model = nn.Sequential(
    nn.Conv3d(1, 4, 3, padding=1),
    nn.ReLU(),
    nn.MaxPool3d(2),
    nn.Conv3d(4, 8, 3, padding=1),
    nn.ReLU(),
    nn.AdaptiveAvgPool3d(1),
    nn.Flatten(),
    nn.Linear(8, 2),
).eval()

volume = torch.zeros(1, 1, 16, 32, 32)
volume[:, :, 2:8, 4:12, 4:12] = 1.0  # the bright cube

heat = camkit.GradCAM(model, "3")(volume, target=1)  # (1, 16, 32, 32)
attr = camkit.Saliency(model)(volume, target=1)  # (1, 1, 16, 32, 32), like the input
print("Grad-CAM volume:", tuple(heat.shape), "saliency:", tuple(attr.shape))

depth = 5  # a slice through the cube
picture = camkit.overlay(volume[0], heat[0], depth=depth)  # (1, D, H, W) and (D, H, W)
camkit.io.save_png("volume_slice.png", picture)
print("wrote volume_slice.png (slice", depth, "of", heat.shape[1], ")")
