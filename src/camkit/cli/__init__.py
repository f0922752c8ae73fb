"""The ``camkit`` command (explain, evaluate, strategies, concepts, layers, demo, serve): the
subcommands parse arguments, find and batch files, write the outputs and the manifest, and choose
exit codes; every map, overlay and model comes from the library.

Exit status: 0 all written, 1 some images could not be read (the others are written),
2 a usage error (bad flag, unknown model/method/layer/class, missing path), 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence
from typing import NoReturn, TextIO

import torch

import camkit
from camkit.cli.commands import concepts, demo, evaluate, explain, layers, serve, strategies
from camkit.cli.common import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, EXIT_USAGE, UsageError
from camkit.errors import RunFileError


class Parser(argparse.ArgumentParser):
    """argparse's parser (the subcommands' too) whose errors are one line and a hint."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("the following arguments are required"):
            self.print_usage(sys.stderr)
        hint = f"\n('{self.prog} --help' lists the options)" if self.add_help else ""
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}{hint}\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``camkit`` parser with its subcommands."""
    parser = Parser(
        prog="camkit",
        description="Show where a PyTorch vision model looks: class activation maps and "
        "pixel attributions as heatmap overlays.",
        epilog="run 'camkit COMMAND --help' for a command's options; 'camkit demo' to try it",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"camkit {camkit.__version__} (torch {torch.__version__})",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in (explain, evaluate, strategies, concepts, layers, demo, serve):
        command.add_parser(commands)
    return parser


def one_line_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """A warning as one line on stderr: ``camkit: warning: Category: message``."""
    text = " ".join(str(message).split())
    print(f"camkit: warning: {category.__name__}: {text}", file=file or sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``camkit`` command; return its exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = one_line_warning
            return args.run(args)
    except (UsageError, RunFileError) as error:  # RunFileError: a broken file of the run
        print(f"camkit {args.command}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("camkit: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `camkit layers | head`: stop quietly, as other tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
