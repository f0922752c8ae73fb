"""The concepts that dominate each strategies cluster, for ``camkit strategies`` when the run
folder holds ``camkit concepts`` results: :meth:`camkit.concepts.ConceptAttribution.dominant`
over the cluster's images, for its class, at the run's layer (so that a shortcut cluster names
its channels, and the report's atlas shows what they respond to). Runs without concepts results
skip it: ``camkit explain --report`` and ``camkit strategies`` stay as fast as they were."""

from __future__ import annotations

from pathlib import Path

import torch

from camkit import io
from camkit.cli.common import UsageError, load_model
from camkit.concepts import ConceptAttribution
from camkit.errors import CamkitError
from camkit.runs.concepts import read_concepts
from camkit.runs.manifest import recorded_crop, sha256

DOMINANT = 5  # concepts listed per cluster
IMAGES_PER_PASS = 16


def add_cluster_concepts(
    run: Path, manifest: dict, groups: list[dict], images: list[str], weights: str | None
) -> str | None:
    """Add ``"concepts": {"layer", "channels": [{"channel", "share", "relevance"}]}`` to every
    cluster of ``groups`` (``strategies.json``'s; members are rows of ``images``) when ``run``
    has ``camkit concepts`` results -> a line saying what was done or why not (None: no
    concepts results, nothing to do). ``manifest``: the run's (its settings name the model,
    the layer and the crop the photos were preprocessed with); ``weights``: the weights file
    of a run made with ``--weights`` (checked against its SHA-256)."""
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
    preprocess = loaded.preprocess
    try:
        concepts = ConceptAttribution(loaded.model, layer, batch_size=IMAGES_PER_PASS)
    except CamkitError as error:
        raise UsageError(f"cluster concepts at layer {layer}: {error}") from None
    for group in groups:
        for cluster in group["clusters"]:
            inputs = []
            for row in cluster["members"]:
                try:
                    inputs.append(preprocess(io.read_image(images[row])))
                except io.READ_ERRORS:
                    continue  # an image gone since the run: the cluster's other members count
            if not inputs:
                continue
            batch = torch.stack(inputs)
            k = min(DOMINANT, _channels(concepts, batch[:1]))
            top = concepts.dominant(batch, k=k, target=int(group["class"]))
            channels = [
                {"channel": c, "share": float(s), "relevance": float(r)}
                for c, s, r in zip(top.channels.tolist(), top.share, top.relevance, strict=True)
            ]
            cluster["concepts"] = {"layer": layer, "channels": channels}
    return f"dominant concepts of each cluster at {layer} (camkit concepts results found)"


def _channels(concepts: ConceptAttribution, one: torch.Tensor) -> int:
    return int(concepts.relevances(one).shape[-1])


__all__ = ["add_cluster_concepts"]
