"""``camkit explain``: the command line, the run across ranks (resume, merge), the summary; the
work of one rank is :mod:`camkit.cli.pipeline`."""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

from camkit import io, models
from camkit.cli import report, results, vlm
from camkit.cli.arguments import (
    add_command,
    add_run_arguments,
    methods_help,
    positive_int,
    unit_float,
)
from camkit.cli.common import (
    EXIT_OK,
    UsageError,
    check_colormap,
    check_run_inputs,
    exit_status,
    load_run_model,
    wants_report,
)
from camkit.cli.pipeline import Job, build_explainers, explain_files, loader_workers
from camkit.cli.ranks import Ranks
from camkit.cli.video import explain_videos
from camkit.cli.video_windows import WINDOWS
from camkit.errors import LayerOutputError
from camkit.models.vlm import HF_PREFIX
from camkit.runs import maps as mapstore
from camkit.runs.manifest import MANIFEST, PARTS, consolidate, header, merge, read, sha256

SUMMARY = "write heatmap overlays for images"
DESCRIPTION = "Explain the model's prediction for each image with a heatmap overlay."


def run_explain(args: argparse.Namespace) -> int:
    """``camkit explain``: check everything, then explain this rank's share of the images."""
    vlm.check_prompts(args)
    if args.model.startswith(HF_PREFIX):
        return vlm.run_vlm(args)
    ranks = Ranks.from_env()
    paths, methods, out, device, _ = check_run_inputs(
        args, lambda paths, methods: check_colormap(args.colormap), local_rank=ranks.local_rank
    )
    with ranks.group(device):
        loaded, classes, layer = load_run_model(args, methods)
        resolved = {
            "methods": tuple(methods),
            "layer": layer,
            "classes": None if classes is None else tuple(classes),
            "out": out,
            "device": device,
            "workers": loader_workers(args.workers),
            "report": wants_report(args),
        }
        # every other field of the job is the option of the same name
        options = {f.name: getattr(args, f.name) for f in fields(Job) if f.name not in resolved}
        job = Job(**resolved, **options)
        build_explainers(loaded.model, job)  # a method that cannot explain this model: exit 2
        manifest = explain(
            loaded,
            paths,
            job,
            ranks,
            resume=args.resume,
            weights=args.weights,
            argv=args.argv,
            clip_stride=args.clip_stride,
        )
    return EXIT_OK if manifest is None else summarize(manifest, out, len(paths))


def check_resumable(previous: dict, settings: dict) -> None:
    """Refuse to resume a run made with other settings, naming them."""
    if previous.get("settings") is None:
        raise UsageError(
            "--resume: the manifest in --out records no settings (an older camkit); "
            "start a new run in another folder"
        )
    changed = [key for key in settings if previous["settings"].get(key) != settings[key]]
    if changed:
        details = "; ".join(
            f"{key}: was {previous['settings'].get(key)!r}, now {settings[key]!r}"
            for key in changed
        )
        raise UsageError(
            f"--resume: the run in --out was made with other settings ({details}); to resume "
            "it, run again with its settings, or give a new --out to start a new run"
        )


def explain(
    loaded: models.LoadedModel,
    paths: list[Path],
    job: Job,
    ranks: Ranks | None = None,
    *,
    resume: bool = False,
    weights: str | None = None,
    argv: Sequence[str] = (),
    clip_stride: int | None = None,
) -> dict | None:
    """Explain this rank's share of ``paths`` (with ``resume``: of those not done yet); rank 0
    merges every rank's part and returns the manifest, the others None. Video files are
    explained clip by clip (:mod:`camkit.cli.video`, a clip every ``clip_stride`` frames)."""
    ranks = ranks or Ranks()
    videos = [io.video.is_video(path) for path in paths]
    if any(videos) and not all(videos):
        raise UsageError("explain video files and images in separate runs (--out folders)")
    if any(videos) and loaded.clip_length is None:
        raise UsageError(
            f"--model {loaded.name} takes images, not clips: explain videos with a video model "
            "(e.g. torchvision:r3d_18), or extract the frames as images"
        )
    settings = job.settings(loaded, sha256(weights))
    if any(videos):
        settings |= {"clip_stride": clip_stride}
    head = header(settings, loaded.name, str(job.device), list(argv))
    out = job.out
    if ranks.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        for temporary in io.leftover_temporaries(out):  # half-written files of a killed run
            temporary.unlink(missing_ok=True)
        if resume:
            consolidate(out)
        else:  # a new run: what an earlier one left is not part of it
            for stale in [out / MANIFEST, *out.glob(PARTS), *mapstore.stale(out)]:
                stale.unlink(missing_ok=True)
            shutil.rmtree(out / WINDOWS, ignore_errors=True)  # an earlier run's video windows
    ranks.barrier()
    previous = read(out / MANIFEST) if resume else None
    if previous is not None:
        check_resumable(previous, settings)
    done = {record["image"] for record in previous["records"]} if previous else set()
    todo = [index for index, path in enumerate(paths) if str(path) not in done]
    try:
        if any(videos):
            finished = previous.get("windows", []) if previous else []
            explain_videos(loaded, paths, todo, job, ranks, head, clip_stride, finished)
        else:
            explain_files(loaded, paths, ranks.shard(todo), job, ranks, head)
    except LayerOutputError as error:
        raise UsageError(f"--layer {job.layer}: {error}") from None
    ranks.barrier()
    if ranks.rank != 0:
        return None
    order = [str(path) for path in paths]
    manifest = merge(out, head, order, ranks.world, todo=len(todo))
    shutil.rmtree(out / WINDOWS, ignore_errors=True)  # every video has its record now
    if job.report:
        records = manifest["records"]
        metrics = results.overlay_metrics(records, results.read_rows(out))  # when evaluated
        report.write_report(out, records, metrics=metrics, colormap=job.colormap)
    return manifest


def summarize(manifest: dict, out: Path, total: int) -> int:
    """Say what was written and how fast; exit 1 naming the images that could not be read."""
    records = manifest["records"]
    failed = [record["image"] for record in records if "error" in record]
    this_run = manifest["runs"][-1]
    throughput = this_run["throughput"]
    explained, unreadable = this_run["explained"], this_run["unreadable"]
    seconds = throughput["seconds"]  # the speed counts the images explained, not those refused
    print(
        f"wrote {len(records) - len(failed)} overlay(s) of {total - len(failed)} image(s) to "
        f"{out} (manifest: {out / MANIFEST}); this run explained {explained} image"
        + ("" if explained == 1 else "s")
        + (f" at {explained / seconds:.1f} images/s" if explained and seconds else "")
        + (f"; {unreadable} refused (could not be read)" if unreadable else "")
    )
    if len(throughput["ranks"]) > 1:
        for rank in throughput["ranks"]:
            speed = rank["images_per_second"] or 0.0
            print(f"  rank {rank['rank']}: {rank['images']} image(s), {speed:.1f} images/s")
    return exit_status(failed)


def epilog() -> str:
    """The methods of the registry, by family, and the outputs."""
    return f"""{methods_help()}

outputs in --out:
  <stem>_<method>_<class>.jpg   overlay at the image's original size (--format, --max-size)
  <stem>_<method>_<class>.npy   with --save-raw: the method's map at the model's input size
  maps.npz                      with --save-maps: every raw map (float16) and its index, one
                                file for the run (see docs/cli.md; read by 'camkit strategies')
  manifest.json                 versions, arguments, settings, throughput, and one record per
                                overlay (image, output, method, layer, target, label,
                                probability, top5, rank, seconds) and per unreadable image
  index.html, thumbs/           with --report (default for directories): a page to browse
Images are resized to the model's input size without cropping, so a map covers the whole photo.
exit status: 0 ok, 1 some images unreadable (the others written), 2 usage error

examples:
  camkit explain cat.jpg
  camkit explain photos/ --method gradcam,layercam --target "tiger cat" --out maps
  camkit explain x.png --model torchvision:resnet50 --weights resnet50.pth --target 281,285
  camkit explain cat.jpg --model hf:clip-folder --prompt "a cat" --prompt "a dog"
  camkit explain cat.jpg --model hf:llava-folder --prompt "what is in the picture"
    (hf:FOLDER: a local HuggingFace folder with config, weights, tokenizer and
    preprocessor_config.json; <stem>_<method>_<k>_<prompt or token>.jpg per prompt or
    generated token, and <stem>_<method>_tokens.html for a generative model)"""


def add_parser(commands: argparse._SubParsersAction) -> None:
    """The ``explain`` subcommand."""
    explain = add_command(commands, "explain", run_explain, SUMMARY, DESCRIPTION, epilog())
    add_run_arguments(explain, what="explained")
    vlm.add_arguments(explain)
    explain.add_argument(
        "--alpha", type=unit_float, default=0.5, help="heatmap opacity in [0, 1] (default 0.5)"
    )
    explain.add_argument(
        "--colormap",
        default="jet",
        help="OpenCV (jet, turbo, inferno...) or matplotlib colormap name (default jet)",
    )
    explain.add_argument(
        "--format",
        choices=tuple(io.IMAGE_FORMATS),
        default="jpg",
        help="overlay file format (default %(default)s: quality 90, several times cheaper to "
        "write than png; png: lossless; webp: the smallest files, the slowest to write)",
    )
    explain.add_argument(
        "--max-size",
        type=positive_int,
        metavar="PIXELS",
        help="overlays' longer side at most PIXELS, aspect kept (default: the photo's own size)",
    )
    explain.add_argument(
        "--save-raw", action="store_true", help="also save each map as a float32 .npy file"
    )
    explain.add_argument(
        "--save-maps",
        action="store_true",
        help="also keep every raw map of the run in one float16 OUT/maps.npz with its index "
        "(for 'camkit strategies')",
    )
    explain.add_argument(
        "--clip-length",
        type=positive_int,
        metavar="FRAMES",
        help="a video model's frames per clip (default 16, torchvision's Kinetics clips)",
    )
    explain.add_argument(
        "--clip-stride",
        type=positive_int,
        metavar="FRAMES",
        help="video files: a clip every FRAMES frames (sliding windows; default: the clip "
        "length, clips side by side); the last clip ends on the last frame",
    )
    explain.add_argument(
        "--resume",
        action="store_true",
        help="skip the images (a video's clips) a killed or finished run with the same "
        "settings already did",
    )
    explain.add_argument(
        "--report",
        action=argparse.BooleanOptionalAction,
        help="write OUT/index.html, a page to browse the overlays (default: on when a "
        "directory is explained)",
    )
