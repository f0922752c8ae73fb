"""Conservation and faithfulness of LRP composites on the packaged model and a zoo.

    python benchmarks/conservation.py [--zoo resnet50,mobilenet_v3_large,...] [--steps 10]
                                      [--out benchmarks/CONSERVATION.md]

For each model and composite: the share of the target score (the top-1 logit) that reaches the
input (median, min and max over the photos; ``camkit.relevance.Conservation``), the step that
loses most, and the deletion / insertion AUCs (Petsiuk et al., BMVC 2018; blur baseline,
``--steps`` steps) of the positive relevance summed over the channels.

The packaged model (EfficientNet-Lite0, ImageNet weights) sees the five photos of ``camkit
demo`` at 224 px. The zoo (torchvision architectures, random weights, nothing downloaded) sees
the same photos at ``--size`` px; every BatchNorm gets a random affine part (weight 1 + 0.2 N,
bias 0.2 N) and running statistics measured on those photos (a forward in training mode with a
cumulative average), so that the merged BatchNorms are not the identity; the ViT's head (zero at
torchvision's initialisation) gets random weights (std 0.02). One thread.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from pathlib import Path

import torch
import torchvision
from torch import nn

from camkit import LRP, models
from camkit.cli.commands.demo import demo_photos
from camkit.metrics import deletion, insertion
from camkit.relevance import composite

STAGES = {  # the layers whose shares locate the loss (the output of every few blocks)
    "efficientnet_lite0": ["blocks.0", "blocks.2", "blocks.4", "blocks.6"],
    "resnet50": ["layer1", "layer2", "layer3", "layer4"],
    "mobilenet_v3_large": ["features.1", "features.4", "features.7", "features.13"],
    "efficientnet_b0": ["features.1", "features.3", "features.5", "features.7"],
    "convnext_tiny": ["features.1", "features.3", "features.5", "features.7"],
    "vit_b_16": ["encoder.layers.encoder_layer_0", "encoder.layers.encoder_layer_6"],
    "swin_t": ["features.1", "features.3", "features.5", "features.7"],
}
ZOO = ("resnet50", "mobilenet_v3_large", "efficientnet_b0", "convnext_tiny", "vit_b_16", "swin_t")
COMPOSITES = {
    "epsilon-plus-flat": {},
    "epsilon-plus-flat, zero_params=bias": {"zero_params": "bias"},
    "epsilon-plus-flat, zero_params=bias, gates=constant": {
        "zero_params": "bias",
        "gates": "constant",
    },
    "epsilon-plus-flat-nobias (default: zero_params=bias, gates=constant, bias_units=bias)": {},
    "epsilon-plus-flat, no canonizer": {"canonizers": []},
    "epsilon-alpha2-beta1-flat, zero_params=bias": {"zero_params": "bias"},
}


def _zoo_model(arch: str, batch: torch.Tensor) -> nn.Module:
    torch.manual_seed(0)
    options = {"image_size": batch.shape[-1]} if arch.startswith("vit") else {}
    model = getattr(torchvision.models, arch)(weights=None, **options)
    if arch.startswith("vit"):  # torchvision starts the ViT's head at zero: every score 0
        nn.init.normal_(model.heads.head.weight, std=0.02)
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for bn in norms:
            bn.weight.copy_(1 + 0.2 * torch.randn(bn.weight.shape, generator=generator))
            bn.bias.copy_(0.2 * torch.randn(bn.bias.shape, generator=generator))
            bn.reset_running_stats()
            bn.momentum = None  # a cumulative average over the calibration forward
        model.train()
        model(batch)
    return model.eval()


def _cases(args: argparse.Namespace):
    photos = list(demo_photos().values())
    if not args.skip_packaged:
        loaded = models.load(models.DEFAULT_MODEL)
        batch = torch.stack([loaded.preprocess(p) for p in photos])
        yield "efficientnet_lite0 (packaged, 224 px)", loaded.model, batch, "efficientnet_lite0"
    prep = models.Preprocess(args.size)
    batch = torch.stack([prep(p) for p in photos])
    for arch in args.zoo:
        yield f"{arch} (random, {args.size} px)", _zoo_model(arch, batch), batch, arch


def _measure(model: nn.Module, x: torch.Tensor, name: str, steps: int, stages: list) -> dict:
    options = dict(COMPOSITES[name])
    base = name.split(",")[0].split(" ")[0]
    lrp = LRP(model, composite=composite(base, **options), layers=stages, tolerance=None)
    started = time.perf_counter()
    try:
        with torch.no_grad():
            target = model(x).argmax(1)
        relevance = lrp(x, target)
    except Exception as error:  # noqa: BLE001 - the table reports what refused
        return {"error": f"{type(error).__name__}: {str(error)[:90]}"}
    seconds = time.perf_counter() - started
    shares = lrp.conservation.input[:, 0].tolist()
    lossiest = lrp.conservation.lossiest()
    heat = relevance.sum(1).clamp(min=0)
    opts = {"steps": steps, "batch_size": 32}
    return {
        "shares": shares,
        "lost": lossiest,
        "deletion": float(deletion(model, x, heat, target, **opts).mean()),
        "insertion": float(insertion(model, x, heat, target, **opts).mean()),
        "seconds": seconds,
    }


def _row(model_name: str, name: str, found: dict) -> str:
    if "error" in found:
        return f"| {model_name} | {name} | refused: {found['error']} | | | |"
    shares = found["shares"]
    ok = all(0.5 <= s <= 1.5 for s in shares)
    share = (
        f"{statistics.median(shares):.3g} [{min(shares):.3g}, {max(shares):.3g}]"
        f"{' ✓' if ok else ''}"
    )
    above, stage, lost = found["lost"][shares.index(min(shares))][0]
    return (
        f"| {model_name} | {name} | {share} | {above} → {stage} ({lost:.2g}) | "
        f"{found['deletion']:.3f} | {found['insertion']:.3f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--zoo", type=lambda s: [a for a in s.split(",") if a], default=ZOO)
    parser.add_argument("--size", type=int, default=112)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--composites", type=lambda s: s.split(";"), default=list(COMPOSITES))
    parser.add_argument("--skip-packaged", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("CONSERVATION.md"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    rows = []
    for model_name, model, x, arch in _cases(args):
        for name in args.composites:
            found = _measure(model, x, name, args.steps, STAGES[arch])
            rows.append(_row(model_name, name, found))
            print(rows[-1], flush=True)
    header = (
        "| model | composite | input share: median [min, max] over the photos (✓: all in "
        "[0.5, 1.5]) | loses most (worst photo) | deletion AUC ↓ | insertion AUC ↑ |\n"
        "| --- | --- | --- | --- | --- | --- |"
    )
    args.out.write_text(
        "# LRP conservation and faithfulness per composite\n\n"
        "Written by `benchmarks/conservation.py` (see its docstring for the set-up; one thread, "
        f"zoo at {args.size} px, {args.steps} deletion/insertion steps).\n\n"
        + header
        + "\n"
        + "\n".join(rows)
        + "\n"
    )


if __name__ == "__main__":
    main()
