"""The command-line options several subcommands share, written once: the model, the crop, the
device, and how a dataset command decodes images and reports progress."""

from __future__ import annotations

import argparse

from camkit import models


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model`` and ``--weights``."""
    parser.add_argument(
        "--model",
        default=models.DEFAULT_MODEL,
        help=f"{models.DEFAULT_MODEL} (default; ImageNet weights installed with camkit), "
        "torchvision:NAME or timm:NAME (e.g. torchvision:resnet50, timm:convnext_tiny), or "
        "a checkpoint file that names its architecture ('arch'); nothing is downloaded",
    )
    parser.add_argument(
        "--weights",
        metavar="PATH",
        help="state dict for --model (.pt/.pth via torch.load(weights_only=True), or "
        ".safetensors); without it a torchvision/timm model has random weights",
    )
    parser.add_argument(
        "--labels",
        metavar="FILE",
        help="class names: one per line, or a JSON list or {index: name}; default: the names "
        "the checkpoint carries ('labels'/'classes', HuggingFace id2label), else ImageNet's "
        "for 1000 classes, else 'class N'",
    )


def add_crop_argument(parser: argparse.ArgumentParser) -> None:
    """``--crop``: how a photo becomes the model's input, the same in every command."""
    parser.add_argument(
        "--crop",
        choices=models.CROPS,
        help="how a photo becomes the model's input: center (crop the centre, the usual "
        "evaluation transform), squash (resize, changing the aspect ratio) or pad (the whole "
        "photo, letterboxed); default: the model's own transform (center for the packaged "
        "model). Full-size overlays show the part the model did not see dimmed",
    )


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """``--device``, read by :func:`pick_device`."""
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto (default): cuda when available, else cpu",
    )


def add_loader_arguments(parser: argparse.ArgumentParser) -> None:
    """``--workers`` and ``--quiet``: how a dataset command decodes images and reports progress."""
    parser.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="DataLoader processes decoding images (default: cores - 1, at most 4; 0: none)",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress (a bar on a terminal, a line every few seconds in a log)",
    )


__all__ = [
    "add_crop_argument",
    "add_device_argument",
    "add_loader_arguments",
    "add_model_arguments",
]
