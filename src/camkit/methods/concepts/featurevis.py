"""Feature visualisation: the image that maximises a channel, a neuron or a class logit.

Olah, Mordvintsev & Schubert, "Feature Visualization", Distill 2017 (and its code, lucid /
torch-lucent): the image is a Fourier spectrum scaled by ``1 / frequency`` (whitened gradient
steps), mapped through the square root of ImageNet's colour correlation and a sigmoid, and
optimised with Adam under transformation robustness (pad, jitter, random scale and rotation,
jitter, resize to the model's input size; the article's pixel amounts, for 224 pixels, scaled to
the image's side). A diversity term (minus the pairwise cosine similarity of the batch's Gram
matrices at a layer) makes a batch show different facets. Every random draw comes from one
seeded generator. Each start's first steps use lucid's redirected ReLU gradient
(:mod:`~camkit.methods.concepts.redirect`); an image whose objective has not moved starts again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from camkit.core.engine import require_autograd
from camkit.core.inputs import as_size, positive_int
from camkit.core.layers import capture_outputs, explained_module, find_layers, single_call
from camkit.core.layouts import Layout, channels_first, layer_layout
from camkit.core.progress import progress as progress_of
from camkit.core.seeds import seed_value
from camkit.core.state import model_guarded
from camkit.errors import ArgumentError, UnmovedObjectiveWarning, warn
from camkit.methods.concepts.redirect import redirected_relu
from camkit.models.preprocess import carried_preprocess
from camkit.targets.outputs import OutputSelector, class_logits

# the square root of ImageNet's colour correlation (lucid's color_correlation_svd_sqrt)
COLOR_CORRELATION = torch.tensor([[0.26, 0.09, 0.02], [0.27, 0.00, -0.05], [0.27, -0.09, 0.03]])
SCALES = tuple(1 + (i - 5) / 50 for i in range(11))  # lucid's standard_transforms
ANGLES = tuple(range(-10, 11)) + (0,) * 5


@dataclass(frozen=True)
class ChannelObjective:
    """Maximise the mean activation of channel ``channel`` of ``layer`` (over positions)."""

    layer: str
    channel: int

    def score(self, act: Tensor, logits: Tensor) -> Tensor:
        """``(B, C, ...)`` activations (channels first), the logits -> ``(B,)``."""
        return _channel(act, self.channel, self.layer).flatten(1).mean(dim=1)


@dataclass(frozen=True)
class NeuronObjective:
    """Maximise channel ``channel`` of ``layer`` at one position (``position``: the flat index
    among the layer's positions, row-major, e.g. a token; None: the middle one)."""

    layer: str
    channel: int
    position: int | None = None

    def score(self, act: Tensor, logits: Tensor) -> Tensor:
        flat = _channel(act, self.channel, self.layer).flatten(1)
        position = flat.shape[1] // 2 if self.position is None else self.position
        if not 0 <= position < flat.shape[1]:
            raise ArgumentError(
                f"position {position} out of range: layer {self.layer!r} has {flat.shape[1]} "
                "positions"
            )
        return flat[:, position]


@dataclass(frozen=True)
class LogitObjective:
    """Maximise the logit of class ``cls`` (before softmax)."""

    cls: int
    layer: None = None

    def score(self, act: Tensor | None, logits: Tensor) -> Tensor:
        """The logits ``(B, classes)`` -> ``(B,)``."""
        if not 0 <= self.cls < logits.shape[1]:
            raise ArgumentError(f"class {self.cls} out of range: the model has {logits.shape[1]}")
        return logits[:, self.cls]


Objective = ChannelObjective | NeuronObjective | LogitObjective


def _channel(act: Tensor, channel: int, layer: str) -> Tensor:
    if not 0 <= channel < act.shape[1]:
        raise ArgumentError(
            f"channel {channel} out of range: layer {layer!r} has {act.shape[1]} channels"
        )
    return act[:, channel]


def fourier_image(spectrum: Tensor, size: tuple[int, int]) -> Tensor:
    """``(B, 3, h, w // 2 + 1)`` complex spectrum -> ``(B, 3, h, w)`` image in [0, 1] (lucid's
    ``fft_image``, decay power 1, then decorrelated colours and a sigmoid)."""
    h, w = size
    fy = torch.fft.fftfreq(h, device=spectrum.device)[:, None]
    fx = torch.fft.rfftfreq(w, device=spectrum.device)[None, :]
    scale = 1.0 / torch.sqrt(fx**2 + fy**2).clamp_min(1.0 / max(h, w))
    image = torch.fft.irfft2(spectrum * scale, s=(h, w), norm="ortho") / 4
    colours = COLOR_CORRELATION.to(image) / COLOR_CORRELATION.norm(dim=0).max()
    return torch.sigmoid(torch.einsum("bchw,dc->bdhw", image, colours))


def robust(image: Tensor, size: tuple[int, int], generator: torch.Generator) -> Tensor:
    """lucid's standard transformations drawn from ``generator`` (see the module docstring),
    then resized to ``size``."""
    side = max(size) / 224
    pad, first, last = round(12 * side), max(round(8 * side), 1), max(round(4 * side), 1)
    image = F.pad(image, (pad, pad, pad, pad), value=0.5)
    image = _jitter(image, first, generator)
    scale = SCALES[_draw(len(SCALES), generator)]
    angle = math.radians(ANGLES[_draw(len(ANGLES), generator)])
    cos, sin = math.cos(angle) / scale, math.sin(angle) / scale
    theta = image.new_tensor([[cos, -sin, 0.0], [sin, cos, 0.0]]).expand(image.shape[0], 2, 3)
    grid = F.affine_grid(theta, list(image.shape), align_corners=False)
    image = F.grid_sample(image, grid, padding_mode="border", align_corners=False)
    image = _jitter(image, last, generator)
    return F.interpolate(image, size=size, mode="bilinear", align_corners=False)


def _draw(n: int, generator: torch.Generator) -> int:
    return int(torch.randint(n, (1,), generator=generator))


def _jitter(image: Tensor, shift: int, generator: torch.Generator) -> Tensor:
    dy, dx = _draw(shift, generator), _draw(shift, generator)
    h, w = image.shape[-2:]
    return image[..., dy : h - shift + dy + 1, dx : w - shift + dx + 1]


def diversity(act: Tensor) -> Tensor:
    """lucid's diversity objective: minus the mean over the batch of the summed cosine
    similarities of each image's Gram matrix with the others' (channels first)."""
    flat = act.flatten(2)
    grams = F.normalize((flat @ flat.transpose(1, 2)).flatten(1), dim=1)
    similar = grams @ grams.T
    return -(similar.sum() - similar.diagonal().sum()) / act.shape[0]


@dataclass(frozen=True)
class FeatureImages:
    """What :func:`feature_images` found: ``images`` ``(B, 3, H, W)`` in [0, 1]; ``moved``
    ``(B,)`` whether each image's objective moved from its start (else the image is that start);
    ``start_scores`` ``(B,)`` the starting values; ``starts``: 1 + the restarts used."""

    images: Tensor
    moved: Tensor
    start_scores: Tensor
    starts: int


def visualize(model: nn.Module, objective: Objective, **options: Any) -> Tensor:
    """The images of :func:`feature_images` (same options), with an
    :class:`~camkit.errors.UnmovedObjectiveWarning` when an image's objective never moved."""
    found = feature_images(model, objective, **options)
    if not found.moved.all():
        rows = found.moved.logical_not().nonzero().flatten().tolist()
        warn(
            f"feature visualisation of {objective}: the objective of image(s) {rows} stayed at "
            f"its starting value ({float(found.start_scores[rows[0]]):.3g}) on {found.starts} "
            "random start(s), with the redirected ReLU gradient in each start's first steps: "
            "the gradient never reached the image (a unit closed for every image tried, or one "
            "the input cannot change); the image returned is its unoptimised start, not a "
            "feature. Try more restarts=, redirect_steps=, steps= or lr=, or another layer",
            UnmovedObjectiveWarning,
        )
    return found.images


def feature_images(
    model: nn.Module,
    objective: Objective,
    *,
    size: int | tuple[int, int] = 224,
    batch: int = 1,
    steps: int = 256,
    lr: float = 0.05,
    seed: int = 0,
    diversity_weight: float = 0.0,
    diversity_layer: str | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    transforms: bool = True,
    redirect_steps: int = 64,
    restarts: int = 2,
    output: OutputSelector = None,
    progress: bool = False,
) -> FeatureImages:
    """``(batch, 3, H, W)`` images in [0, 1] that maximise ``objective``
    (:class:`ChannelObjective`, :class:`NeuronObjective`, :class:`LogitObjective`), optimised
    for ``steps`` Adam steps of rate ``lr`` from a seeded random spectrum.

    ``mean``/``std``: the model's input normalisation (default: what the model carries,
    :func:`camkit.models.preprocess_of`, else none); ``diversity_weight``: the weight of the
    diversity term at ``diversity_layer`` (default the objective's layer) for ``batch > 1``;
    ``transforms=False`` switches the robustness off; ``redirect_steps``: the first steps of each
    start use the redirected ReLU gradient (0: never); ``restarts``: how many times an image
    unmoved after ``max(redirect_steps, 1)`` steps starts again (within the ``steps``);
    ``progress``: a progress bar.
    """
    require_autograd("feature visualisation")
    model = explained_module(model)
    size = as_size(size)
    batch, steps = positive_int("batch", batch), positive_int("steps", steps)
    seed = seed_value(seed)
    for name, value in (("redirect_steps", redirect_steps), ("restarts", restarts)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ArgumentError(f"{name} must be an int >= 0, got {value!r}")
    if not isinstance(objective, Objective):
        raise ArgumentError(
            "objective must be a ChannelObjective, NeuronObjective or LogitObjective, got "
            f"{type(objective).__name__}"
        )
    layers = [name for name in (objective.layer, diversity_layer) if name is not None]
    if diversity_weight and batch > 1 and not layers:
        raise ArgumentError("the diversity term needs diversity_layer= for a LogitObjective")
    found = find_layers(model, list(dict.fromkeys(layers))) if layers else []
    param = next(model.parameters())
    generator = torch.Generator().manual_seed(seed)
    shape = (batch, 3, size[0], size[1] // 2 + 1)
    starts = _start(shape, generator, param.device)  # each image's latest start
    spectrum = starts.clone().requires_grad_(True)
    if mean is None and std is None and (carried := carried_preprocess(model)) is not None:
        mean, std = carried.mean, carried.std  # the normalisation the model says it expects
    normalise = _normalisation(mean, std, param)
    optimiser = torch.optim.Adam([spectrum], lr=lr)
    layouts: dict[str, Layout | None] = {}
    track = _Tracker(batch, max(redirect_steps, 1), restarts, param.device)
    with progress_of(steps, "feature visualisation", "step", enabled=progress) as shown:
        for step in range(steps):
            with torch.enable_grad():
                image = fourier_image(spectrum, size)
                seen = robust(image, size, generator) if transforms else image
                redirect = redirected_relu() if track.age < redirect_steps else nullcontext()
                captured = capture_outputs(model, found, start_graph=False)
                with model_guarded(model), captured as taps, redirect:
                    out = model(normalise(seen).to(param.dtype))
                acts = dict(zip([n for n, _ in found], single_call(taps), strict=True))
                if not layouts:  # the same shapes at every step: read them once
                    layouts = {n: layer_layout(a.shape, model, size) for n, a in acts.items()}
                acts = {n: channels_first(a, layouts[n]) for n, a in acts.items()}
                logits = class_logits(out, output) if isinstance(objective, LogitObjective) else out
                scores = objective.score(acts.get(objective.layer), logits)
                loss = -scores.sum()
                if diversity_weight and batch > 1:
                    loss = loss - diversity_weight * diversity(
                        acts[diversity_layer or objective.layer]
                    )
                (grad,) = torch.autograd.grad(loss, spectrum)
            spectrum.grad = grad
            optimiser.step()
            spectrum.grad = None
            stuck = track.update(scores.detach(), last=step == steps - 1)
            if stuck is not None:  # new random starts for the images that did not move
                with torch.no_grad():
                    starts[stuck] = _start(shape, generator, param.device)[stuck]
                    spectrum[stuck] = starts[stuck]
                for moment in optimiser.state[spectrum].values():
                    if moment.dim():
                        moment[stuck] = 0
            shown.update(1)
    with torch.no_grad():
        found = torch.where(track.moved.view(-1, 1, 1, 1), spectrum, starts)
        images = fourier_image(found, size).detach()
    return FeatureImages(images, track.moved, track.first, track.used + 1)


def _start(shape: tuple[int, ...], generator: torch.Generator, device: torch.device) -> Tensor:
    """A random spectrum, ``0.01`` times complex normal noise (lucid's ``fft_image`` start)."""
    draw = torch.complex(
        torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
    )
    return (0.01 * draw).to(device)


class _Tracker:
    """Whether each image's objective has moved since its start, and when to start it again:
    after ``patience`` steps unmoved, ``restarts`` times."""

    def __init__(self, batch: int, patience: int, restarts: int, device: torch.device):
        self.patience, self.left, self.used = patience, restarts, 0
        self.age = 0  # steps since the last (re)start
        self.first = torch.zeros(batch, device=device)
        self.fresh = torch.ones(batch, dtype=torch.bool, device=device)  # start value not set
        self.moved = torch.zeros(batch, dtype=torch.bool, device=device)

    def update(self, scores: Tensor, last: bool) -> Tensor | None:
        """Record one step's objective ``(B,)``; the rows to start again (or None)."""
        scores = scores.float()
        self.first = torch.where(self.fresh, scores, self.first)
        self.fresh[:] = False
        self.moved |= (scores - self.first).abs() > 1e-6 * self.first.abs().clamp(min=1)
        self.age += 1
        if self.age < self.patience or self.moved.all() or not self.left or last:
            return None
        self.left, self.used, self.age = self.left - 1, self.used + 1, 0
        self.fresh = ~self.moved
        return self.fresh.nonzero().flatten()


def _normalisation(mean: Sequence[float] | None, std: Sequence[float] | None, like: Tensor):
    if mean is None and std is None:
        return lambda image: image
    m = torch.tensor(mean if mean is not None else (0.0, 0.0, 0.0), device=like.device)
    s = torch.tensor(std if std is not None else (1.0, 1.0, 1.0), device=like.device)
    return lambda image: (image - m.view(1, -1, 1, 1)) / s.view(1, -1, 1, 1)


__all__ = [
    "ChannelObjective",
    "FeatureImages",
    "LogitObjective",
    "NeuronObjective",
    "diversity",
    "feature_images",
    "fourier_image",
    "robust",
    "visualize",
]
