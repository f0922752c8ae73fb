"""``camkit serve``: the interactive explorer on images, folders or a ``camkit explain`` run."""

from __future__ import annotations

import argparse
import atexit
import shutil
import sys
import tempfile
from pathlib import Path

from camkit import io
from camkit.cli.common import (
    EXIT_OK,
    UsageError,
    add_command,
    add_crop_argument,
    add_device_argument,
    add_model_arguments,
    load_model,
    pick_device,
)
from camkit.cli.manifest import MANIFEST

SUMMARY = "explore a model's maps live in the browser"
DESCRIPTION = (
    "Serve an interactive explorer: a gallery with predictions, and maps of any "
    "class, method, layer and checkpoint computed on demand. Needs the optional web stack: "
    "pip install 'camkit[serve]'."
)


def demo_folder() -> Path:
    """scikit-image's sample photos written to a temporary folder (removed at exit)."""
    from camkit.cli.demo import demo_photos

    folder = Path(tempfile.mkdtemp(prefix="camkit-serve-demo-"))
    atexit.register(shutil.rmtree, folder, True)
    for name, photo in demo_photos().items():
        io.save_png(folder / f"{name}.png", photo)
    return folder


def build(args: argparse.Namespace):
    """The app and its URL from the parsed arguments (everything but listening)."""
    from camkit.serve import security, web_stack_missing

    missing = web_stack_missing()
    if missing:
        raise UsageError(missing)
    from camkit.serve.app import create_app
    from camkit.serve.explorer import Explorer
    from camkit.serve.gallery import read_run, read_strategies, scan

    token = security.new_token() if args.token is None else args.token
    try:
        security.check_bind(args.host, token)
    except security.SecurityError as error:
        raise UsageError(str(error)) from None
    paths = [demo_folder()] if args.demo else [Path(p) for p in args.paths]
    if not paths:
        raise UsageError("give images, folders or a camkit explain run folder, or --demo")
    for path in paths:
        if not path.exists():
            raise UsageError(f"no such file or directory: {path}")
    run_root, header, predictions, strategies = None, None, {}, None
    crop = args.crop
    if len(paths) == 1 and (paths[0] / MANIFEST).is_file():
        run_root = paths[0].resolve()
        entries, header, predictions = read_run(run_root)
        strategies = read_strategies(run_root, entries)
        # the run's own preprocessing unless --crop says otherwise (runs before --crop squashed)
        run_crop = (header.get("settings") or {}).get("crop", "squash")
        crop = crop or run_crop
        made_by = (header.get("model"), header.get("weights_sha256"), run_crop)
        if made_by != (args.model, sha(args.weights), crop):
            predictions = {}  # made by another model or preprocessing: predict again
        header = {key: header.get(key) for key in ("model", "settings", "started", "camkit")}
    else:
        entries, _ = scan(paths)
    if not entries:
        raise UsageError(f"no images found in {', '.join(map(str, paths))}")
    device = pick_device(args.device)
    checkpoints = {"a": load_model(args.model, args.weights, crop)}
    if args.compare_weights:
        checkpoints["b"] = load_model(args.model, args.compare_weights, crop)
    for loaded in checkpoints.values():
        loaded.model.to(device)
    explorer = Explorer(checkpoints, entries, predictions=predictions, device=device)
    app = create_app(
        explorer,
        token=token or None,
        run_root=run_root,
        run_header=header,
        strategies=strategies,
        hosts=security.allowed_hosts(args.host),
        background=True,
    )
    host = f"[{args.host}]" if ":" in args.host else args.host
    url = f"http://{host}:{args.port}/" + (f"?token={token}" if token else "")
    return app, url, len(entries)


def sha(weights: str | None) -> str | None:
    from camkit.cli.manifest import sha256

    return sha256(weights)


def run_serve(args: argparse.Namespace) -> int:
    """``camkit serve``: build the app, print its URL and serve until interrupted."""
    app, url, count = build(args)
    import uvicorn

    print(f"camkit serve: {count} images; open {url}", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
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
