"""``camkit concepts IMAGES --layer L``: each channel's reference images over a set of images
(the ones in which it is most active, and most relevant for the predicted class), with the
receptive-field patch that drives it: ``concepts.json`` and PNG patches in ``--out``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Subset

from camkit import io
from camkit.cli.arguments import (
    add_command,
    add_composite_argument,
    add_crop_argument,
    add_device_argument,
    add_loader_arguments,
    add_model_arguments,
    positive_int,
)
from camkit.cli.common import (
    EXIT_OK,
    UsageError,
    check_out_dir,
    exit_status,
    image_paths,
    load_model,
    pick_device,
    pick_layer,
)
from camkit.cli.dataset import ImageFiles, collate
from camkit.cli.pipeline import loader_workers
from camkit.cli.ranks import Ranks
from camkit.core.progress import progress
from camkit.errors import CamkitError
from camkit.methods.concepts.reference import MODES, ReferenceCollector, receptive_boxes
from camkit.methods.concepts.rules import GRADIENT, LRPRules
from camkit.runs.concept_parts import PARTS, ConceptsPart, new_part_path, write_part
from camkit.runs.concept_parts import read_parts as read_part_files
from camkit.runs.concepts import CONCEPTS_FILE, ConceptReference, ConceptsRecord, write_concepts
from camkit.runs.manifest import header, now, sha256

DEFAULT_CHANNELS = 16
SUMMARY = "find what a layer's channels respond to: reference images per channel"
DESCRIPTION = (
    "Concept Relevance Propagation's reference images (Achtibat et al., Nature Machine "
    "Intelligence 2023): for each channel of --layer, the images in which it is most active and "
    "those in which it is most relevant for the predicted class (gradient x activation), each "
    "with the patch of its receptive field that drives it (see docs/concepts.md)."
)
EPILOG = (
    "torchrun --nproc_per_node=N -m camkit concepts ... shares the images among N processes; "
    "rank 0 merges them.\n\noutputs in --out: concepts.json (per channel and ranking: image, "
    "score, predicted class, patch box; the run: versions, arguments, settings) and\n"
    "patches/LAYER/cCHANNEL_{activation,relevance}_RANK.png.\n\n"
    "example:\n  camkit concepts photos/ --layer blocks.5 --top 8 --channels 0-15 --out run"
)


def parse_channels(spec: str, channels: int) -> list[int]:
    """``0-15,40`` -> channel indices, each checked against the layer's ``channels``."""
    picked: list[int] = []
    try:
        for part in spec.split(","):
            first, _, last = part.strip().partition("-")
            picked.extend(range(int(first), int(last or first) + 1))
    except ValueError:
        raise UsageError(f"--channels {spec}: expected indices and ranges, e.g. 0-15,40") from None
    bad = [c for c in picked if not 0 <= c < channels]
    if bad or not picked:
        raise UsageError(f"--channels {spec}: the layer has channels 0..{channels - 1}")
    return list(dict.fromkeys(picked))


def run_concepts(args: argparse.Namespace) -> int:
    """Rank every channel of the layer over this rank's share of the images not done yet
    (streaming); rank 0 merges every part and writes the chosen channels' reference patches."""
    ranks = Ranks.from_env()
    paths = image_paths(args.images, ranks.rank == 0)
    out = Path(args.out)
    check_out_dir(out)
    device = pick_device(args.device, ranks.local_rank)
    with ranks.group(device):
        loaded = load_model(args.model, args.weights, args.labels, crop=args.crop)
        layer = pick_layer(loaded, args.layer, [])
        if args.layer is None and ranks.rank == 0:
            print(f"layer: {layer} (auto)", file=sys.stderr)
        model = loaded.model.to(device)
        rules = GRADIENT if args.rules == "gradient" else LRPRules(args.composite)
        try:
            collector = ReferenceCollector(model, layer, top=args.top, rules=rules)
        except CamkitError as error:
            raise UsageError(f"--layer {layer}: {error}") from None
        run = {
            "model": loaded.name,
            "layer": layer,
            "top": args.top,
            "rules": "gradient" if args.rules == "gradient" else f"lrp {args.composite}",
            "images": list(map(str, paths)),
            "crop": loaded.preprocess.crop_mode,
            "weights_sha256": sha256(args.weights),
        }
        settings = {key: value for key, value in run.items() if key != "images"}
        head = header(settings, loaded.name, str(device), args.argv)
        if ranks.rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            if not args.resume:  # a new run: what an earlier one left is not part of it
                for stale in out.glob(PARTS):
                    stale.unlink()
        ranks.barrier()
        earlier = read_parts(out, run) if args.resume else []
        done = {index for part in earlier for index in part.done}
        todo = [index for index in range(len(paths)) if index not in done]
        mine = Subset(ImageFiles(paths, loaded.preprocess, keep_original=False), ranks.shard(todo))
        unreadable = rank_images(collector, mine, args, run, ranks)
        ranks.barrier()
        if ranks.rank != 0:
            return EXIT_OK
        merged = ReferenceCollector(model, layer, top=args.top, rules=rules)
        for part in read_parts(out, run):
            merged.load_state(part.state)
            unreadable.extend(path for path in part.unreadable if path not in unreadable)
        if not merged.found:
            return exit_status(unreadable)
        relevance = merged.totals["relevance"]
        if args.channels is None:
            channels = relevance.topk(min(DEFAULT_CHANNELS, relevance.numel())).indices.tolist()
        else:
            channels = parse_channels(args.channels, relevance.numel())
        files = ImageFiles(paths, loaded.preprocess)
        summary = ConceptsRecord(
            model=loaded.name,
            layer=layer,
            top=args.top,
            images=merged.seen,
            unreadable=sorted(unreadable),
            rules=run["rules"],
            score="sum over positions, divided by the image's sum of absolute channel scores",
            run=head | {"channels": channels},
            channels=write_patches(merged, files, channels, loaded.labels, args),
        )
        summary.run["finished"] = now()
        write_concepts(out, summary)
        for finished in out.glob(PARTS):  # the run is done: nothing left to resume
            finished.unlink()
    print(
        f"concepts of {len(channels)} channel(s) of {layer}: {out / CONCEPTS_FILE}", file=sys.stderr
    )
    return exit_status(sorted(unreadable))


def rank_images(
    collector: ReferenceCollector, files: Subset, args: argparse.Namespace, run: dict, ranks: Ranks
) -> list[str]:
    """Rank the channels over this rank's ``files``, saving the part after every batch."""
    loader = DataLoader(
        files, args.images_per_batch, num_workers=loader_workers(args.workers), collate_fn=collate
    )
    part = new_part_path(Path(args.out), ranks.rank)
    done: list[int] = []
    unreadable: list[str] = []
    device = next(collector.capture.model.parameters()).device
    with progress(len(files), ranks.label("concepts"), "image", enabled=not args.quiet) as shown:
        for batch in loader:
            for index, path, reason in batch.failures:
                shown.write(f"camkit: cannot read {path}: {reason}", file=sys.stderr)
                unreadable.append(path)
                done.append(index)
            if batch.inputs is not None:
                try:
                    collector.update(batch.inputs.to(device), batch.indices)
                except CamkitError as error:
                    raise UsageError(f"--layer {collector.layer} --rules: {error}") from None
                done.extend(batch.indices)
            write_part(part, ConceptsPart(run, done, unreadable, collector.state()))
            shown.update(len(batch))
    return unreadable


def read_parts(out: Path, run: dict) -> list[ConceptsPart]:
    """The saved parts of this run in ``out``; a part of another run is a usage error."""
    parts = read_part_files(out)
    for part in parts:
        differs = [key for key in run if part.run.get(key) != run[key]]
        if differs:
            raise UsageError(
                f"--resume: {part.path.name} belongs to a run with other {', '.join(differs)}; "
                "run without --resume to start over"
            )
    return parts


def write_patches(
    collector: ReferenceCollector,
    files: ImageFiles,
    channels: list[int],
    labels: list[str],
    args: argparse.Namespace,
) -> dict[int, dict[str, list[ConceptReference]]]:
    """Write the reference patches of ``channels`` -> their ``concepts.json`` entries."""
    layer, model = collector.layer, collector.capture.model
    # sample -> (channel, mode, rank, position) of each reference it is
    served: dict[int, list[tuple[int, str, int, int]]] = {}
    for channel in channels:
        for mode in MODES:
            found = collector.found[mode]
            positions = found.positions[channel].tolist()
            for rank, sample in enumerate(found.samples[channel].tolist()):
                if sample >= 0:
                    served.setdefault(sample, []).append((channel, mode, rank, positions[rank]))
    # a batch holds images that serve as many receptive fields: one backward pass serves the
    # k-th of each, and none runs for an image that has no k-th
    by_count: dict[int, list[int]] = {}
    for sample, requests in served.items():
        fields = {(channel, position) for channel, _, _, position in requests}
        by_count.setdefault(len(fields), []).append(sample)
    step = args.images_per_batch
    batches = [
        samples[start : start + step]
        for _, samples in sorted(by_count.items(), reverse=True)
        for start in range(0, len(samples), step)
    ]
    workers = loader_workers(args.workers)
    loader = DataLoader(files, batch_sampler=batches, num_workers=workers, collate_fn=collate)
    folder = Path(args.out) / "patches" / layer
    folder.mkdir(parents=True, exist_ok=True)
    device = next(model.parameters()).device
    entries: dict[int, dict[str, list[ConceptReference]]] = {
        c: {m: [] for m in MODES} for c in channels
    }
    with progress(len(served), "reference patches", "image", enabled=not args.quiet) as shown:
        for batch in loader:
            for _, path, reason in batch.failures:
                message = f"camkit: cannot read {path}: {reason}; its patches are left out"
                shown.write(message, file=sys.stderr)
            requests = [
                (row, *request)
                for row, sample in enumerate(batch.indices)
                for request in served[sample]
            ]
            shown.update(len(batch))
            if not requests:
                continue
            rows, channels_asked, _, _, positions = zip(*requests, strict=True)
            boxes = receptive_boxes(
                model,
                layer,
                batch.inputs.to(device),
                torch.tensor(channels_asked),
                torch.tensor(positions),
                image=torch.tensor(rows),
            ).tolist()
            for (row, channel, mode, rank, _), box in zip(requests, boxes, strict=True):
                image = batch.images[row].numpy()
                top, left, bottom, right = files.preprocess.box_on_photo(box, *image.shape[:2])
                name = f"c{channel}_{mode}_{rank}.png"
                io.save_png(folder / name, image[top:bottom, left:right])
                found = collector.found[mode]
                cls = int(found.classes[channel, rank])
                entries[channel][mode].append(
                    ConceptReference(
                        rank=rank,
                        image=batch.paths[row],
                        score=float(found.values[channel, rank]),
                        class_index=cls,
                        label=labels[cls] if 0 <= cls < len(labels) else str(cls),
                        box=[top, left, bottom, right],
                        patch=str(Path("patches") / layer / name),
                    )
                )
    return {
        channel: {mode: sorted(rows, key=lambda entry: entry.rank) for mode, rows in modes.items()}
        for channel, modes in entries.items()
    }


def add_parser(commands: argparse._SubParsersAction) -> None:
    """The ``concepts`` subcommand."""
    parser = add_command(commands, "concepts", run_concepts, SUMMARY, DESCRIPTION, EPILOG)
    parser.add_argument(
        "images",
        nargs="+",
        metavar="IMAGE_OR_DIR",
        help="image files, or directories whose image files (not in subdirectories) are ranked",
    )
    add_model_arguments(parser)
    add_crop_argument(parser)
    parser.add_argument(
        "--layer",
        metavar="NAME",
        help="the layer whose channels are the concepts (see 'camkit layers'); default: the "
        "model's default layer",
    )
    parser.add_argument(
        "--top",
        type=positive_int,
        default=8,
        metavar="N",
        help="reference images per channel and ranking (default %(default)s)",
    )
    parser.add_argument(
        "--channels",
        metavar="SPEC",
        help="channels whose patches are written, e.g. 0-15,40 (default: the "
        f"{DEFAULT_CHANNELS} most relevant over the images)",
    )
    parser.add_argument(
        "--out", default="camkit-out", metavar="DIR", help="output folder (default %(default)s)"
    )
    parser.add_argument(
        "--rules",
        choices=("gradient", "lrp"),
        default="gradient",
        help="how relevance is computed: gradient x activation (default; any model) or LRP "
        "(Concept Relevance Propagation proper; see --composite)",
    )
    add_composite_argument(parser, what="with --rules lrp", default="epsilon-plus-flat")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue a run that stopped: the images its saved parts hold are not ranked again",
    )
    parser.add_argument(
        "--images-per-batch",
        type=positive_int,
        default=8,
        metavar="N",
        help="images decoded and ranked together (default %(default)s)",
    )
    add_device_argument(parser)
    add_loader_arguments(parser)
