"""Wrappers that let camkit explain a model whose input is not one ``(B, C, ...)`` tensor in
first position: :class:`InputLayout` (5-D clips in another axis order), :class:`KeywordInput`
(the explained input is a keyword argument) and :class:`ImageTower` (a dual encoder's image
side). All are ``nn.Module`` s the user wraps the model in; layer names stay those of the
wrapped model."""

from __future__ import annotations

from torch import Tensor, nn

from camkit.errors import ArgumentError, InputError


class InputLayout(nn.Module):
    """A model that takes 5-D clips in another layout, declared: ``InputLayout(model, "BTCHW")``
    is called with ``(B, C, T, H, W)`` (camkit's reading of a 5-D input) and calls ``model``
    with the axes in the declared order (``"BTCHW"``: VideoMAE, frame-wise models).

    Layer names are those of ``model`` (``"blocks.3"``; ``"module.blocks.3"`` works too). CAMs
    map ``(B, C, T, H, W) -> (B, T, H, W)``; pixel methods attribute the ``(B, C, T, H, W)``
    input. A frame-wise model (TSN, TSM, a 2-D backbone run per frame) folds the frames into its
    batch, so its layers have ``B * T`` rows (row ``b * T + t``): declare it with
    ``frame_wise=True`` and CAMs read such layers as ``(B, T, h, w)``, the default layer being
    the last frame-wise map; undeclared, CAMs refuse them by name.
    """

    wraps_model = True
    CANONICAL = "BCTHW"

    def __init__(self, model: nn.Module, layout: str, *, frame_wise: bool = False):
        super().__init__()
        order = layout.upper().replace("D", "T") if isinstance(layout, str) else None
        if order is None or sorted(order) != sorted(self.CANONICAL):
            raise ArgumentError(
                f'layout must order the letters B, C, T (or D), H, W, e.g. "BTCHW", got {layout!r}'
            )
        self.module = model
        self.layout = order
        self.frame_wise = bool(frame_wise)
        self.permutation = [self.CANONICAL.index(axis) for axis in order]

    def forward(self, x: Tensor, *args: object, **kwargs: object) -> object:
        """``(B, C, T, H, W)`` -> the model's output on ``x`` permuted to the declared layout."""
        if x.ndim != 5:
            raise InputError(f"InputLayout takes (B, C, T, H, W) clips, got {tuple(x.shape)}")
        return self.module(x.permute(self.permutation), *args, **kwargs)


class KeywordInput(nn.Module):
    """A model whose explained input is a keyword argument: ``KeywordInput(model,
    "pixel_values")`` is called as ``wrapped(x, *args, **kwargs)`` and calls
    ``model(*args, pixel_values=x, **kwargs)`` (HuggingFace models; CLIP's first positional
    argument is ``input_ids``). The other inputs come through the methods'
    ``additional_forward_args``, by keyword as a dict (per-sample tensors follow their samples):
    a model taking a dict of inputs is explained for the key named here. Layer names are those
    of ``model``.
    """

    wraps_model = True

    def __init__(self, model: nn.Module, key: str):
        super().__init__()
        if not isinstance(key, str) or not key.isidentifier():
            raise ArgumentError(f"key must be the name of a keyword argument, got {key!r}")
        self.module = model
        self.key = key

    def forward(self, x: Tensor, *args: object, **kwargs: object) -> object:
        """``model(*args, **{key: x}, **kwargs)``."""
        if self.key in kwargs:
            raise ArgumentError(f"{self.key!r} is the explained input; do not pass it again")
        return self.module(*args, **{self.key: x}, **kwargs)


# a dual encoder's image side: HuggingFace (CLIP, SigLIP) and OpenCLIP
IMAGE_TOWERS = ("get_image_features", "encode_image")


class ImageTower(nn.Module):
    """The image side of a dual encoder (HuggingFace CLIP, SigLIP and the models built like
    them; OpenCLIP): ``ImageTower(model)(pixel_values)`` is ``model.get_image_features(
    pixel_values)``'s ``(B, D)`` image embedding (before normalisation; OpenCLIP's
    ``encode_image``), so the text tower does not run; the texts are a
    :class:`camkit.targets.PromptTarget`, whose text embeddings are computed once. Layer names
    are those of ``model`` (``"vision_model.encoder.layers.1"``).
    """

    wraps_model = True

    def __init__(self, model: nn.Module):
        super().__init__()
        if not any(callable(getattr(model, name, None)) for name in IMAGE_TOWERS):
            raise ArgumentError(
                f"ImageTower needs a dual encoder with get_image_features (HuggingFace CLIPModel, "
                f"SiglipModel) or encode_image (OpenCLIP), got {type(model).__name__}"
            )
        self.module = model

    def forward(self, x: Tensor, **kwargs: object) -> Tensor:
        """``(B, C, H, W) -> (B, D)``: the projected image embedding."""
        if not callable(getattr(self.module, "get_image_features", None)):
            return self.module.encode_image(x, **kwargs)
        features = self.module.get_image_features(pixel_values=x, **kwargs)
        return features if isinstance(features, Tensor) else features.pooler_output


__all__ = ["ImageTower", "InputLayout", "KeywordInput"]
