"""``camkit layers``: every layer call of a model with its output shape, and the default layer."""

from __future__ import annotations

import argparse
import fnmatch
import sys

from camkit.cli.arguments import add_command, add_model_arguments, positive_int
from camkit.cli.common import EXIT_OK, UsageError, load_model
from camkit.core.trace import last_spatial_map, trace
from camkit.errors import CamkitError

SUMMARY = "list a model's layers and output shapes"
DESCRIPTION = (
    "List every layer call with its type and output shape; the default CAM layer first, and "
    "'*' marks it in the list. --match and --explainable narrow the list."
)


def run_layers(args: argparse.Namespace) -> int:
    """``camkit layers``: every layer call and its output shape, the default marked."""
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
    total = len(calls)
    if args.match is not None:
        calls = [call for call in calls if matches(call.name, args.match)]
    if args.explainable:
        calls = [call for call in calls if call.unreadable is None]
    if not calls:
        what = [f"--match {args.match!r}"] if args.match is not None else []
        what += ["--explainable"] if args.explainable else []
        raise UsageError(
            f"no layer of {total} fits {' '.join(what)}; 'camkit layers' without it lists them all"
        )
    print(f"{loaded.name}, input {size[0]}x{size[1]}: {total} layer calls", end="")
    print(f", {len(calls)} shown" if len(calls) != total else "")
    if default is not None:
        print(f"* default CAM layer (used when --layer is not given): {default}")
    name_width = max(len("layer"), *(len(call.name) for call in calls))
    type_width = max(len("type"), *(len(call.type_name) for call in calls))
    print(f"  {'layer':<{name_width}}  {'type':<{type_width}}  output shape")
    for call in calls:
        mark = "*" if call.name == default else " "
        note = f"  (not explainable: {call.unreadable})" if call.unreadable else ""
        print(
            f"{mark} {call.name:<{name_width}}  {call.type_name:<{type_width}}  {call.shape}{note}"
        )
    return EXIT_OK


def matches(name: str, pattern: str) -> bool:
    """``--match``: a glob when the pattern has ``*?[``, else a part; case-insensitive."""
    name, pattern = name.lower(), pattern.lower()
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return pattern in name


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
    layers.add_argument(
        "--match",
        metavar="TEXT",
        help="only layers whose name contains TEXT, or matches it as a glob ('layer4.*')",
    )
    layers.add_argument(
        "--explainable",
        action="store_true",
        help="only layers a CAM can read (not those marked 'not explainable': the layers "
        "--layer refuses)",
    )
