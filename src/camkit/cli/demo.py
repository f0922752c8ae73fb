"""``camkit demo``: the whole pipeline on scikit-image's sample photos, and a summary grid."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from camkit import io, models, viz
from camkit.cli.common import EXIT_OK, check_out_dir, load_model, pick_device, pick_layer
from camkit.cli.explain import explain
from camkit.cli.pipeline import Job

DEMO_METHODS = ("gradcam", "gradcam++", "layercam", "eigencam", "guided-gradcam")


def demo_photos() -> dict[str, np.ndarray]:
    """The sample photos shipped with scikit-image, by name."""
    from skimage import data

    return {
        "chelsea": data.chelsea(),
        "coffee": data.coffee(),
        "astronaut": data.astronaut(),
        "rocket": data.rocket(),
        "motorcycle": data.stereo_motorcycle()[0],
    }


def run_demo(args: argparse.Namespace) -> int:
    """``camkit demo``: the whole pipeline on scikit-image's sample photos, and a summary grid."""
    started = time.perf_counter()
    out = Path(args.out)
    check_out_dir(out)
    device = pick_device("auto")
    loaded = load_model(models.DEFAULT_MODEL, None)
    inputs = out / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    paths = [io.save_png(inputs / f"{name}.png", photo) for name, photo in demo_photos().items()]
    job = Job(
        methods=DEMO_METHODS,
        layer=pick_layer(loaded, None, DEMO_METHODS),
        classes=None,
        out=out,
        device=device,
    )
    records = explain(loaded, paths, job, argv=args.argv)["records"]
    rows = []
    for path in paths:
        mine = [record for record in records if record["image"] == str(path)]
        best = mine[0]["top5"][0]
        title = f"{path.stem}\n{best['label']} ({best['probability']:.0%})"
        print(f"{path.stem:<12} top-1: {best['label']} ({best['probability']:.0%})")
        overlays = [io.read_image(out / record["output"]) for record in mine]
        rows.append((title, [io.read_image(path), *overlays]))
    summary = io.save_png(out / "summary.png", viz.picture_grid(rows, ["photo", *DEMO_METHODS]))
    print(f"inputs:    {inputs}/")
    print(f"overlays:  {out}/<photo>_<method>_<class>.png ({len(records)} files)")
    print(f"manifest:  {out / 'manifest.json'}")
    print(f"summary:   {summary}")
    print(f"done in {time.perf_counter() - started:.1f} s on {device}")
    return EXIT_OK


def add_parser(commands: argparse._SubParsersAction) -> None:
    """The ``demo`` subcommand."""
    demo = commands.add_parser(
        "demo",
        help="run the whole pipeline on scikit-image's sample photos",
        description="Explain five sample photos with "
        f"{', '.join(DEMO_METHODS)} and draw a summary grid.",
    )
    demo.add_argument(
        "--out", default="camkit-demo", metavar="DIR", help="output folder (default camkit-demo)"
    )
    demo.set_defaults(run=run_demo)
