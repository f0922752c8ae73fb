"""The model-parameter randomisation test: does the map depend on what the model learnt?

Adebayo et al., "Sanity Checks for Saliency Maps", NeurIPS 2018: the blocks of a trained model
are randomised from the top (the classifier) down, cumulatively (cascade) or one at a time
(independent), and each map is compared with the trained model's; a method whose maps stay
similar explains the image, not the model (edge detection). Everything runs on a deep copy: the
user's model is never called or changed, even when the explainer raises.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn

from camkit.core.explainer import Explainer
from camkit.core.layers import explained_module, find_layers
from camkit.core.seeds import call_seed
from camkit.errors import ArgumentError, EmptyMapWarning, InputError, ZeroGradientWarning, warn
from camkit.methods.pixel.heatmap import to_heatmap
from camkit.targets.base import TargetSpec
from camkit.targets.outputs import select_output
from camkit.targets.ranking import top1
from camkit.targets.resolver import resolve

Order = Literal["cascade", "independent"]
SIMILARITIES = ("spearman", "spearman_abs", "ssim", "hog")
ORDERS = ("cascade", "independent")
#: percentile of |attribution| that maps 1 in the [0, 1] maps of signed attributions
DISPLAY_PERCENTILE = 99.0
Init = Literal["normal"] | Callable[[str, nn.Module, torch.Generator], None]

_CONTAINERS = (nn.Sequential, nn.ModuleList)


def default_blocks(model: nn.Module) -> list[str]:
    """The blocks randomised by default, **top first** (reverse order of definition, which
    stands for forward order; pass ``layers=`` where it does not): the model's top-level
    children with parameters, a container of containers (timm's ``blocks``) split into its
    children (ResNet: ``fc, layer4, ..., layer1, bn1, conv1``); with fewer than 3 blocks (VGG, a
    plain ``nn.Sequential``) each container is split into its parameterised children."""
    model = explained_module(model)

    def children(module: nn.Module, prefix: str) -> list[tuple[str, nn.Module]]:
        return [
            (f"{prefix}{name}", child)
            for name, child in module.named_children()
            if next(child.parameters(), None) is not None
        ]

    blocks: list[tuple[str, nn.Module]] = []
    for name, child in children(model, ""):
        inner = list(child.children())
        stages = isinstance(child, _CONTAINERS) and inner
        stages = stages and all(isinstance(c, _CONTAINERS) for c in inner)
        blocks += children(child, f"{name}.") if stages else [(name, child)]
    if len(blocks) < 3:
        split: list[tuple[str, nn.Module]] = []
        for name, child in blocks:
            inner = children(child, f"{name}.")
            split += inner if isinstance(child, _CONTAINERS) and inner else [(name, child)]
        blocks = split
    if not blocks:
        raise ArgumentError("the model has no parameters: there is nothing to randomise")
    return [name for name, _ in reversed(blocks)]


def randomize_normal(name: str, module: nn.Module, generator: torch.Generator) -> None:
    """Re-draw every parameter tensor of ``module`` i.i.d. from a normal with the **same mean
    and standard deviation** as its trained values; a one-element or constant tensor and the
    buffers are kept, so activations keep their trained scale (with ``reset_parameters()``
    EfficientNet-Lite0's cascaded logits shrink to about 0.03). Draws are made on the CPU with
    ``generator``: the same on every device."""
    with torch.no_grad():
        for parameter in module.parameters():
            values = parameter.detach().double()
            if values.numel() < 2:
                continue
            mean, std = values.mean(), values.std(unbiased=False)
            draw = torch.randn(parameter.shape, generator=generator, dtype=torch.float64)
            parameter.copy_((draw * std.cpu() + mean.cpu()).to(parameter.device, parameter.dtype))


def _correlation(a: Tensor, b: Tensor) -> Tensor:
    """Pearson correlation of the rows ``(B, N) -> (B,)`` in float64; a row constant in one map
    gives 0, constant in both 1 (scipy: NaN)."""
    a, b = (t.double() - t.double().mean(dim=1, keepdim=True) for t in (a, b))
    norms = a.norm(dim=1) * b.norm(dim=1)
    value = (a * b).sum(dim=1) / torch.where(norms > 0, norms, 1.0)
    both_flat = (a.norm(dim=1) == 0) & (b.norm(dim=1) == 0)
    return torch.where(both_flat, 1.0, value).clamp(-1, 1)


def average_ranks(values: Tensor) -> Tensor:
    """Ranks ``1..N`` of each row of ``(B, N)`` values; ties get their average rank (as
    ``scipy.stats.rankdata``), so Spearman's correlation is the Pearson one of these ranks."""
    ranks = torch.empty(values.shape, dtype=torch.float64, device=values.device)
    for row, row_values in enumerate(values):
        _, inverse, counts = torch.unique(row_values, return_inverse=True, return_counts=True)
        ends = counts.cumsum(0).double()
        ranks[row] = (ends - (counts.double() - 1) / 2)[inverse]
    return ranks


def _check_pair(a: Tensor, b: Tensor, what: str, dims: int | None = None) -> None:
    """Two batches of maps to compare: tensors of one shape ``(B, ...)`` (``dims`` axes)."""
    if not (isinstance(a, Tensor) and isinstance(b, Tensor)):
        raise ArgumentError(
            f"{what} compares two tensors, got {type(a).__name__} and {type(b).__name__}"
        )
    if a.shape != b.shape or a.ndim < 2 or (dims is not None and a.ndim != dims):
        shape = "(B, H, W)" if dims == 3 else "(B, ...)"
        raise ArgumentError(
            f"{what} compares two batches of maps of the same shape {shape}, got "
            f"{tuple(a.shape)} and {tuple(b.shape)}"
        )


def spearman(a: Tensor, b: Tensor) -> Tensor:
    """Spearman rank correlation of two batches of maps ``(B, ...) -> (B,)`` in float64 (average
    ranks for ties; a constant map: see :func:`_correlation`), as Adebayo et al. (NeurIPS 2018)
    on the signed and the absolute maps."""
    _check_pair(a, b, "spearman")
    return _correlation(average_ranks(a.flatten(1)), average_ranks(b.flatten(1)))


def _per_sample(
    a: Tensor, b: Tensor, what: str, side: int, function: Callable[[np.ndarray, np.ndarray], float]
) -> Tensor:
    """``function`` of each pair of maps (at least ``side`` pixels a side) -> ``(B,)``."""
    _check_pair(a, b, what, dims=3)
    if min(a.shape[-2:]) < side:
        raise ArgumentError(
            f"{what} needs maps of at least {side}x{side} pixels, got {tuple(a.shape[-2:])}"
        )
    pairs = zip(a.detach().double().cpu().numpy(), b.detach().double().cpu().numpy(), strict=True)
    return torch.tensor([function(x, y) for x, y in pairs], dtype=torch.float64)


def ssim(a: Tensor, b: Tensor) -> Tensor:
    """SSIM of two batches of maps in [0, 1] ``(B, H, W) -> (B,)``:
    ``skimage.metrics.structural_similarity(data_range=1)`` (7x7 window, at least 7x7 maps)."""
    from skimage.metrics import structural_similarity

    return _per_sample(a, b, "ssim", 7, lambda x, y: structural_similarity(x, y, data_range=1.0))


def hog_similarity(a: Tensor, b: Tensor) -> Tensor:
    """Pearson correlation of the HOG descriptors (``skimage.feature.hog`` with its defaults:
    9 orientations, 8x8-pixel cells, 3x3-cell blocks) of two batches of maps ``(B, H, W) ->
    (B,)``, as Adebayo et al.; maps of at least 24x24 pixels."""
    from skimage.feature import hog

    def one(x: np.ndarray, y: np.ndarray) -> float:
        hx, hy = (torch.from_numpy(hog(m)).unsqueeze(0) for m in (x, y))
        return float(_correlation(hx, hy)[0])

    return _per_sample(a, b, "hog_similarity", 24, one)


def _similarities(
    names: Sequence[str], original: tuple[Tensor, Tensor], other: tuple[Tensor, Tensor]
) -> dict[str, Tensor]:
    (signed, unit), (signed_other, unit_other) = original, other
    functions = {
        "spearman": lambda: spearman(signed, signed_other),
        "spearman_abs": lambda: spearman(signed.abs(), signed_other.abs()),
        "ssim": lambda: ssim(unit, unit_other),
        "hog": lambda: hog_similarity(unit, unit_other),
    }
    return {name: functions[name]().cpu() for name in names}


def checked_similarity(similarity: str | Sequence[str], *, with_abs: bool = True) -> list[str]:
    """The similarity names asked (one or a list of :data:`SIMILARITIES`), checked."""
    asked = [similarity] if isinstance(similarity, str) else list(similarity)
    unknown = [name for name in asked if name not in SIMILARITIES]
    if unknown:
        raise ArgumentError(f"unknown similarity {unknown[0]!r}; choose from {SIMILARITIES}")
    if not asked:
        raise ArgumentError(f"no similarity asked; choose from {SIMILARITIES}")
    if with_abs and "spearman" in asked and "spearman_abs" not in asked:
        asked.insert(asked.index("spearman") + 1, "spearman_abs")
    return list(dict.fromkeys(asked))


def _maps(explainer: Any, x: Tensor, target: TargetSpec) -> tuple[Tensor, Tensor]:
    """``(signed, unit in [0, 1])`` maps ``(B, H, W)`` of one explainer on ``x`` (an attribution
    summed over channels). ``unit``: a camkit method's display map, another callable's map when
    in [0, 1], else ``|map|`` over its 99th percentile, clipped at 1."""
    result = explainer(x, target=target)
    if not isinstance(result, Tensor):
        raise ArgumentError(f"the explainer returned {type(result).__name__}, not a tensor")
    result = result.detach().float()
    if result.shape == x.shape:
        signed = result.sum(dim=1)
    elif result.ndim == 3 and result.shape[0] == x.shape[0]:
        signed = result
    else:
        raise ArgumentError(
            f"the explainer must return one (B, H, W) map or a (B, C, H, W) attribution per "
            f"sample for a batch {tuple(x.shape)}, got {tuple(result.shape)} "
            "(one target per sample)"
        )
    if isinstance(explainer, Explainer):
        unit = explainer.display_heat(result.unsqueeze(1)).squeeze(1)
    elif signed.min() >= 0 and signed.max() <= 1:
        unit = signed
    else:
        unit = to_heatmap(signed.unsqueeze(1), "sum", percentile=DISPLAY_PERCENTILE).abs()
    return signed, unit


def randomization_test(
    explainer_factory: Callable[[nn.Module], Any],
    model: nn.Module,
    x: Tensor,
    target: TargetSpec = None,
    *,
    order: Order = "cascade",
    similarity: str | Sequence[str] = ("spearman", "ssim", "hog"),
    layers: Sequence[str] | None = None,
    init: Init = "normal",
    seed: int | None = None,
    per_sample: bool = False,
    return_maps: bool = False,
) -> list[dict[str, Any]] | tuple[list[dict[str, Any]], dict[str, Tensor]]:
    """Model-parameter randomisation test (Adebayo et al., NeurIPS 2018).

    Args:
        explainer_factory: ``net -> explainer`` (``lambda net: camkit.GradCAM(net, "layer4")``);
            ``explainer(x, target=...)`` returns ``(B, H, W)`` maps or ``(B, C, H, W)``
            attributions (summed over channels).
        model: the trained model; only a deep copy is randomised and explained.
        x: images ``(B, C, H, W)`` (or one ``(C, H, W)``).
        target: one class per sample or a callable target; None: each sample's top-1 class
            **of the trained model**, explained by every randomised network.
        order: ``"cascade"``: blocks randomised cumulatively, top first; ``"independent"``:
            one block at a time, the others trained.
        similarity: any of ``"spearman"`` (rank correlation of the signed maps; asking it also
            reports ``"spearman_abs"``, that of their absolute values, as Adebayo et al.),
            ``"spearman_abs"``, ``"ssim"`` and ``"hog"`` (on the maps in [0, 1]).
        layers: module names to randomise, top first, instead of :func:`default_blocks`.
        init: ``"normal"`` (:func:`randomize_normal`) or a callable
            ``init(name, module, generator)`` that randomises ``module`` in place.
        seed: seeds the draws (block ``i`` draws the same in both orders); None: from torch's
            global generator.
        per_sample: report a list of ``B`` values per similarity instead of their mean.
        return_maps: also return ``{"original": maps, layer: maps, ...}`` (``(B, H, W)`` in
            [0, 1], on the CPU), for :func:`camkit.metrics.plots.plot_randomization`.

    Returns:
        One dict per randomised block, in order, top first:
        ``{"layer": name, "spearman": ..., "spearman_abs": ..., "ssim": ..., "hog": ...}``
        (the similarities asked for, batch means), and the maps if asked. Non-negative maps
        (every CAM) give ``spearman_abs == spearman``; a randomised network's blank map counts
        as similarity 0 without warning (a blank *original* map warns).
    """
    if order not in ORDERS:
        raise ArgumentError(f"order must be one of {ORDERS}, got {order!r}")
    names_asked = checked_similarity(similarity)
    if not (init == "normal" or callable(init)):
        raise ArgumentError(f"init must be 'normal' or a callable, got {init!r}")
    if not isinstance(x, Tensor) or x.ndim not in (3, 4):
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise InputError(f"expected images (B, C, H, W) or (C, H, W), got {got}")
    batch = x.unsqueeze(0) if x.ndim == 3 else x
    model = explained_module(model)
    if layers is None:
        names = default_blocks(model)
    else:
        names = [layers] if isinstance(layers, str) else list(layers)
    if not names or not all(isinstance(name, str) for name in names):
        raise ArgumentError(f"layers must be a non-empty list of module names, got {layers!r}")
    seed = call_seed(seed)
    try:
        network = copy.deepcopy(model)
    except Exception as err:  # any failure to copy: the test cannot run without touching it
        raise ArgumentError(
            f"the model cannot be deep-copied ({type(err).__name__}: {err}); the randomisation "
            "test needs a copy to randomise"
        ) from err
    blocks = dict(find_layers(network, names))  # unknown names raise with the closest names

    scorer = resolve(target, batch.shape[0], batch.device)
    if scorer.top1:
        with torch.no_grad():
            target = top1(select_output(network(batch))).tolist()
    elif scorer.several:
        raise ArgumentError("the randomisation test explains one target per sample, not (B, K)")

    original = _maps(explainer_factory(network), batch, target)
    blank = int((original[1].flatten(1) == 0).all(dim=1).sum())
    if blank:
        warn(
            f"{blank} original map(s) are all zero: their similarities mean nothing",
            EmptyMapWarning,
        )
    randomize = randomize_normal if init == "normal" else init
    maps = {"original": original[1].cpu()}
    results = []
    for index, name in enumerate(names):
        module = blocks[name]
        kept = {k: v.detach().clone() for k, v in module.state_dict().items()}
        randomize(name, module, torch.Generator().manual_seed(seed + index))
        with warnings.catch_warnings():  # a randomised network's blank map is a finding here
            warnings.simplefilter("ignore", EmptyMapWarning)
            warnings.simplefilter("ignore", ZeroGradientWarning)
            randomised = _maps(explainer_factory(network), batch, target)
        if (
            order == "independent"
        ):  # parameters and buffers back (an init= may reset running statistics)
            module.load_state_dict(kept)
        values = _similarities(names_asked, original, randomised)
        summary = {k: v.tolist() if per_sample else float(v.mean()) for k, v in values.items()}
        results.append({"layer": name} | summary)
        maps[name] = randomised[1].cpu()
    return (results, maps) if return_maps else results


__all__ = [
    "DISPLAY_PERCENTILE",
    "ORDERS",
    "SIMILARITIES",
    "average_ranks",
    "checked_similarity",
    "default_blocks",
    "hog_similarity",
    "randomization_test",
    "randomize_normal",
    "spearman",
    "ssim",
]
