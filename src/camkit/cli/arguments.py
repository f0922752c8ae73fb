"""The options the commands share (model, crop, composite, device, the run options of ``explain``
and ``evaluate``), their value checks, and :func:`add_command`, which sets up a subcommand."""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Callable

from camkit import io, models, registry
from camkit.cli.common import BATCH_SIZE
from camkit.cli.files import SUFFIXES_SHOWN
from camkit.relevance.composites import COMPOSITES, DEFAULT_COMPOSITE

FAMILY_TITLES = {
    "gradient-cam": "CAM family (one forward and backward pass)",
    "perturbation-cam": "perturbation (slow: one forward pass per channel of the layer)",
    "pixel": "pixel attributions (the overlay shows max |attribution| over RGB)",
    "attention": "attention maps (vision transformers: read the attention itself)",
}


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def pixel_limit(text: str) -> int | None:
    """``--max-pixels``: a count of pixels; 0 (no limit) is read as None."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of pixels (0: no limit), got {text}")
    return value or None


def unit_float(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {text}")
    return value


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model`` and ``--weights``."""
    parser.add_argument(
        "--model",
        default=models.DEFAULT_MODEL,
        help=f"{models.DEFAULT_MODEL} (default; ImageNet weights installed with camkit), "
        "torchvision:NAME or timm:NAME (e.g. torchvision:resnet50, timm:convnext_tiny), or "
        "a checkpoint file that names its architecture ('arch'), or (camkit explain --prompt) "
        "hf:FOLDER, a local HuggingFace vision-language model; nothing is downloaded",
    )
    parser.add_argument(
        "--weights",
        metavar="PATH",
        help="state dict for --model (.pt/.pth via torch.load(weights_only=True), or "
        ".safetensors); without it a torchvision/timm model has random weights",
    )
    add_labels_argument(
        parser,
        "the names the checkpoint carries ('labels'/'classes', HuggingFace id2label), else "
        "ImageNet's for 1000 classes, else 'class N'",
    )


def add_labels_argument(parser: argparse.ArgumentParser, default: str) -> None:
    """``--labels FILE``: the class names, the same format in every command."""
    parser.add_argument(
        "--labels",
        metavar="FILE",
        help=f"class names: one per line, or a JSON list or {{index: name}}; default: {default}",
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


def add_composite_argument(
    parser: argparse.ArgumentParser, *, what: str, default: str = DEFAULT_COMPOSITE
) -> None:
    """``--composite``: the LRP composite, one spelling in every command."""
    parser.add_argument(
        "--composite",
        choices=COMPOSITES,
        default=default,
        help=f"the LRP composite {what} (default %(default)s; docs/relevance.md says which "
        "to choose)",
    )


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """``--device``, read by :func:`pick_device`."""
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto (default): cuda when available, else cpu",
    )


def add_max_pixels_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """``--max-pixels``, read by :func:`pixel_limit` (``what``: which images it refuses)."""
    parser.add_argument(
        "--max-pixels",
        type=pixel_limit,
        default=io.MAX_PIXELS,
        metavar="N",
        help=f"refuse {what} of more pixels, before decoding (default %(default)s, Pillow's "
        "limit; 0: no limit)",
    )


def add_loader_arguments(parser: argparse.ArgumentParser) -> None:
    """``--workers`` and ``--quiet``: how a dataset command decodes images and reports progress."""
    parser.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="DataLoader processes decoding images or video clips (default: cores - 1, at "
        "most 4; 0: none)",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress (a bar on a terminal, a line every few seconds in a log)",
    )


def add_run_arguments(parser: argparse.ArgumentParser, *, what: str) -> None:
    """The options ``explain`` and ``evaluate`` share: same names, same defaults, same meaning.
    ``what`` names, in the help, what the command does with each image."""
    parser.add_argument(
        "images",
        nargs="+",
        metavar="IMAGE_OR_DIR",
        help=f"image files, or directories whose image files ({SUFFIXES_SHOWN}; not in "
        f"subdirectories) are all {what}",
    )
    add_model_arguments(parser)
    add_crop_argument(parser)
    add_composite_argument(parser, what="of --method lrp")
    parser.add_argument(
        "--layer",
        metavar="NAME",
        help="layer the CAM methods read (dotted name, see 'camkit layers'); default: the "
        "model's default layer, the one 'camkit layers' marks",
    )
    parser.add_argument(
        "--method",
        "--methods",
        dest="method",
        default="gradcam",
        metavar="NAME[,NAME...]",
        help="method, or several comma-separated (default %(default)s); see the list below",
    )
    parser.add_argument(
        "--target",
        default="top1",
        help="top1 (default: each image's predicted class), class indices INT[,INT...] "
        "(one map per class), or a class name (e.g. 'tiger cat'; a unique part is enough)",
    )
    parser.add_argument(
        "--out", default="camkit-out", metavar="DIR", help="output folder (default %(default)s)"
    )
    parser.add_argument(
        "--images-per-batch",
        type=positive_int,
        default=8,
        metavar="N",
        help="images decoded and explained together (default %(default)s)",
    )
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=BATCH_SIZE,
        metavar="N",
        help="rows per forward pass wherever camkit runs many copies of an image (Score-CAM, "
        "Ablation-CAM, SmoothGrad, IG, the metrics; default %(default)s): the memory knob, "
        "results do not depend on it",
    )
    add_device_argument(parser)
    add_max_pixels_argument(parser, "images")
    add_loader_arguments(parser)


def add_command(
    commands: argparse._SubParsersAction,
    name: str,
    run: Callable[[argparse.Namespace], int],
    summary: str,
    description: str,
    epilog: str | None = None,
) -> argparse.ArgumentParser:
    """The subcommand ``name``, run by ``run(args)`` -> its parser; with an ``epilog``, the
    description and epilog are shown as written, else the description is wrapped."""
    parser = commands.add_parser(
        name,
        help=summary,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter if epilog else argparse.HelpFormatter,
    )
    parser.set_defaults(run=run)
    return parser


def methods_help() -> str:
    """Every registered method by family, for a command's ``--help``."""
    families = dict.fromkeys([*FAMILY_TITLES, *(m.family for m in registry.METHODS.values())])
    lines = ["methods:"]
    for family in families:
        if registry.names(family):
            lines.append(f"  {FAMILY_TITLES.get(family, family)}:")
            wrapped = textwrap.wrap(", ".join(registry.names(family)), 92, break_on_hyphens=False)
            lines.extend(f"    {line}" for line in wrapped)
    return "\n".join(lines)
