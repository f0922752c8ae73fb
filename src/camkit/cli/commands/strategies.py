"""``camkit strategies RUN_DIR``: SpRAy on the maps a ``camkit explain --save-maps`` run kept,
per method and class: ``strategies.json``, prototype pictures, montages of each cluster's
members, the eigengap and embedding plots, and the report's strategies view."""

from __future__ import annotations

import argparse
import csv
import sys
import warnings
from pathlib import Path

import numpy as np

from camkit import io, models
from camkit.cli import report, results
from camkit.cli.arguments import add_command, add_labels_argument, positive_int
from camkit.cli.common import EXIT_OK, UsageError
from camkit.cli.strategy_concepts import add_cluster_concepts
from camkit.core.progress import progress
from camkit.errors import CamkitError
from camkit.runs.manifest import MANIFEST, read
from camkit.runs.strategies import (
    STRATEGIES_DIR,
    STRATEGIES_FILE,
    StrategiesRecord,
    write_strategies,
)
from camkit.strategies import (
    ClassStrategies,
    MapSet,
    StrategyWarning,
    find_strategies,
    load_maps,
    plots,
)

SUMMARY = "cluster a run's maps per class to find the model's strategies (SpRAy)"
DESCRIPTION = (
    "Spectral relevance analysis of a 'camkit explain --save-maps' run: per "
    "method and class, the maps' nearest-neighbour graph, its eigengap, clusters, their "
    "prototypes and a suspiciousness score (see docs/strategies.md)."
)
EPILOG = (
    f"outputs in --out (default RUN_DIR/{STRATEGIES_DIR}): {STRATEGIES_FILE}, "
    "prototype_*.png, typical_*.png, atypical_*.png, eigengap_*.png, embedding_*.png; the "
    "run's index.html gets a strategies view.\n\nexample:\n  camkit explain photos/ "
    "--save-maps --out run && camkit strategies run"
)


def named_classes(path: str, targets: list[int]) -> dict[str, str]:
    """``--labels FILE`` -> ``{class index: name}``, covering every class of the maps."""
    try:
        names = models.read_labels(path)
    except CamkitError as error:
        raise UsageError(f"--labels: {error}") from None
    if targets and max(targets) >= len(names):
        raise UsageError(
            f"--labels {path}: {len(names)} class names, but the maps include class "
            f"{max(targets)}; give one name per class, in index order"
        )
    return {str(index): name for index, name in enumerate(names)}


def read_truth(path: str, maps: MapSet) -> np.ndarray:
    """``--truth FILE``: CSV lines ``image,class`` (the image as the manifest names it, or its
    file name; the class index) -> the true label of each map row, -1 where not given."""
    truth: dict[str, int] = {}
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            for number, row in enumerate(csv.reader(handle), 1):
                if not row or row[0].startswith("#"):
                    continue
                if len(row) != 2 or not row[1].strip().lstrip("-").isdigit():
                    if number == 1:
                        continue  # a header line
                    raise UsageError(f"--truth {path}:{number}: expected 'image,class index'")
                truth[row[0].strip()] = int(row[1])
    except OSError as error:
        raise UsageError(f"--truth: cannot read {path}: {error.strerror}") from None
    return np.array(
        [truth.get(image, truth.get(Path(image).name, -1)) for image in maps.image.tolist()]
    )


def pictures_of(run: Path, records: dict[int, dict], rows: np.ndarray, maps: MapSet) -> list:
    """The overlays of map ``rows``, or the maps coloured where one is missing."""
    pictures = []
    for row in rows.tolist():
        try:
            pictures.append(io.read_image(run / records.get(row, {}).get("output")))
        except (TypeError, *io.READ_ERRORS):  # no overlay (None: a TypeError)
            values = np.clip(np.asarray(maps.maps[row], dtype=np.float32), 0, None)
            pictures.append(plots.prototype_picture(values, side=values.shape[0]))
    return pictures


def write_group(
    out: Path,
    run: Path,
    found: ClassStrategies,
    method: str,
    label: str,
    maps: MapSet,
    records: dict[int, dict],
    colormap: str,
) -> dict:
    """The files of one (method, class) and its entry of ``strategies.json``."""
    stem = f"{method}_{found.class_id}"
    title = f"{method} · {label} ({found.class_id})"
    entry = found.to_dict() | {"method": method, "label": label}
    entry["eigengap_plot"] = f"eigengap_{stem}.png"
    plots.save_figure(plots.eigengap_figure(found, title), str(out / entry["eigengap_plot"]))
    if found.embedding is not None:
        entry["embedding_plot"] = f"embedding_{stem}.png"
        plots.save_figure(plots.embedding_figure(found, title), str(out / entry["embedding_plot"]))
        position = {int(index): k for k, index in enumerate(found.indices)}
        entry["points"] = [
            [round(float(x), 3), round(float(y), 3), int(found.labels[position[int(i)]]), int(i)]
            for (x, y), i in zip(found.embedding, found.embedding_index, strict=True)
        ]
    for cluster, summary in zip(found.clusters, entry["clusters"], strict=True):
        name = f"{stem}_{cluster.id}"
        summary["prototype"] = f"prototype_{name}.png"
        io.save_png(
            out / summary["prototype"], plots.prototype_picture(cluster.prototype, 128, colormap)
        )
        for kind in ("typical", "atypical"):
            summary[f"{kind}_montage"] = f"{kind}_{name}.png"
            rows = getattr(cluster, kind)
            sheet = plots.montage(pictures_of(run, records, rows, maps))
            io.save_png(out / summary[f"{kind}_montage"], sheet)
    return entry


def run_strategies(args: argparse.Namespace) -> int:
    """``camkit strategies``: read the run's maps, analyse each (method, class), write."""
    run = Path(args.run_dir)
    try:
        maps = load_maps(run)
    except CamkitError as error:
        raise UsageError(str(error)) from None
    out = Path(args.out) if args.out else run / STRATEGIES_DIR
    out.mkdir(parents=True, exist_ok=True)
    manifest = read(run / MANIFEST) or {"records": []}
    records = {r["map"]: r for r in manifest["records"] if "map" in r}
    truth = read_truth(args.truth, maps) if args.truth else maps.truth
    classes = maps.metadata.get("classes", {})
    if args.labels:
        classes = named_classes(args.labels, maps.target.tolist())
    wanted = None
    if args.classes:
        try:
            wanted = [int(c) for c in args.classes.split(",")]
        except ValueError:
            raise UsageError(
                f"--classes: expected class indices INT[,INT...], got {args.classes!r}"
            ) from None
    methods = sorted(set(maps.method.tolist()))
    if args.method:
        if args.method not in methods:
            raise UsageError(f"--method {args.method}: the run has maps of {', '.join(methods)}")
        methods = [args.method]
    options = {
        "n_neighbors": args.neighbors,
        "max_clusters": args.max_clusters,
        "diffusion": args.diffusion,
        "n_clusters": args.clusters,
        "clustering": args.clustering,
        "embedding": None if args.embedding == "none" else args.embedding,
        "embedding_limit": args.embedding_limit,
        "n_show": args.show,
        "seed": args.seed,
        "grid": args.grid,
        "normalize": args.normalize,
        "positive": args.positive,
    }
    groups, skipped = [], []
    with progress(len(methods), "clusters", "method", enabled=not args.quiet) as shown:
        for method in methods:
            rows = np.flatnonzero(maps.method == method)
            shown.set_postfix_str(method)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", StrategyWarning)
                    found = find_strategies(
                        maps.maps,
                        maps.target[rows],
                        rows=rows,
                        confidences=maps.confidence[rows],
                        predictions=maps.prediction[rows],
                        truth=truth[rows],
                        only=wanted,
                        **options,
                    )
            except CamkitError as error:
                raise UsageError(f"{method}: {error}") from None
            for class_id, result in found.classes.items():
                _to_rows(result, rows)
                label = classes.get(str(class_id), str(class_id))
                groups.append(
                    write_group(out, run, result, method, label, maps, records, args.colormap)
                )
                if not args.quiet:
                    shown.write(_class_line(method, label, class_id, result), file=sys.stdout)
            skipped += [
                {"method": method, "class": c, "reason": why} for c, why in found.skipped.items()
            ]
            shown.update(1)
    done = add_cluster_concepts(
        run, manifest, groups, maps.image.tolist(), args.weights, quiet=args.quiet
    )
    if done is not None and not args.quiet:
        print(done)
    data = StrategiesRecord(
        run=str(run),
        parameters=options,
        images=maps.image.tolist(),
        groups=groups,
        skipped=skipped,
    )
    path = write_strategies(out, data)
    print(
        f"wrote {len(groups)} class strategies to {path}"
        + (f" ({len(skipped)} class(es) skipped: too few maps)" if skipped else "")
    )
    if args.report and manifest["records"]:
        rows = results.overlay_metrics(manifest["records"], results.read_rows(run))
        report.write_report(
            run,
            manifest["records"],
            metrics=rows,
            colormap=args.colormap,
            strategies=data,
            strategies_dir=out,
        )
        print(f"report with the strategies view: {run / 'index.html'}")
    return EXIT_OK


def _class_line(method: str, label: str, class_id: int, result: ClassStrategies) -> str:
    """What ``camkit strategies`` says of one (method, class)."""
    ranked = result.by_suspiciousness()
    flagged = (
        f"most suspicious: cluster {ranked[0].id} ({ranked[0].suspiciousness:.3f})"
        if ranked
        else "every map is noise"
    )
    return (
        f"{method} · {label} ({class_id}): {len(result.indices)} maps, eigengap "
        f"suggests {result.suggested_k}, {result.k} cluster(s); {flagged}"
    )


def _to_rows(found: ClassStrategies, rows: np.ndarray) -> None:
    """Indices into one method's maps -> rows of the map file."""
    found.indices = rows[found.indices]
    if found.embedding_index is not None:
        found.embedding_index = rows[found.embedding_index]
    for cluster in found.clusters:
        cluster.members, cluster.typical = rows[cluster.members], rows[cluster.typical]
        cluster.atypical = rows[cluster.atypical]


def add_parser(commands: argparse._SubParsersAction) -> None:
    """The ``strategies`` subcommand."""
    parser = add_command(commands, "strategies", run_strategies, SUMMARY, DESCRIPTION, EPILOG)
    parser.add_argument(
        "run_dir", metavar="RUN_DIR", help="output folder of 'camkit explain --save-maps'"
    )
    parser.add_argument("--out", metavar="DIR", help="output folder (default RUN_DIR/strategies)")
    parser.add_argument("--method", help="only this method's maps (default: each method)")
    parser.add_argument(
        "--classes", metavar="INT[,INT...]", help="only these classes (default: all)"
    )
    parser.add_argument("--truth", metavar="CSV", help="true labels, lines 'image,class index'")
    add_labels_argument(parser, "those the run recorded")
    parser.add_argument(
        "--grid", type=positive_int, default=32, help="pooled map side (default 32)"
    )
    parser.add_argument(
        "--normalize", choices=("l1", "max"), default="l1", help="per map (default l1)"
    )
    parser.add_argument(
        "--positive",
        choices=("clip", "abs"),
        default="clip",
        help="negative values: clip to 0 (default) or take |value|",
    )
    parser.add_argument(
        "--neighbors", type=positive_int, help="k of the kNN graph (default max(10, sqrt(maps)))"
    )
    parser.add_argument(
        "--diffusion",
        type=float,
        help="random-walk steps of the eigengap (default: automatic, at least 32; 1: plain)",
    )
    parser.add_argument(
        "--max-clusters",
        type=positive_int,
        default=10,
        help="largest k the eigengap considers (default 10)",
    )
    parser.add_argument(
        "--clusters", type=positive_int, help="number of clusters (default: the eigengap's)"
    )
    parser.add_argument(
        "--clustering", choices=("kmeans", "agglomerative", "dbscan", "hdbscan"), default="kmeans"
    )
    parser.add_argument(
        "--embedding",
        choices=("tsne", "umap", "spectral", "none"),
        default="tsne",
        help="2-D layout for display (default tsne; umap needs umap-learn)",
    )
    parser.add_argument(
        "--embedding-limit",
        type=positive_int,
        default=3000,
        metavar="N",
        help="t-SNE/UMAP on a seeded subset of N maps above N (default 3000)",
    )
    parser.add_argument(
        "--show",
        type=positive_int,
        default=8,
        metavar="N",
        help="typical/atypical members shown (default 8)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of k-means, t-SNE, ARPACK (default 0)"
    )
    parser.add_argument("--colormap", default="jet", help="of the prototypes (default jet)")
    parser.add_argument(
        "--weights",
        metavar="FILE",
        help="the weights the run was made with (--weights of camkit explain): needed for the "
        "clusters' dominant concepts when the run has camkit concepts results",
    )
    parser.add_argument(
        "--report",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="add the strategies view to RUN_DIR/index.html (default on)",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no per-class lines and no progress (by stage: clusters per method, then cluster "
        "concepts per image, the slow one: a forward and backward pass per photo and class)",
    )
