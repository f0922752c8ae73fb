"""The channels that dominate each strategies cluster (a run with ``camkit concepts`` results):
:meth:`~camkit.methods.concepts.ConceptAttribution.dominant_of` the members' channel relevances
for the cluster's class at the run's layer, each image measured once per class."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from camkit import io
from camkit.cli.common import UsageError, load_model
from camkit.core.progress import progress
from camkit.errors import CamkitError
from camkit.methods.concepts import ConceptAttribution
from camkit.models import Preprocess
from camkit.runs.concepts import read_concepts
from camkit.runs.manifest import recorded_crop, sha256

DOMINANT = 5  # concepts listed per cluster
IMAGES_PER_PASS = 16  # photos per forward and backward pass


def add_cluster_concepts(
    run: Path,
    manifest: dict,
    groups: list[dict],
    images: list[str],
    weights: str | None,
    *,
    quiet: bool = True,
) -> str | None:
    """Add ``"concepts": {"layer", "channels": [{"channel", "share", "relevance"}]}`` to every
    cluster of ``groups`` (members: rows of ``images``) when ``run`` has ``camkit concepts``
    results -> a line saying what was done or why not (None: no results). ``manifest`` names the
    model, layer and crop; ``weights``: the run's ``--weights`` (checked by its SHA-256)."""
    if read_concepts(run) is None:
        return None
    settings = manifest.get("settings") or {}
    name, layer = settings.get("model"), settings.get("layer")
    if not name or not layer:
        return "cluster concepts skipped: the run's manifest names no model or layer"
    wanted = settings.get("weights_sha256")
    if wanted is not None and weights is None:
        return "cluster concepts skipped: the run used its own weights; pass --weights FILE"
    if wanted != sha256(weights):
        raise UsageError(f"--weights {weights}: not the weights the run was made with")
    loaded = load_model(name, weights, crop=recorded_crop(manifest))
    try:
        concepts = ConceptAttribution(loaded.model, layer)
    except CamkitError as error:
        raise UsageError(f"cluster concepts at layer {layer}: {error}") from None
    # (photo, class) -> its channel relevances, measured once (map rows are photo x method)
    found: dict[tuple[str, int], Tensor | None] = {}
    clusters = [(int(group["class"]), cluster) for group in groups for cluster in group["clusters"]]
    total = len({(images[row], target) for target, c in clusters for row in c["members"]})
    with progress(total, "cluster concepts", "image", enabled=not quiet) as shown:
        for target, cluster in clusters:
            photos = [images[row] for row in cluster["members"]]
            new = [photo for photo in dict.fromkeys(photos) if (photo, target) not in found]
            found |= _channel_relevances(concepts, loaded.preprocess, new, target)
            shown.update(len(new))
            # photos gone since the run are left out
            rows = [found[photo, target] for photo in photos if found[photo, target] is not None]
            if not rows:
                continue
            stacked = torch.stack(rows)
            top = concepts.dominant_of(stacked, k=min(DOMINANT, stacked.shape[1]))
            channels = [
                {"channel": c, "share": float(s), "relevance": float(r)}
                for c, s, r in zip(top.channels.tolist(), top.share, top.relevance, strict=True)
            ]
            cluster["concepts"] = {"layer": layer, "channels": channels}
    return f"dominant concepts of each cluster at {layer} (camkit concepts results found)"


def _channel_relevances(
    concepts: ConceptAttribution, preprocess: Preprocess, photos: list[str], target: int
) -> dict[tuple[str, int], Tensor | None]:
    """``{(photo, target): (C,) relevances}``; None for a photo that cannot be read."""
    found: dict[tuple[str, int], Tensor | None] = {}
    inputs, readable = [], []
    for photo in photos:
        try:
            inputs.append(preprocess(io.read_image(photo)))
            readable.append(photo)
        except io.READ_ERRORS:
            found[photo, target] = None
    for start in range(0, len(inputs), IMAGES_PER_PASS):
        part = slice(start, start + IMAGES_PER_PASS)
        rows = concepts.relevances(torch.stack(inputs[part]), target=target)
        found |= {(photo, target): row for photo, row in zip(readable[part], rows, strict=True)}
    return found
