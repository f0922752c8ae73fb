"""Grad-CAM and attention maps on vision transformers: tokens and channels-last layers.

    python examples/vit_tokens.py

No weights are downloaded, so the models have random weights: the point is the API (pass
``pretrained=True`` to timm where you have the weights for meaningful maps). For each model,
:func:`camkit.core.architecture.default_token_layer` picks the layer and
:func:`camkit.layouts.infer_layout` says how its output is read as a grid: a ViT's
``(B, 197, 192)`` tokens lose their class token and become ``(B, 192, 14, 14)``; a Swin block's
``(B, 7, 7, 768)`` is channels-last.
"""

from __future__ import annotations

import timm
import torch

from camkit import GradCAM, record
from camkit.core.architecture import default_token_layer
from camkit.core.layouts import infer_layout
from camkit.methods.attention import AttentionRollout, LeGrad


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 224, 224)
    for name in (
        "vit_tiny_patch16_224",
        "deit_tiny_distilled_patch16_224",
        "swin_tiny_patch4_window7_224",
    ):
        model = timm.create_model(name, pretrained=False).eval()
        layer = default_token_layer(model)
        with torch.no_grad(), record(model, layer, gradients=False) as rec:
            model(x[None])
        layout = infer_layout(rec.activations[layer].shape, model, x.shape[-2:])
        print(f"{name}: {layer} -> {layout}")
        heat = GradCAM(model, layer, reshape=layout)(x, target=1)
        print(f"  Grad-CAM {tuple(heat.shape)}")
        if "swin" not in name:
            print(f"  Attention Rollout {tuple(AttentionRollout(model)(x).shape)}")
            print(f"  LeGrad {tuple(LeGrad(model)(x, target=1).shape)}")


if __name__ == "__main__":
    main()
