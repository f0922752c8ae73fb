"""``camkit layers``: every layer call of a model with its output shape, and the default layer."""

from __future__ import annotations

import argparse
import sys

from camkit.cli.common import (
    EXIT_OK,
    UsageError,
    add_command,
    add_model_arguments,
    load_model,
    positive_int,
)
from camkit.core.trace import last_spatial_map, trace
from camkit.errors import CamkitError

SUMMARY = "list a model's layers and output shapes"
DESCRIPTION = (
    "List every layer call with its type and output shape; '*' marks the layer CAMs use by default."
)


def run_layers(args: argparse.Namespace) -> int:
    """``camkit layers``: every module call with its output shape; ``*`` marks the default layer,
    and a layer that cannot be explained says why."""
    loaded = load_model(args.model, args.weights, args.labels)
    size = loaded.input_size if args.input_size is None else (args.input_size, args.input_size)
    try:
        calls, _ = trace(loaded.model, size)
    except CamkitError as error:
        raise UsageError(
            f"--input-size {size[0]}x{size[1]} does not fit the model: {error}"
        ) from None
    try:
        default = last_spatial_map(calls, loaded.model, size)
    except CamkitError as error:
        default = None
        print(f"camkit: no default CAM layer: {error}", file=sys.stderr)
    calls.sort(key=lambda call: call.started)
    name_width = max(len("layer"), *(len(call.name) for call in calls))
    type_width = max(len("type"), *(len(call.type_name) for call in calls))
    print(f"{loaded.name}, input {size[0]}x{size[1]}: {len(calls)} layer calls")
    print(f"  {'layer':<{name_width}}  {'type':<{type_width}}  output shape")
    for call in calls:
        mark = "*" if call.name == default else " "
        note = f"  (not explainable: {call.skip})" if call.skip else ""
        print(
            f"{mark} {call.name:<{name_width}}  {call.type_name:<{type_width}}  {call.shape}{note}"
        )
    if default is not None:
        print(f"* default CAM layer (used when --layer is not given): {default}")
    return EXIT_OK


def add_parser(commands: argparse._SubParsersAction) -> None:
    """The ``layers`` subcommand."""
    layers = add_command(commands, "layers", run_layers, SUMMARY, DESCRIPTION)
    add_model_arguments(layers)
    layers.add_argument(
        "--input-size",
        type=positive_int,
        metavar="N",
        help="square input side (default: the model's input size)",
    )
