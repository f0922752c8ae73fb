"""Deep Feature Factorization: a layer's activations as a few concepts, each with a map.

Collins et al., "Deep Feature Factorization for Concept Discovery", ECCV 2018, as
pytorch-grad-cam's ``DeepFeatureFactorization``: a batch's activations as a ``(C, B h w)``
matrix, shifted per channel to be non-negative, factorised ``A - min ~ W H`` with ``W (C, k)``
the concept embeddings (the shift added back) and ``H (k, B h w)`` where each concept is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from camkit.core.call import Call
from camkit.core.engine import Capture
from camkit.core.inputs import as_batch, positive_int
from camkit.core.layers import LayerSpec, find_layer, single_call
from camkit.core.layouts import check_reshape, resolve_reshape
from camkit.core.seeds import seed_value
from camkit.core.state import buffers_kept
from camkit.errors import ArgumentError, InputError, LayerOutputError
from camkit.methods.cam.base import Reshape
from camkit.methods.cam.classifier import find_classifier


def nmf(
    x: Tensor,
    components: int,
    *,
    init: tuple[Tensor, Tensor] | None = None,
    seed: int = 0,
    max_iter: int = 200,
    tol: float = 1e-4,
) -> tuple[Tensor, Tensor]:
    """Non-negative matrix factorisation ``x (n, m) ~ W (n, k) H (k, m)``, Frobenius loss.

    Lee & Seung's problem by coordinate descent (HALS, Cichocki & Phan 2009), as scikit-learn's
    ``NMF(solver="cd")``: ``W_t <- max(0, W_t - (W HH^T - X H^T)_t / (HH^T)_tt)``, then ``H``
    likewise, until the projected-gradient violation is below ``tol`` times the first, or
    ``max_iter``. Initialised as scikit-learn's ``"random"`` (seeded) or ``init=(W, H)``; float64.
    """
    if x.ndim != 2:
        raise InputError(f"nmf needs a matrix (n, m), got shape {tuple(x.shape)}")
    if (x < 0).any():
        raise InputError("nmf needs a non-negative matrix")
    positive_int("components", components)
    positive_int("max_iter", max_iter)
    x = x.double()
    if init is None:
        scale = math.sqrt(float(x.mean()) / components)
        generator = torch.Generator().manual_seed(seed)
        h = scale * torch.randn(components, x.shape[1], generator=generator, dtype=x.dtype).abs()
        w = scale * torch.randn(x.shape[0], components, generator=generator, dtype=x.dtype).abs()
        w, h = w.to(x.device), h.to(x.device)
    else:
        w, h = (t.detach().to(device=x.device, dtype=torch.float64).clone() for t in init)
        if w.shape != (x.shape[0], components) or h.shape != (components, x.shape[1]):
            raise ArgumentError(
                f"init must be W {(x.shape[0], components)} and H {(components, x.shape[1])}, got "
                f"{tuple(w.shape)} and {tuple(h.shape)}"
            )
    first = None
    for _ in range(max_iter):
        violation = float(_hals_step(x, w, h.T) + _hals_step(x.T, h.T, w))
        first = violation if first is None else first
        if first == 0 or violation / first <= tol:
            break
    return w, h


def _hals_step(x: Tensor, w: Tensor, ht: Tensor) -> Tensor:
    """Update ``w``'s columns in place for ``x ~ w ht^T``; returns the gradient's violation."""
    hht = ht.T @ ht
    xht = x @ ht
    violation = x.new_zeros(())
    for t in range(w.shape[1]):
        grad = w @ hht[:, t] - xht[:, t]
        projected = torch.where(w[:, t] == 0, grad.clamp(max=0), grad)
        violation = violation + projected.abs().sum()
        step = torch.where(hht[t, t] != 0, grad / hht[t, t].clamp_min(1e-300), 0)
        w[:, t] = (w[:, t] - step).clamp(min=0)
    return violation


@dataclass
class Concepts:
    """What :class:`DeepFeatureFactorization` found: ``embeddings (k, C)`` in the layer's
    channel space, ``maps (B, k, H, W)`` (``(k, H, W)`` for one image) where each concept is,
    min-max normalised, and ``scores (k, num_classes)``, the classifier's softmax, or None."""

    embeddings: Tensor
    maps: Tensor
    scores: Tensor | None

    def top_classes(self, k: int = 2) -> list[list[tuple[int, float]]]:
        """The ``k`` most probable classes of each concept: ``[[(class, probability), ...]]``."""
        if self.scores is None:
            raise ArgumentError("no classifier was applied to the concepts (pass classifier=)")
        values, indices = self.scores.topk(min(k, self.scores.shape[1]), dim=1)
        rows = zip(indices.tolist(), values.tolist(), strict=True)
        return [list(zip(classes, probabilities, strict=True)) for classes, probabilities in rows]

    def legend(self, labels: list[str], k: int = 2) -> list[str]:
        """One line per concept: ``"label:0.91\\nlabel:0.03"`` (first three comma-separated
        names of each label, as pytorch-grad-cam's ``create_labels_legend``)."""
        return [
            "\n".join(f"{','.join(labels[c].split(',')[:3])}:{p:.2f}" for c, p in row)
            for row in self.top_classes(k)
        ]


class DeepFeatureFactorization:
    """Deep Feature Factorization (Collins et al., ECCV 2018; see the module docstring):
    ``(model, layer)(x, components=5) -> Concepts``, a batch factorised together.

    Args:
        layer: the layer to factorise (dotted name or module), e.g. the last conv block.
        classifier: names the ``(k, C)`` concept embeddings: a module or callable, ``"auto"``
            (:func:`~camkit.methods.cam.classifier.find_classifier`'s, with its bias), or None.
        reshape: a layer output's reading as a ``(B, C, h, w)`` grid, as every CAM's.
        seed: seeds the NMF initialisation.
    """

    def __init__(
        self,
        model: nn.Module,
        layer: LayerSpec | None = None,
        *,
        classifier: nn.Module | str | None = "auto",
        reshape: Reshape | str | None = "auto",
        seed: int = 0,
    ):
        check_reshape(reshape)
        self.capture = Capture(model, layer)
        if len(self.capture.layers) != 1:
            raise ArgumentError("Deep Feature Factorization takes one layer")
        self.model = self.capture.model
        self.reshape = reshape
        self.seed = seed_value(seed)
        if classifier == "auto":
            classifier = self.model.get_submodule(find_classifier(self.model)[0])
        elif isinstance(classifier, str):
            _, classifier = find_layer(self.model, classifier)
        self.classifier = classifier

    def __call__(self, x: Tensor, components: int = 5, **nmf_options) -> Concepts:
        """Factorise ``x``'s activations into ``components`` concepts (see :func:`nmf` for
        ``init``, ``max_iter``, ``tol``)."""
        batch, single = as_batch(x, self.model)
        with buffers_kept(self.model):  # a forward without gradients: no batch-norm guard
            _, taps = self.capture.forward(batch, Call(batch), start_graph=False)
        (act,) = single_call(taps)
        reader = resolve_reshape(self.reshape, self.model, tuple(batch.shape[2:]), act.shape)
        act = (act if reader is None else reader(act)).detach().float()
        if act.ndim != 4:
            raise LayerOutputError(
                f"DFF needs layer outputs of shape (B, C, h, w), got {tuple(act.shape)}; "
                "pass reshape= a function that turns them into a grid"
            )
        b, c, h, w = act.shape
        matrix = act.nan_to_num(0).transpose(0, 1).reshape(c, -1)  # (C, B h w)
        offset = matrix.amin(dim=1, keepdim=True)
        weights, where = nmf(matrix - offset, components, seed=self.seed, **nmf_options)
        embeddings = (weights + offset.double()).T.float()  # (k, C)
        maps = where.float().reshape(components, b, h, w).transpose(0, 1)  # (B, k, h, w)
        maps = maps - maps.amin(dim=(-2, -1), keepdim=True)
        maps = maps / (maps.amax(dim=(-2, -1), keepdim=True) + 1e-7)
        maps = F.interpolate(maps, size=batch.shape[-2:], mode="bilinear", align_corners=False)
        scores = None
        if self.classifier is not None:
            with torch.no_grad():
                scores = self.classifier(embeddings.to(batch.device)).float().softmax(dim=-1)
        return Concepts(embeddings, maps[0] if single else maps, scores)


__all__ = ["Concepts", "DeepFeatureFactorization", "nmf"]
