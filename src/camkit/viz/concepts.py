"""Figures of Deep Feature Factorization's concepts (:mod:`camkit.methods.cam.dff`): each pixel
coloured by its strongest concept, and the image beside it with a legend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from camkit.errors import ArgumentError, InputError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from camkit.methods.cam.dff import Concepts


def concept_colors(count: int) -> Tensor:
    """``(count, 3)`` RGB colours in [0, 1] from matplotlib's ``gist_rainbow`` (as DFF's code)."""
    import matplotlib

    cmap = matplotlib.colormaps["gist_rainbow"]
    return torch.tensor([cmap(i / count)[:3] for i in range(count)], dtype=torch.float32)


def concept_image(
    image: Tensor, maps: Tensor, *, colors: Tensor | None = None, image_weight: float = 0.3
) -> Tensor:
    """Colour each pixel by its strongest concept ``c``, brightness its map value, over the
    image: ``image (3, H, W)``, ``maps (k, H, W)`` in [0, 1] -> ``(3, H, W)`` in [0, 1],
    ``image_weight * image + (1 - image_weight) * color_c * map_c / max(color_c)``
    (pytorch-grad-cam's ``show_factorization_on_image`` without its uint8 rounding).
    """
    if image.ndim != 3 or image.shape[0] != 3 or maps.ndim != 3:
        raise InputError(
            f"expected image (3, H, W) and maps (k, H, W), got {tuple(image.shape)} and "
            f"{tuple(maps.shape)}"
        )
    if image.shape[1:] != maps.shape[1:]:
        raise InputError(f"image {tuple(image.shape)} and maps {tuple(maps.shape)} differ in size")
    if not 0 <= image_weight <= 1:
        raise ArgumentError(f"image_weight must be in [0, 1], got {image_weight}")
    colors = concept_colors(maps.shape[0]) if colors is None else colors
    colors = colors.to(device=maps.device, dtype=torch.float32)
    colors = colors / colors.amax(dim=1, keepdim=True).clamp_min(1e-12)
    strongest = maps.argmax(dim=0)  # (H, W)
    value = maps.gather(0, strongest[None])[0]
    painted = colors[strongest].permute(2, 0, 1) * value
    return image_weight * image.float() + (1 - image_weight) * painted


def plot_concepts(
    image: Tensor,
    concepts: Concepts,
    labels: list[str] | None = None,
    *,
    top_k: int = 2,
    image_weight: float = 0.3,
) -> Figure:
    """Image | coloured concept map with a legend of each concept's top classes, as
    pytorch-grad-cam's ``run_dff_on_image`` -> a ``matplotlib.figure.Figure`` (no pyplot).
    ``image (3, H, W)`` in [0, 1] at the maps' size, ``concepts`` of one image; ``labels``
    names the classes (else the legend gives their indices).
    """
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    if concepts.maps.ndim != 3:
        raise InputError("plot_concepts draws the concepts of one image: maps (k, H, W)")
    colors = concept_colors(concepts.maps.shape[0])
    picture = concept_image(
        image.cpu(), concepts.maps.cpu(), colors=colors, image_weight=image_weight
    )
    if concepts.scores is None:
        names = [f"concept {i}" for i in range(concepts.maps.shape[0])]
    else:
        names = concepts.legend(labels or [str(i) for i in range(concepts.scores.shape[1])], top_k)
    figure = Figure(figsize=(9, 4.5), layout="constrained")
    image_axes, concept_axes = figure.subplots(1, 2)
    image_axes.imshow(image.permute(1, 2, 0).clamp(0, 1).cpu().numpy())
    image_axes.set_title("image")
    concept_axes.imshow(picture.permute(1, 2, 0).clamp(0, 1).numpy())
    concept_axes.set_title(f"{len(names)} concepts (Deep Feature Factorization)")
    lines = [Line2D([0], [0], color=color.tolist(), lw=4) for color in colors]
    concept_axes.legend(lines, names, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    for axes in (image_axes, concept_axes):
        axes.set_axis_off()
    return figure
