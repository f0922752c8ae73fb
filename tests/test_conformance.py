"""The conformance matrix: every registered method on every model kind, one promise
per test, and the defects the one-Explainer work fixed as plain tests.

Cells are ``(check, method, kind)``: ``method`` runs over :data:`camkit.METHODS` (a method gets the
whole matrix by registering), ``kind`` over :data:`matrix_kit.KINDS`. A cell either keeps the
promise, or the method refuses the model up front with a clear camkit error listed in
:data:`REFUSALS` (the test then asserts the error's type and message).

:data:`KNOWN_DEFECTS` marks the cells that fail on today's code, one entry per defect, as
``xfail(strict=True)``: when a change fixes a defect its cells XPASS, which fails the run, and
the entry is to be deleted.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterable
from typing import Any

import pytest
import torch
from matrix_kit import KINDS, Kind, Tripwire, assert_untouched, model_state, tripwire
from torch import Tensor

import camkit
import camkit.metrics
from camkit import registry
from camkit.errors import (
    ArgumentError,
    AttentionError,
    CamkitError,
    ClassifierNotFoundError,
    EmptyMapWarning,
    InputError,
    LayerOutputError,
    TargetError,
)
from camkit.targets import ClassTarget

ALL = "*"
CNNS = {
    "cnn",
    "volume",
    "two-input",
    "dataparallel",
    "gray",
    "keyword",
    "shared-layer",
    "train-mode",
}
CHECKS = (
    "default-layer",
    "explicit-layer",
    "shapes",
    "class-target",
    "tensor-target",
    "batch-size",
    "flags",
    "untouched",
    "untouched-after-error",
)
# a blank map would make the comparisons below pass whatever the method computes
pytestmark = pytest.mark.filterwarnings("error::camkit.errors.EmptyMapWarning")

FAMILIES = {"gradient-cam", "perturbation-cam", "pixel", "attention"}


def _by_family(*families: str) -> set[str]:
    return {name for name, m in camkit.METHODS.items() if m.family in families}


def _layered() -> set[str]:
    return {name for name, m in camkit.METHODS.items() if m.needs_layer}


def _seeded() -> set[str]:
    return {name for name, m in camkit.METHODS.items() if m.seeded}


def _names(*names: str) -> frozenset[str]:
    """Registered method names (a name that is not registered is an error, so that the tables
    below follow the registry)."""
    missing = set(names) - set(camkit.METHODS)
    assert not missing, f"not registered: {missing}"
    return frozenset(names)


def _all_but(*checks: str) -> frozenset[str]:
    return frozenset(CHECKS) - set(checks)


PERTURBATION = _names("scorecam", "ablationcam", "sscam", "iscam", "reciprocam")

# (methods, kinds, checks) -> (error type, message pattern): the method cannot explain the kind
# and says so with this clear camkit error, which the cell asserts
REFUSALS: dict[tuple[Any, Any, Any], tuple[type[Exception], str]] = {
    (_names("rollout", "legrad"), frozenset(CNNS), ALL): (
        AttentionError,
        "has no supported attention blocks",
    ),
    # windowed attention: the probabilities cover one window each, not the image
    (_names("rollout", "legrad"), frozenset({"swin"}), ALL): (
        AttentionError,
        "is windowed attention",
    ),
    # Recipro-CAM masks the layer's own spatial axes: it cannot undo a token / channels-last
    # reading (Ablation-CAM ablates channels in the layer's own layout)
    (_names("reciprocam"), frozenset({"vit", "swin", "tokens-after"}), ALL): (
        LayerOutputError,
        "cannot undo reshape=",
    ),
    # Recipro-CAM's 3x3 position masks are 2-D (Score-CAM's family and Ablation-CAM take volumes)
    (_names("reciprocam"), frozenset({"volume"}), ALL): (
        LayerOutputError,
        r"needs a 2-D layer map .* use a gradient CAM for volumes",
    ),
    (_names("sess"), frozenset({"volume"}), ALL): (InputError, r"SESS maps images \(B, C, H, W\)"),
    (_names("cam"), frozenset({"two-input"}), ALL): (
        ClassifierNotFoundError,
        "cannot find the classifier of the model automatically",
    ),
    # RefineCAM multiplies the maps of several layers: the one default layer is not enough
    (_names("refinecam"), ALL, frozenset({"default-layer"})): (ArgumentError, "at least two"),
    # the explicit Swin layer is the first stage's: not the one pooled into the classifier
    (_names("cam"), frozenset({"swin"}), _all_but("default-layer")): (
        LayerOutputError,
        "the classifier 'head.fc' takes 24 features but layer 'layers.0.blocks.0.norm1' has 12",
    ),
}

LAYERED = frozenset(_layered())

# defect -> the cells (methods, kinds, checks) it fails today, or a list of such rules; delete
# an entry when a change fixes it (its cells then XPASS, which fails the run)
KNOWN_DEFECTS: dict[str, Any] = {}


def _matches(rule: tuple[Any, Any, Any], cell: tuple[str, str, str]) -> bool:
    return all(part == ALL or value in part for part, value in zip(rule, cell, strict=True))


def _listed(rules: Any) -> list[tuple[Any, Any, Any]]:
    return rules if isinstance(rules, list) else [rules]


def _refusal(check: str, method: str, kind: str) -> tuple[type[Exception], str] | None:
    for rule, refusal in REFUSALS.items():
        if _matches(rule, (method, kind, check)):
            return refusal
    return None


def _cells(check: str, methods: Iterable[str] | None = None, kinds: Iterable[str] = KINDS):
    """``pytest.param(method, kind)`` for every cell of ``check``, xfail where a defect is known."""
    cells = []
    for method in methods or camkit.METHODS:
        for kind in kinds:
            reasons = [
                reason
                for reason, rules in KNOWN_DEFECTS.items()
                if any(_matches(rule, (method, kind, check)) for rule in _listed(rules))
                # a refusing cell is marked only where its defect hides the refusal today: one
                # that needs the default layer
                and (check == "default-layer" or not _refusal(check, method, kind))
            ]
            marks = [pytest.mark.xfail(strict=True, reason="; ".join(reasons))] if reasons else []
            cells.append(pytest.param(method, kind, marks=marks, id=f"{method}-{kind}"))
    return cells


# ----------------------------------------------------------------------------- running a cell

# options that keep a method fast on the tiny models, given by the option's name (so that a new
# method with such an option gets them too); a seed makes stochastic methods repeatable
FAST = {"seed": 0, "samples": 2, "steps": 2, "window": 32, "scales": (32, 48), "references": 2}
K_TARGETS = [[1, 2], [3, 4]]


def _options(cls: type) -> set[str]:
    """The keyword options of a method's constructor, through ``**options`` to its bases."""
    names = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None:
            names |= {
                p.name
                for p in inspect.signature(init).parameters.values()
                if p.kind == p.KEYWORD_ONLY
            }
    return names


def _build(method: str, kind: Kind, model, layer: Any = "explicit", **options: Any):
    """The method on the model: ``layer="explicit"`` names the kind's explicit layer (a layered
    method; an attention method gets the kind's blocks), ``None`` leaves the layer out."""
    entry = camkit.METHODS[method]
    fast = {k: v for k, v in FAST.items() if k in _options(entry.cls)}
    if not entry.seeded:  # every method's constructor has seed=; only the seeded ones take it
        fast.pop("seed", None)
    options = fast | options
    if layer == "explicit":
        if entry.needs_layer:
            layer = [kind.layer, _second_layer(kind)] if method in SEVERAL_LAYERS else kind.layer
        elif entry.family == "attention" and kind.blocks:
            return entry.cls(model, kind.blocks, **options)
        else:
            layer = None
    if layer is None:
        return entry.cls(model, **options)
    return entry.cls(model, layer, **options)


SEVERAL_LAYERS = _names("refinecam")  # methods that need at least two layers


def _second_layer(kind: Kind) -> str:
    """A second layer for the methods that fuse several (RefineCAM)."""
    second = {
        "vit": "blocks.1.norm1",
        "swin": "layers.1.blocks.0.norm1",
        "tokens-after": "blocks.1.norm1",
        "shared-layer": "conv2",
        "train-mode": "features.2",
    }
    return second.get(kind.name, kind.layer.replace("features.5", "features.2"))


# methods whose maps may be blank by design (they are not an error there)
BLANK_ALLOWED = {
    "random": "a random baseline: an all-negative weighting is one of its draws",
    # the kinds' random classifiers are near uniform: Recipro-CAM's probabilities vary by 1e-4
    # to 6e-4 of their value over the positions, flat by core.finish.FLAT_SPREAD (zeros and
    # one EmptyMapWarning, the same for every batch size); real maps: test_perturb_variants
    "reciprocam": "flat on near-uniform random classifiers (the flat-map policy)",
}


# random transformers: a token layer's Grad-CAM can be negative everywhere for a class (then
# blank after the ReLU), a property of the weights, not of the method
BLANK_KINDS = {"vit", "swin", "tokens-after"}


def _call(explainer, kind: Kind, x: Tensor, target: Any = None, **options: Any) -> Tensor:
    batch = x.shape[0] if x.ndim == len(kind.shape) + 1 else 1
    with warnings.catch_warnings():
        if getattr(explainer, "name", None) in BLANK_ALLOWED or kind.name in BLANK_KINDS:
            warnings.simplefilter("ignore", EmptyMapWarning)
        return explainer(x, target, **kind.call_options(batch), **options)


def _expected_shape(method: str, kind: Kind, batch: int | None, targets: int | None) -> tuple:
    """``(H, W)`` for one image, ``(B, H, W)``, ``(B, K, H, W)``; pixel methods keep ``C``."""
    per_map = kind.shape if camkit.METHODS[method].family == "pixel" else kind.spatial
    lead = () if batch is None else (batch,) if targets is None else (batch, targets)
    return (*lead, *per_map)


def _close(a: Tensor, b: Tensor) -> None:
    """Equal within float32 accuracy."""
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def _refused(check: str, method: str, kind: str) -> bool:
    """Assert the cell's declared refusal, if any: the method raises its clear error when built
    and run on the kind."""
    refusal = _refusal(check, method, kind)
    if refusal is None:
        return False
    error, pattern = refusal
    spec = KINDS[kind]
    layer = None if check == "default-layer" else "explicit"
    with pytest.raises(error, match=pattern):
        _call(_build(method, spec, spec.model(), layer=layer), spec, spec.input())
    return True


def _cell(check: str, method: str, kind: str) -> tuple[Kind, torch.nn.Module, Tensor] | None:
    """The kind, a fresh model and the input of a cell; None for a refusing cell (after
    asserting its refusal)."""
    if _refused(check, method, kind):
        return None
    spec = KINDS[kind]
    return spec, spec.model(), spec.input()


# ----------------------------------------------------------------------------- the matrix


@pytest.mark.parametrize(("method", "kind"), _cells("default-layer"))
def test_default_layer(method: str, kind: str) -> None:
    """``layer`` left out: the model's default layer (the kind's, known by hand; the one
    ``camkit.models.default_layer`` gives, see the test below) is used and ``cam.layers`` says
    so; maps of a batch are ``(B, *spatial)``."""
    if (cell := _cell("default-layer", method, kind)) is None:
        return
    spec, model, x = cell
    explainer = _build(method, spec, model, layer=None)
    _check_shape(_call(explainer, spec, x), _expected_shape(method, spec, 2, None))
    if camkit.METHODS[method].needs_layer:
        assert [layer.removeprefix("module.") for layer in explainer.layers] == [spec.default]


@pytest.mark.parametrize("kind", list(KINDS))
def test_models_default_layer_knows_every_kind(kind: str) -> None:
    """``camkit.models.default_layer`` (what ``camkit layers`` marks), traced with the kind's
    own input (and its extra inputs), names each kind's default layer, the one ``layer=None``
    uses."""
    spec = KINDS[kind]
    x, extra = spec.input(), spec.call_options(2).get("additional_forward_args")
    example = x if extra is None else (x, *extra)
    default = camkit.models.default_layer(spec.model(), example=example)
    assert default.removeprefix("module.") == spec.default


@pytest.mark.parametrize(("method", "kind"), _cells("explicit-layer"))
def test_explicit_layer(method: str, kind: str) -> None:
    """A layer named explicitly is the one used (``cam.layers``)."""
    if (cell := _cell("explicit-layer", method, kind)) is None:
        return
    spec, model, x = cell
    explainer = _build(method, spec, model)
    _check_shape(_call(explainer, spec, x), _expected_shape(method, spec, 2, None))
    if camkit.METHODS[method].needs_layer:
        layers = [spec.layer, _second_layer(spec)] if method in SEVERAL_LAYERS else [spec.layer]
        assert [layer.removeprefix("module.") for layer in explainer.layers] == layers


def _check_shape(maps: Any, shape: tuple) -> None:
    assert isinstance(maps, Tensor), f"expected a tensor, got {type(maps).__name__}"
    assert tuple(maps.shape) == shape
    assert maps.dtype == torch.float32
    assert torch.isfinite(maps).all()


@pytest.mark.parametrize(("method", "kind"), _cells("shapes"))
def test_shapes(method: str, kind: str) -> None:
    """One image ``-> (H, W)``, a batch ``-> (B, H, W)``, K targets ``-> (B, K, H, W)`` (pixel
    methods keep the channel axis); the one-image map is the batch's first map."""
    if (cell := _cell("shapes", method, kind)) is None:
        return
    spec, model, x = cell
    explainer = _build(method, spec, model)
    batch = _call(explainer, spec, x, 3)
    _check_shape(batch, _expected_shape(method, spec, 2, None))
    several = _call(explainer, spec, x, K_TARGETS)
    _check_shape(several, _expected_shape(method, spec, 2, 2))
    if spec.volume:
        return
    one = _call(explainer, spec, x[0], 3)
    _check_shape(one, _expected_shape(method, spec, None, None))
    if method not in _seeded():  # a seeded method's draws depend on the batch's shape
        _close(one, batch[0])


@pytest.mark.parametrize(("method", "kind"), _cells("class-target"))
def test_class_target_equals_its_int(method: str, kind: str) -> None:
    """``ClassTarget(c)`` gives the same maps as ``c``."""
    if (cell := _cell("class-target", method, kind)) is None:
        return
    spec, model, x = cell
    explainer = _build(method, spec, model)
    _close(_call(explainer, spec, x, ClassTarget(3)), _call(explainer, spec, x, 3))


@pytest.mark.parametrize(("method", "kind"), _cells("tensor-target"))
def test_tensor_target_equals_its_list(method: str, kind: str) -> None:
    """A ``(B,)`` tensor target gives the same maps as the list of its classes, and a ``(B, K)``
    tensor as the list of lists."""
    if (cell := _cell("tensor-target", method, kind)) is None:
        return
    spec, model, x = cell
    explainer = _build(method, spec, model)
    _close(_call(explainer, spec, x, torch.tensor([1, 2])), _call(explainer, spec, x, [1, 2]))
    _close(_call(explainer, spec, x, torch.tensor(K_TARGETS)), _call(explainer, spec, x, K_TARGETS))


@pytest.mark.parametrize(("method", "kind"), _cells("batch-size"))
def test_batch_size_does_not_change_the_maps(method: str, kind: str) -> None:
    """``batch_size=1`` equals ``batch_size=None`` (seeded methods with the same seed)."""
    if (cell := _cell("batch-size", method, kind)) is None:
        return
    spec, model, x = cell
    chunked = _call(_build(method, spec, model, batch_size=1), spec, x, K_TARGETS)
    whole = _call(_build(method, spec, model, batch_size=None), spec, x, K_TARGETS)
    # float32 accuracy of a map in [0, 1]: other batch sizes run other kernels, and the
    # transformers' perturbation scores differ in their last bits (softmax over channels)
    torch.testing.assert_close(chunked, whole, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("method", "kind"), _cells("flags"))
def test_registry_flags_match_the_method(method: str, kind: str) -> None:
    """The registry's flags say what the method does: its family is a known one, an instance
    needs gradients as the registry says, a method that needs none runs (the same) inside
    ``torch.no_grad()``, and one that shares :func:`camkit.cams`' pass gives its own maps there."""
    entry = camkit.METHODS[method]
    assert entry.family in FAMILIES
    if (cell := _cell("flags", method, kind)) is None:
        return
    spec, model, x = cell
    explainer = _build(method, spec, model)
    assert explainer.needs_gradients == entry.needs_gradients
    maps = _call(explainer, spec, x, 3)
    if not entry.needs_gradients:
        with torch.no_grad():
            _close(_call(explainer, spec, x, 3), maps)
    if entry.shares_pass:
        with warnings.catch_warnings():
            if kind in BLANK_KINDS:
                warnings.simplefilter("ignore", EmptyMapWarning)
            options = spec.call_options(2)
            shared = camkit.cams(model, spec.layer, x, 3, methods=[method], **options)
        _close(shared[method], maps)


@pytest.mark.parametrize(("method", "kind"), _cells("untouched"))
def test_model_left_untouched(method: str, kind: str) -> None:
    """No hook (module, tensor or global), no ``.grad``, no ``requires_grad``/``training``/
    ``inplace``/``fused_attn`` change is left on the model; the input is not changed."""
    if (cell := _cell("untouched", method, kind)) is None:
        return
    spec, model, x = cell
    before, image = model_state(model), x.clone()
    explainer = _build(method, spec, model)
    _call(explainer, spec, x, K_TARGETS)
    _call(explainer, spec, x[:1] if spec.volume else x[0])
    assert_untouched(model, before)
    assert torch.equal(x, image) and x.grad is None and not x.requires_grad


@pytest.mark.parametrize(("method", "kind"), _cells("untouched-after-error"))
def test_model_left_untouched_after_an_error_in_the_forward(method: str, kind: str) -> None:
    """The model's forward raises (a flag set after the method was built): the error comes
    through and the model is left as it was."""
    if (cell := _cell("untouched-after-error", method, kind)) is None:
        return
    spec, model, x = cell
    before = model_state(model)
    explainer = _build(method, spec, model)
    with tripwire(model), pytest.raises(Tripwire):
        _call(explainer, spec, x, K_TARGETS)
    assert_untouched(model, before)


@pytest.mark.parametrize("method", list(camkit.METHODS))
def test_options_are_keyword_only(method: str) -> None:
    """Constructor options come after ``model`` (and ``layer``) as keywords only, call options
    after the input (and the target) likewise."""
    cls = camkit.METHODS[method].cls
    init = list(inspect.signature(cls).parameters.values())
    positional = [p.name for p in init if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    assert positional in (["model"], ["model", "layer"], ["model", "layers"]), positional
    assert (positional[1:] != []) == camkit.METHODS[method].needs_layer or method in _by_family(
        "attention"
    )
    call = list(inspect.signature(cls.__call__).parameters.values())
    positional = [p.name for p in call if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    assert positional[:2] == ["self", "x"] and positional[2:] in ([], ["target"]), positional


# ----------------------------------------------------------------------------- the listed defects


def _cnn() -> tuple[torch.nn.Module, Tensor]:
    spec = KINDS["cnn"]
    return spec.model(), spec.input()


def test_scorecam_and_guided_gradcam_read_vit_tokens_by_default() -> None:
    """Score-CAM and Guided Grad-CAM read a timm ViT layer's tokens as Grad-CAM does
    (``reshape="auto"`` by default): the same maps as with ``reshape="auto"`` given, and Guided
    Grad-CAM is guided backpropagation times the Grad-CAM map."""
    spec = KINDS["vit"]
    vit, x = spec.model(), spec.input()
    layer = "blocks.1.norm1"
    with warnings.catch_warnings():  # a random ViT may give a blank map (BLANK_KINDS)
        warnings.simplefilter("ignore", EmptyMapWarning)
        scored = camkit.ScoreCAM(vit, layer)(x, 3)
        _close(scored, camkit.ScoreCAM(vit, layer, reshape="auto")(x, 3))
        guided = camkit.GuidedBackprop(vit)(x, 3) * camkit.GradCAM(vit, layer)(x, 3)[:, None]
        _close(camkit.GuidedGradCAM(vit, layer)(x, 3), guided)


def test_class_target_equals_its_int_in_cam_and_in_deletion() -> None:
    """``ClassTarget(3)`` is ``3`` for CAM (the classifier's weights) and for the deletion
    metric, which scores the class's probability for both."""
    model, x = _cnn()
    cam = camkit.CAM(model, "features")
    _close(cam(x, ClassTarget(3)), cam(x, 3))
    maps = camkit.GradCAM(model, "features")(x, 3)
    by_int = camkit.metrics.deletion(model, x, maps, 3, steps=4)
    _close(camkit.metrics.deletion(model, x, maps, ClassTarget(3), steps=4), by_int)


class _BakedIn(torch.nn.Module):
    """The two-input model with its side input fixed: a one-input model to compare with."""

    def __init__(self, net: torch.nn.Module, extra: Tensor):
        super().__init__()
        self.net, self.extra = net, extra

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x, self.extra)


def test_fullgrad_takes_additional_forward_args() -> None:
    """FullGrad passes ``additional_forward_args`` to the model as every family does: the map
    equals FullGrad's on the same model with the side input built in."""
    spec = KINDS["two-input"]
    model, x = spec.model(), spec.input()
    (extra,) = spec.extra(2)
    maps = camkit.FullGrad(model)(x, 3, additional_forward_args=(extra,))
    _close(maps, camkit.FullGrad(_BakedIn(model, extra))(x, 3))


@pytest.mark.parametrize("method", sorted(camkit.METHODS))
def test_a_tuple_of_inputs(method: str) -> None:
    """Methods with ``several_inputs`` attribute ``(image, side)`` of the two-input model, one
    attribution per input: the image's equals its attribution with the side input passed as
    ``additional_forward_args`` (the model is additive in it), the side input's is exact (the
    side head is linear: its gradient is the target's weight row, IG's is ``side * row``, and
    LRP's too under ``epsilon-plus-flat``: the Norm rule gives the sum's side term its own
    value, which Epsilon with the bias passes on, the stabiliser aside; the default composite
    drops the bias from the rule). The other methods refuse the tuple and say where the other
    inputs go."""
    spec = KINDS["two-input"]
    model, x = spec.model(), spec.input()
    (side,) = spec.extra(2)
    entry = camkit.METHODS[method]
    if not entry.several_inputs:
        other = KINDS["vit" if entry.family == "attention" else "cnn"]
        with pytest.raises(InputError, match="additional_forward_args"):
            _build(method, other, other.model())((x, side), 3)
        return
    with_bias = {"composite": "epsilon-plus-flat"} if method == "lrp" else {}
    explainer = _build(method, spec, model, **with_bias)
    image, side_attr = explainer((x, side), 3)
    _close(image, _call(explainer, spec, x, 3))
    row = model.side.weight[3].detach().expand_as(side)
    _close(side_attr, side * row if method in ("ig", "lrp") else row)
    one_image, one_side = explainer((x[0], side[0]), 3)  # one sample: no batch axis anywhere
    _close(one_image, image[0])
    _close(one_side, side_attr[0])


def test_refinecam_instance_flags_agree_with_the_registry() -> None:
    """A wrapper CAM does not rewrite its class's metadata per instance: the registry and the
    instance agree on whether it needs gradients."""
    model, _ = _cnn()
    cam = camkit.RefineCAM(model, ["features.0", "features.3"], base=camkit.EigenCAM)
    assert cam.needs_gradients == registry.get("refinecam").needs_gradients


@pytest.mark.parametrize("method", list(camkit.METHODS))
def test_batch_size_is_keyword_only_everywhere(method: str) -> None:
    """``batch_size`` is a keyword-only constructor option of every method, and no call takes
    it (one meaning: rows per forward pass)."""
    cls = camkit.METHODS[method].cls
    assert "batch_size" in _options(cls)
    assert "batch_size" not in inspect.signature(cls.__call__).parameters


def test_gradcam_without_a_layer_uses_the_default_layer() -> None:
    model, x = _cnn()
    cam = camkit.GradCAM(model)
    maps = cam(x, 3)  # the default layer is traced with the call's input
    default = camkit.models.default_layer(model, (32, 32))
    assert cam.layers == [default] == ["features"]
    _close(maps, camkit.GradCAM(model, default)(x, 3))


def test_a_list_of_per_sample_callables() -> None:
    """pytorch-grad-cam's targets, one callable per sample on that sample's output row
    (``ClassifierOutputTarget``): taken as those classes, or refused with a TargetError whose
    message shows the camkit form (``target=...``)."""
    model, x = _cnn()
    cam = camkit.GradCAM(model, "features")
    callables = [lambda o: o[1], lambda o: o[2]]
    try:
        maps = cam(x, callables)
    except TargetError as err:
        assert "callable" in str(err) and "target=" in str(err), str(err)
    else:
        _close(maps, cam(x, [1, 2]))


def test_a_callable_that_indexes_the_batch_as_a_row() -> None:
    """``lambda o: o[281]`` (a per-sample habit) on ``(B, 10)`` logits: a clear TargetError."""
    model, x = _cnn()
    with pytest.raises(TargetError):
        camkit.GradCAM(model, "features")(x, lambda o: o[281])


class _TinyDetector(torch.nn.Module):
    """A torchvision-style detector of one box: ``A = ReLU(conv1x1(x))`` with the identity
    kernel (``A_c = x_c``); label 1 in ``BOX`` is detected while ``mean(A_0) > 0.3``, with score
    ``(mean(A_0) + mean(A_1)) / 2``; otherwise nothing is detected."""

    BOX = torch.tensor([0.0, 0.0, 8.0, 8.0])

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 2, 1, bias=False)
        self.relu = torch.nn.ReLU()
        with torch.no_grad():
            self.conv.weight.copy_(torch.eye(2).view(2, 2, 1, 1))

    def forward(self, x: Tensor) -> list[dict[str, Tensor]]:
        means = self.relu(self.conv(x)).mean(dim=(2, 3))
        found = []
        for row in means:
            if row[0] > 0.3:
                found.append(
                    {
                        "boxes": self.BOX[None],
                        "labels": torch.ones(1, dtype=torch.long),
                        "scores": (row.sum() / 2)[None],
                    }
                )
            else:
                found.append(
                    {
                        "boxes": torch.zeros(0, 4),
                        "labels": torch.zeros(0, dtype=torch.long),
                        "scores": torch.zeros(0),
                    }
                )
        return found


def _box_image() -> Tensor:
    """Channel 0: 1 on the left half, 0 on the right (mean 0.5); channel 1: 1 everywhere."""
    image = torch.ones(1, 2, 4, 4)
    image[0, 0, :, 2:] = 0
    return image


RAW = {"relu": False, "upsample": False, "normalize": False}


def test_box_target_a_perturbed_copy_that_loses_the_detection_scores_zero() -> None:
    """Clean score ``y = (0.5 + 1) / 2 = 0.75``. Ablation-CAM: zeroing channel 0 loses the
    detection (score 0, ``w_0 = 1``), zeroing channel 1 leaves ``0.25`` (``w_1 = 2/3``): the map
    ``A_0 + 2/3 A_1`` is 5/3 on the left, 2/3 on the right. Score-CAM: channel 1's map is
    constant, its mask 0 and the masked image loses the detection (score 0); channel 0's mask
    keeps the left half, score ``(0.5 + 0.5) / 2 = 0.5``; ``w = softmax(0.5, 0)``."""
    detector, image = _TinyDetector().eval(), _box_image()
    target = camkit.targets.BoxTarget(1, _TinyDetector.BOX)
    left = torch.zeros(4, 4, dtype=torch.bool)
    left[:, :2] = True
    ablation = camkit.AblationCAM(detector, "relu")(image, target, **RAW)[0]  # one image
    _close(ablation, torch.where(left, 5 / 3, 2 / 3))
    w = torch.tensor([0.5, 0.0]).softmax(0)
    score = camkit.ScoreCAM(detector, "relu")(image, target, **RAW)[0]
    _close(score, torch.where(left, w[0] + w[1], w[1]))


def test_box_target_errors_name_the_users_samples() -> None:
    """Sample 1 of the user's batch has no detection: an error names sample 1 (never a
    perturbed copy), or its map is finite."""
    detector, image = _TinyDetector().eval(), _box_image()
    batch = torch.cat([image, image * torch.tensor([0.0, 1.0]).view(1, 2, 1, 1)])
    target = camkit.targets.BoxTarget(1, _TinyDetector.BOX)
    for method in (camkit.AblationCAM, camkit.ScoreCAM):
        try:
            maps = method(detector, "relu")(batch, target)
        except TargetError as err:
            assert "sample 1" in str(err) and "sample 0" not in str(err), str(err)
        else:
            assert torch.isfinite(maps).all()


def test_bool_in_a_class_list_is_refused() -> None:
    model, x = _cnn()
    with pytest.raises(TargetError):
        camkit.GradCAM(model, "features")(x, [0, True])
    with pytest.raises(TargetError):
        camkit.GradCAM(model, "features")(x, True)


def test_deletion_on_a_5x5_image_with_the_blur_baseline() -> None:
    """Smaller than the blur kernel: a finite AUC in [0, 1] or a clear camkit error."""
    model, _ = _cnn()
    x = torch.rand(1, 3, 5, 5, generator=torch.Generator().manual_seed(0))
    maps = torch.rand(1, 5, 5, generator=torch.Generator().manual_seed(1))
    try:
        auc = camkit.metrics.deletion(model, x, maps, 3, steps=5)
    except CamkitError:
        return
    assert torch.isfinite(auc).all() and ((auc >= 0) & (auc <= 1)).all()


def test_gradcam_as_a_context_manager() -> None:
    """``with GradCAM(model, layer) as cam:`` (pytorch-grad-cam's form) gives the same maps and
    leaves the model as it was."""
    model, x = _cnn()
    before = model_state(model)
    with camkit.GradCAM(model, "features") as cam:
        maps = cam(x, 3)
    _close(maps, camkit.GradCAM(model, "features")(x, 3))
    assert_untouched(model, before)


def _minmax(t: Tensor) -> Tensor:
    low, high = t.amin(dim=(-2, -1), keepdim=True), t.amax(dim=(-2, -1), keepdim=True)
    return (t - low) / (high - low)


@pytest.mark.parametrize(
    ("fuse", "scale"),
    [("max", lambda m: m), ("tanh", lambda m: torch.tanh(2 * m))],
    ids=["max", "tanh"],
)
def test_layer_fusion_max_with_layercams_tanh_scaling(fuse, scale) -> None:
    """``fuse="max"`` is torchcam's fusion: the pixel-wise maximum of the layers' finished maps;
    ``fuse="tanh"`` scales each first by LayerCAM's ``tanh(2 M)`` (Jiang et al. 2021 eq. 9,
    torchcam's ``LayerCAM._scale_cams``)."""
    model, x = _cnn()
    cam = camkit.LayerCAM(model, ["features.0", "features.3"])
    apart = cam(x, 3, fuse=False)
    expected = torch.stack([scale(m) for m in apart.values()]).amax(0)
    _close(_minmax(cam(x, 3, fuse=fuse)), _minmax(expected))
