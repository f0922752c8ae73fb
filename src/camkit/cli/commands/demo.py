"""``camkit demo``: the whole pipeline on scikit-image's sample photos, and a summary grid."""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np

from camkit import io, models, viz
from camkit.cli import report
from camkit.cli.arguments import add_command
from camkit.cli.commands import concepts
from camkit.cli.commands.explain import explain
from camkit.cli.common import (
    EXIT_OK,
    check_out_dir,
    load_model,
    match_label,
    pick_device,
    pick_layer,
)
from camkit.cli.pipeline import Job
from camkit.runs.concepts import CONCEPTS_FILE
from camkit.runs.manifest import MANIFEST

DEMO_METHODS = ("gradcam", "gradcam++", "layercam", "eigencam", "guided-gradcam", "lrp")
# what the model sees there: the reference patches of this layer's most relevant channels
CONCEPT_LAYER, CONCEPT_TOP = "blocks.5", 3
# the model's top-1 for the astronaut is a bobsled; --target explains a class of our choice
TARGET_PHOTO, TARGET_CLASS, TARGET_DIR = "astronaut", "space shuttle", "target"
# a clip: a pan across the cat (frames 0-7), then across the coffee (8-15), explained with the
# demo model run on every frame (camkit.models.frame_wise): when each class's evidence is there
CLIP_NAME, CLIP_DIR, CLIP_FPS, CLIP_PAN = "clip.mp4", "clip", 8.0, 8
CLIP_CLASSES = ("tabby", "espresso")
LEGEND = (
    "Each row: a photo and the maps of the class named on the left (the model's top-1 with its "
    "probability; the last row: a class chosen with --target). Red: where the evidence for "
    "that class is; blue: none."
)

SUMMARY = "run the whole pipeline on scikit-image's sample photos"
DESCRIPTION = (
    "Explain five sample photos with "
    f"{', '.join(DEMO_METHODS)}, write the browsable report (OUT/index.html) and a summary "
    f"grid (OUT/summary.png), explain the {TARGET_PHOTO} as a {TARGET_CLASS!r} "
    f"(--target), and find the reference patches of the most relevant channels of "
    f"{CONCEPT_LAYER} (camkit concepts: OUT/concepts.json, the report's concept atlas); then "
    f"a {2 * CLIP_PAN}-frame clip (a pan across the cat, then the coffee) explained per frame "
    f"for {' and '.join(CLIP_CLASSES)}: its animated overlays and per-frame importance."
)


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


def demo_clip(side: int = 224) -> np.ndarray:
    """``(16, side, side, 3)``: a pan across the cat (frames 0-7), then the coffee (8-15)."""
    import cv2

    photos = demo_photos()
    frames = []
    for photo in (photos["chelsea"], photos["coffee"]):
        height, width = photo.shape[:2]
        square = min(height, width)
        for left in np.linspace(0, width - square, CLIP_PAN).round().astype(int):
            crop = photo[(height - square) // 2 :, left : left + square][:square]
            frames.append(cv2.resize(crop, (side, side), interpolation=cv2.INTER_AREA))
    return np.stack(frames)


def moved(record: dict, folder: str) -> dict:
    """A manifest record of a run in ``OUT/folder`` with its files named from ``OUT``."""
    files = ("output", "animation", "frame_plot")
    return record | {key: f"{folder}/{record[key]}" for key in files if record.get(key)}


def run_demo(args: argparse.Namespace) -> int:
    """``camkit demo``: overlays, report, summary grid, --target, concepts and a clip."""
    started = time.perf_counter()
    out = Path(args.out)
    check_out_dir(out)
    device = pick_device("auto")
    loaded = load_model(models.DEFAULT_MODEL, None)
    inputs = out / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    paths = [io.save_png(inputs / f"{name}.png", photo) for name, photo in demo_photos().items()]
    job = Job(DEMO_METHODS, pick_layer(loaded, None, DEMO_METHODS), None, out, device)
    records = explain(loaded, paths, job, argv=args.argv)["records"]
    # the same photo explained for another class: what `--target` does
    astronaut = next(path for path in paths if path.stem == TARGET_PHOTO)
    chosen = match_label(TARGET_CLASS, loaded.labels)
    targeted = dataclasses.replace(job, classes=(chosen,), out=out / TARGET_DIR)
    argv = [str(astronaut), "--target", TARGET_CLASS, "--out", str(targeted.out)]
    extra = explain(loaded, [astronaut], targeted, argv=argv)["records"]
    extra = [moved(record, TARGET_DIR) for record in extra]
    # what it sees there: each channel's reference patches, into the run (the concept atlas)
    from camkit.cli import build_parser  # the parser holds this command: imported on use

    found = ["concepts", str(inputs), "--layer", CONCEPT_LAYER, "--top", str(CONCEPT_TOP)]
    found += ["--out", str(out)]
    parsed = build_parser().parse_args(found)
    parsed.argv = found
    concepts.run_concepts(parsed)
    # when, not only where: a clip explained frame by frame for two classes
    clip = io.video.save_mp4(inputs / CLIP_NAME, demo_clip(), CLIP_FPS)
    per_frame = models.frame_wise(loaded, 2 * CLIP_PAN)
    classes = tuple(match_label(name, loaded.labels) for name in CLIP_CLASSES)
    clip_job = dataclasses.replace(
        job,
        methods=("gradcam",),
        layer=per_frame.default_layer,
        classes=classes,
        out=out / CLIP_DIR,
    )
    argv = [str(clip), "--target", *CLIP_CLASSES, "--out", str(clip_job.out)]
    clip_records = explain(per_frame, [clip], clip_job, argv=argv)["records"]
    clip_records = [moved(record, CLIP_DIR) for record in clip_records]
    shown = records + extra + clip_records
    page = report.write_report(out, shown, title="camkit demo", colormap=job.colormap)

    rows = []
    for path in paths:
        mine = [record for record in records if record["image"] == str(path)]
        best = mine[0]["top5"][0]
        title = f"{path.stem}\n{best['label']} ({percent(best['probability'])})"
        print(f"{path.stem:<12} top-1: {best['label']} ({percent(best['probability'])})")
        rows.append(
            (title, [io.read_image(path), *(io.read_image(out / r["output"]) for r in mine)])
        )
    first = extra[0]
    title = f"{TARGET_PHOTO}, --target\n{first['label']} ({percent(first['probability'])})"
    print(f"{TARGET_PHOTO:<12} --target {TARGET_CLASS!r} ({percent(first['probability'])})")
    overlays = [io.read_image(out / record["output"]) for record in extra]
    rows.append((title, [io.read_image(astronaut), *overlays]))
    grid = viz.picture_grid(rows, ["photo", *DEMO_METHODS], colormap=job.colormap, legend=LEGEND)
    summary = io.save_png(out / "summary.png", grid)
    print(f"inputs:    {inputs}/")
    print(f"overlays:  {out}/<photo>_<method>_<class>.{job.format} ({len(records)} files)")
    print(f"--target:  {targeted.out}/ ({TARGET_PHOTO} as {first['label']!r})")
    print(f"manifest:  {out / MANIFEST}")
    print(f"concepts:  {out / CONCEPTS_FILE} (reference patches of {CONCEPT_LAYER}'s channels)")
    for record in clip_records:
        shares = np.array(record["frame_importance"])
        cat, coffee = percent(shares[:CLIP_PAN].sum()), percent(shares[CLIP_PAN:].sum())
        print(
            f"{CLIP_NAME:<12} {record['label']!r}: {cat} of the map on the cat's frames "
            f"(0-{CLIP_PAN - 1}), {coffee} on the coffee's; {CLIP_DIR}/ has the animations"
        )
    print(f"summary:   {summary}")
    print(f"done in {time.perf_counter() - started:.1f} s on {device}")
    print(f"look at:   {page} (open it in a browser: every overlay, by photo, method and class)")
    return EXIT_OK


def percent(probability: float) -> str:
    """``0.77`` -> ``77%``; a small one keeps two significant digits: ``0.00045`` -> ``0.045%``."""
    return f"{probability:.0%}" if probability >= 0.01 else f"{probability * 100:.2g}%"


def add_parser(commands: argparse._SubParsersAction) -> None:
    """The ``demo`` subcommand."""
    demo = add_command(commands, "demo", run_demo, SUMMARY, DESCRIPTION)
    demo.add_argument(
        "--out", default="camkit-demo", metavar="DIR", help="output folder (default camkit-demo)"
    )
