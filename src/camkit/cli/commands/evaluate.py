"""``camkit evaluate``: how faithful each method's maps are on a set of images, from the metrics
of :mod:`camkit.metrics`; writes ``metrics.csv``, ``metrics.json`` (means with 95% bootstrap
intervals), the plots, and a summary table on stdout."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from camkit.cli.arguments import add_command, add_run_arguments, methods_help, positive_int
from camkit.cli.common import UsageError, check_run_inputs, load_run_model
from camkit.cli.dataset import ImageFiles, collate
from camkit.cli.pipeline import Job, build_explainers, data_loader, loader_workers
from camkit.cli.results import Collected, write_results
from camkit.cli.scoring import METRICS, Settings, find_masks, parse_metrics, read_mask, score_batch
from camkit.core.explainer import displayed
from camkit.core.progress import counting_rows, progress
from camkit.errors import CamkitError
from camkit.targets.ranking import top1
from camkit.targets.resolver import select_output

SUMMARY = "score how faithful each method's maps are (deletion, insertion, ROAD, ...)"
DESCRIPTION = (
    "Score each method's maps of each image with camkit.metrics: one row per "
    "image and method in metrics.csv, means with 95% bootstrap intervals in metrics.json."
)


def run_evaluate(args: argparse.Namespace) -> int:
    """``camkit evaluate``: every method's maps of every readable image, scored."""

    def metrics_and_masks(paths: list[Path], methods: list[str]) -> tuple:
        wanted = parse_metrics(args.metrics)
        return wanted, find_masks(args.masks, paths, wanted)

    paths, methods, out, device, (wanted, mask_files) = check_run_inputs(args, metrics_and_masks)
    loaded, classes, layer = load_run_model(args, methods, one_class=True)
    job = Job(
        tuple(methods),
        layer,
        None,
        out,
        device,
        images_per_batch=args.images_per_batch,
        batch_size=args.batch_size,
        composite=args.composite,
        workers=loader_workers(args.workers),
        quiet=True,
    )
    settings = Settings(
        tuple(n for n in wanted if n != "sanity"),
        args.steps,
        args.baseline,
        args.batch_size,
        args.tolerance,
    )
    model = loaded.model.to(device)
    explainers = build_explainers(model, job)
    files = ImageFiles(paths, loaded.preprocess, keep_original=False, max_pixels=args.max_pixels)
    collected = Collected(curves={method: {} for method in methods})
    copies = [0]

    def scored_copies(rows: int) -> None:  # the work inside a batch: each forward pass
        copies[0] += rows
        shown.set_postfix_str(f"{copies[0]} copies scored", refresh=True)

    shown = progress(len(paths) * len(methods), "evaluate", "map", enabled=not args.quiet)
    with shown, counting_rows(model, scored_copies):
        for batch in data_loader(files, job, collate):
            for _, path, reason in batch.failures:
                shown.write(f"camkit: cannot read {path}: {reason}", file=sys.stderr)
                collected.failed.append(path)
            shown.update(len(batch.failures) * len(methods))
            if batch.inputs is None:
                continue
            inputs = batch.inputs.to(device)
            with torch.inference_mode():
                probabilities = select_output(model(inputs)).float().softmax(dim=-1).cpu()
            target = top1(probabilities).tolist() if classes is None else classes * len(inputs)
            masks = None
            if mask_files:  # an image without a mask is all False: NaN, never a hit
                blank = torch.zeros(inputs.shape[-2:], dtype=torch.bool)
                found = [
                    read_mask(mask_files[i], loaded.preprocess) if i in mask_files else blank
                    for i in batch.indices
                ]
                masks = torch.stack(found).to(device)
            collected.first_batch = collected.first_batch or (inputs, target)
            scored = {}
            for method in methods:
                try:
                    heat, _ = displayed(explainers[method], inputs, target)
                    scored[method], method_curves = score_batch(
                        model, inputs, heat[:, 0].to(device), target, masks, settings
                    )
                except CamkitError as error:
                    raise UsageError(f"--method {method}: {error}") from None
                for kind, curve in method_curves.items():
                    collected.curves[method].setdefault(kind, []).append(curve)
                shown.update(len(inputs))
            for row, index in enumerate(batch.indices):  # rows: image by image, then method
                image = {
                    "image": str(paths[index]),
                    "target": target[row],
                    "label": loaded.labels[target[row]],
                    "probability": round(float(probabilities[row, target[row]]), 6),
                }
                for method, values in scored.items():
                    scores = {name: float(value[row]) for name, value in values.items()}
                    collected.rows.append(image | {"method": method} | scores)
    return write_results(args, collected, loaded, job, wanted)


def epilog() -> str:
    """The metrics, the methods of the registry by family, the exit status."""
    return (
        "metrics: deletion, insertion (Petsiuk et al. 2018), drop, increase "
        "(Chattopadhay et al. 2018), road (Rong et al. 2022), pointing, energy (need --masks: "
        "Zhang et al. 2016, Wang et al. 2020), sanity (cascading model randomisation, Adebayo "
        "et al. 2018, on the first batch of images).\n\n"
        f"{methods_help()}\n\n"
        "exit status: 0 ok, 1 some images unreadable (the others scored), 2 usage error"
    )


def add_parser(commands: argparse._SubParsersAction) -> None:
    """The ``evaluate`` subcommand."""
    evaluate = add_command(commands, "evaluate", run_evaluate, SUMMARY, DESCRIPTION, epilog())
    add_run_arguments(evaluate, what="scored")
    evaluate.add_argument(
        "--metrics",
        default="deletion,insertion,drop,increase",
        help=f"comma-separated from {', '.join(METRICS)} (default %(default)s)",
    )
    evaluate.add_argument(
        "--masks",
        metavar="DIR",
        help="object masks for pointing/energy: DIR/<image stem>.<image suffix>, nonzero pixels "
        "are the object",
    )
    evaluate.add_argument(
        "--steps",
        type=positive_int,
        default=50,
        metavar="N",
        help="deletion/insertion: pixels removed or added in N steps (default %(default)s)",
    )
    evaluate.add_argument(
        "--baseline",
        choices=("blur", "zero", "mean"),
        default="blur",
        help="deletion/insertion: what replaces a removed pixel (default %(default)s)",
    )
    evaluate.add_argument(
        "--tolerance",
        type=int,
        default=15,
        metavar="PIXELS",
        help="pointing game: a hit within this many pixels of the object (default %(default)s)",
    )
