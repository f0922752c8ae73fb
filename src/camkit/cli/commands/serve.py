"""``camkit serve``: the interactive explorer on images, folders or a ``camkit explain`` run."""

from __future__ import annotations

import argparse
import atexit
import shutil
import tempfile
from pathlib import Path

from camkit import io
from camkit.cli.arguments import (
    add_command,
    add_crop_argument,
    add_device_argument,
    add_max_pixels_argument,
    add_model_arguments,
)
from camkit.cli.common import EXIT_OK, UsageError, load_model, pick_device
from camkit.cli.vlm import load_hf
from camkit.errors import CamkitError
from camkit.models.vlm import HF_PREFIX

SUMMARY = "explore a model's maps live in the browser"
DESCRIPTION = (
    "Serve an interactive explorer: a gallery with predictions, and maps of any "
    "class, method, layer and checkpoint computed on demand. Needs the optional web stack: "
    "pip install 'camkit[serve]'."
)


def demo_folder() -> Path:
    """scikit-image's sample photos written to a temporary folder (removed at exit)."""
    from camkit.cli.commands.demo import demo_photos

    folder = Path(tempfile.mkdtemp(prefix="camkit-serve-demo-"))
    atexit.register(shutil.rmtree, folder, True)
    for name, photo in demo_photos().items():
        io.save_png(folder / f"{name}.png", photo)
    return folder


def build(args: argparse.Namespace):
    """The prepared app (:class:`camkit.serve.launch.Prepared`), not yet listening."""
    from camkit.serve import web_stack_missing

    missing = web_stack_missing()
    if missing:
        raise UsageError(missing)
    from camkit.serve.launch import check_start, checkpoint_names, prepare, run_crop

    paths = [demo_folder()] if args.demo else [Path(p) for p in args.paths]
    try:
        token = check_start(paths, args.host, args.token)  # before any model is loaded
        device = pick_device(args.device)
        crop = args.crop or run_crop(paths)  # a run folder's own preprocessing by default
        vlm, checkpoints = None, {}
        if args.model.startswith(HF_PREFIX):  # loaded as camkit explain loads it
            if args.weights or args.compare_weights:
                option = "--weights" if args.weights else "--compare-weights"
                raise UsageError(f"{option}: an hf: folder holds its own weights")
            vlm = load_hf(args.model)  # prepare shows its image side
            vlm.model.to(device)
        else:
            checkpoints["a"] = load_model(args.model, args.weights, args.labels, crop=crop)
        if args.compare_weights:
            checkpoints["b"] = load_model(args.model, args.compare_weights, args.labels, crop=crop)
        for loaded in checkpoints.values():
            loaded.model.to(device)
        return prepare(
            paths,
            checkpoints,
            model=args.model,
            weights=args.weights,
            device=device,
            host=args.host,
            token=token,
            names=checkpoint_names(
                args.model, [args.weights, args.compare_weights][: len(checkpoints)]
            ),
            max_pixels=args.max_pixels,
            vlm=vlm,
        )
    except CamkitError as error:
        raise UsageError(str(error)) from None


def run_serve(args: argparse.Namespace) -> int:
    """``camkit serve``: build, bind (a busy port: exit 2 before any URL), serve until stopped."""
    prepared = build(args)
    from camkit.serve.launch import listen

    try:
        listen(prepared, args.host, args.port)
    except CamkitError as error:
        raise UsageError(str(error)) from None
    return EXIT_OK


def add_parser(commands: argparse._SubParsersAction) -> None:
    """The ``serve`` subcommand."""
    serve = add_command(commands, "serve", run_serve, SUMMARY, DESCRIPTION)
    serve.add_argument(
        "paths",
        nargs="*",
        metavar="IMAGES_OR_RUN_DIR",
        help="image files, folders (root/<class>/<image> gives true classes) or a camkit "
        "explain output folder (its manifest's predictions and maps are reused)",
    )
    serve.add_argument("--demo", action="store_true", help="scikit-image's sample photos")
    add_model_arguments(serve)
    add_crop_argument(serve)
    serve.add_argument(
        "--compare-weights",
        metavar="PATH",
        help="a second state dict for --model: its maps are shown beside the first's",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (8000)")
    serve.add_argument(
        "--token",
        default=None,
        help="the API token (default: a random one, printed in the URL); '' turns it off, "
        "which is refused on any address but loopback",
    )
    add_device_argument(serve)
    add_max_pixels_argument(serve, "images (the folders' files and uploads alike)")
