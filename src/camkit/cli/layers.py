"""``camkit layers``: every layer call of a model with its output shape, and the default layer."""

from __future__ import annotations

import argparse
import sys

from camkit import models
from camkit.cli.common import EXIT_OK, UsageError, add_model_arguments, load_model, positive_int
from camkit.errors import CamkitError


def run_layers(args: argparse.Namespace) -> int:
    """``camkit layers``: every module call with its output shape; ``*`` marks the default layer."""
    loaded = load_model(args.model, args.weights)
    size = loaded.input_size if args.input_size is None else (args.input_size, args.input_size)
    try:
        rows = models.layer_shapes(loaded.model, size)
    except RuntimeError as error:
        raise UsageError(
            f"--input-size {size[0]}x{size[1]} does not fit the model: {error}"
        ) from None
    try:
        default = models.default_layer(loaded.model, size)
    except CamkitError as error:
        default = None
        print(f"camkit: no default CAM layer: {error}", file=sys.stderr)
    name_width = max(len("layer"), *(len(name) for name, _, _ in rows))
    type_width = max(len("type"), *(len(kind) for _, kind, _ in rows))
    print(f"{loaded.name}, input {size[0]}x{size[1]}: {len(rows)} layer calls")
    print(f"  {'layer':<{name_width}}  {'type':<{type_width}}  output shape")
    for name, kind, shape in rows:
        mark = "*" if name == default else " "
        print(f"{mark} {name:<{name_width}}  {kind:<{type_width}}  {tuple(shape)}")
    if default is not None:
        print(f"* default CAM layer (used when --layer is not given): {default}")
    return EXIT_OK


def add_parser(commands: argparse._SubParsersAction) -> None:
    """The ``layers`` subcommand."""
    layers = commands.add_parser(
        "layers",
        help="list a model's layers and output shapes",
        description="List every layer call with its type and output shape; '*' marks the "
        "layer CAMs use by default.",
    )
    add_model_arguments(layers)
    layers.add_argument(
        "--input-size",
        type=positive_int,
        metavar="N",
        help="square input side (default: the model's input size)",
    )
    layers.set_defaults(run=run_layers)
