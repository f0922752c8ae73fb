"""Feature visualisation of a unit closed on the starting image (Olah et al., Distill 2017;
lucid's redirected ReLU gradient): the redirected backward by hand, a planted channel dead on
the start that is visualised above the data's best image (and above torch-lucent's result
after the same steps), restarts, and the warning when nothing moves the objective."""

from __future__ import annotations

import copy
import warnings
from collections import OrderedDict

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from matrix_kit import assert_untouched, model_state
from test_concepts_planted import planted_images
from torch import nn

from camkit import record
from camkit.errors import UnmovedObjectiveWarning
from camkit.methods.concepts.featurevis import ChannelObjective, visualize
from camkit.methods.concepts.redirect import redirected_relu

DEAD, SIDE = 5, 24


def planted_dead() -> nn.Sequential:
    """``(B, 3, H, W)`` -> 2 logits. ``l1`` (1x1 conv, ReLU): red, green, the magenta detector
    ``relu(0.5 R - 2 G + B - 0.5)`` (zero on grey, red and green) and brightness; ``l2`` (3x3
    conv, ReLU): channel 5 reads only the magenta detector, ``relu(0.5 sum_3x3 m - 0.2)``, the
    other channels small random weights. On a grey start both ReLUs on channel 5's path are
    closed: its gradient is exactly zero."""
    l1, l2, head = nn.Conv2d(3, 4, 1), nn.Conv2d(4, 8, 3, padding=1), nn.Linear(8, 2)
    generator = torch.Generator().manual_seed(0)
    detectors = [[1.0, -1, -1], [-1, 1, -1], [0.5, -2, 1], [1 / 3, 1 / 3, 1 / 3]]
    with torch.no_grad():
        l1.weight.copy_(torch.tensor(detectors)[:, :, None, None])
        l1.bias.copy_(torch.tensor([-0.3, -0.3, -0.5, 0.0]))
        weight = torch.rand(8, 4, 3, 3, generator=generator) * 0.2 - 0.1
        weight[DEAD] = 0
        weight[DEAD, 2] = 0.5
        l2.weight.copy_(weight)
        l2.bias.copy_(torch.zeros(8).index_fill(0, torch.tensor([DEAD]), -0.2))
        head.weight.copy_(torch.rand(2, 8, generator=generator))
        head.bias.zero_()
    return nn.Sequential(
        OrderedDict(
            l1=nn.Sequential(l1, nn.ReLU()),
            l2=nn.Sequential(l2, nn.ReLU(inplace=True)),
            pool=nn.AdaptiveAvgPool2d(1),
            flat=nn.Flatten(),
            head=head,
        )
    ).eval()


def channel_mean(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), record(model, "l2") as rec:
        model(images)
    return rec.activations["l2"][:, DEAD].flatten(1).mean(1)


def test_the_redirected_backward_by_hand() -> None:
    """Per sample: a sample whose plain ReLU gradient is not all zero keeps it (row 0); one whose
    plain gradient is zero gets ``g`` where the ReLU is closed unless ``g > 0`` (a descent
    step would push ``x`` further down; row 1). ReLU6 also blocks ``g < 0`` above 6 (row 2).
    The forward is the ReLU's, bitwise."""
    x = torch.tensor([[-1.0, 2.0, -3.0], [-1.0, -2.0, -3.0]], requires_grad=True)
    g = torch.tensor([[-1.0, 1.0, -2.0], [-1.0, 1.0, -2.0]])
    with redirected_relu() as mode:
        out = F.relu(x)
    assert torch.equal(out, x.relu()) and mode.rectifiers == 1
    (grad,) = torch.autograd.grad(out, x, g)
    torch.testing.assert_close(grad, torch.tensor([[0.0, 1.0, 0.0], [-1.0, 0.0, -2.0]]))
    x6 = torch.tensor([[7.0, 8.0, -1.0]], requires_grad=True)
    with redirected_relu():
        out6 = nn.ReLU6()(x6)
    (grad6,) = torch.autograd.grad(out6, x6, torch.tensor([[-1.0, 1.0, -1.0]]))
    torch.testing.assert_close(grad6, torch.tensor([[0.0, 1.0, -1.0]]))


def test_a_channel_dead_on_the_start_is_visualised_above_the_best_data_image() -> None:
    model = planted_dead()
    images, tagged = planted_images(6)
    data = channel_mean(model, images)
    best = float(data.max())
    assert best > 0 and data[~torch.as_tensor(tagged)].max() == 0  # only the tag opens it
    with pytest.warns(UnmovedObjectiveWarning, match=r"stayed at its starting value \(0\)"):
        grey = visualize(model, ChannelObjective("l2", DEAD), size=SIDE, steps=8, lr=0.2,
                         redirect_steps=0, restarts=0)  # fmt: skip
    assert channel_mean(model, grey) == 0 and grey.min() > 0.45 and grey.max() < 0.55
    state = model_state(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnmovedObjectiveWarning)
        image = visualize(model, ChannelObjective("l2", DEAD), size=SIDE, steps=96, lr=0.2)
    assert_untouched(model, state)
    assert channel_mean(model, image) > 1.5 * best
    # the detector reads blue and red over green: the image is magenta-ish
    assert (0.5 * image[0, 0] - 2 * image[0, 1] + image[0, 2]).mean() > 0


class _Constant(nn.Module):
    """Channel 0 is a constant: no image moves it."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 1)
        with torch.no_grad():
            self.conv.weight.zero_()
            self.conv.bias.fill_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x)).mean((2, 3))


def test_restarts_then_a_warning_when_nothing_moves_the_objective() -> None:
    model = _Constant()
    options = dict(size=8, steps=12, redirect_steps=4, seed=0)
    with pytest.warns(UnmovedObjectiveWarning, match=r"stayed at its starting value \(1\) on 3"):
        restarted = visualize(model, ChannelObjective("conv", 0), restarts=2, **options)
    with pytest.warns(UnmovedObjectiveWarning, match="on 1 random start"):
        once = visualize(model, ChannelObjective("conv", 0), restarts=0, **options)
    assert not torch.equal(restarted, once)  # the restarts drew new starts
    with pytest.raises(ValueError, match="restarts must be an int >= 0"):
        visualize(model, ChannelObjective("conv", 0), restarts=-1, **options)


def test_at_least_lucent_after_the_same_steps() -> None:
    """torch-lucent 0.1.8 (lucid's PyTorch port): its Fourier parameterisation, Adam at the same
    rate, its standard transformations without the rotation (which calls a kornia function the
    installed kornia no longer has), no ImageNet normalisation, the same image size; lucent has
    no redirected gradient, so the dead channel keeps its zero objective."""
    lucent_render = pytest.importorskip(
        "lucent.optvis.render",
        reason="torch-lucent is not usable: pip install --no-deps torch-lucent decorator kornia "
        "kornia-rs (its declared kornia<=0.4.1 would downgrade torch)",
    )
    from lucent.optvis import param, transform

    model, steps, lr = planted_dead(), 96, 0.2
    ours = channel_mean(model, visualize(model, ChannelObjective("l2", DEAD), size=SIDE,
                                         steps=steps, lr=lr))  # fmt: skip
    kept = np.random.get_state()
    try:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            np.random.seed(0)
            found = lucent_render.render_vis(
                copy.deepcopy(model),  # lucent leaves its hooks on the model
                f"l2:{DEAD}",
                param_f=lambda: param.image(SIDE),
                optimizer=lambda params: torch.optim.Adam(params, lr=lr),
                transforms=[t for t in transform.standard_transforms if "rotate" not in str(t)],
                thresholds=(steps,),
                preprocess=False,
                progress=False,
                show_image=False,
                fixed_image_size=SIDE,
            )
    finally:
        np.random.set_state(kept)
    theirs = channel_mean(model, torch.as_tensor(found[0]).permute(0, 3, 1, 2))
    assert ours >= theirs and ours > 0
