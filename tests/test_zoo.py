"""Issue 25's probe: 30 architectures camkit's other tests do not use (timm, torchvision and
HuggingFace, built from configs with random weights, small inputs). On each, Grad-CAM's default
call is compared with Grad-CAM written by hand on the default layer (known by hand, as is how
its output is read: a grid, tokens after a known number of prefix tokens, channels-last), and
one default call of every other method family (pixel, perturbation, attention) gives a finite
map of the right shape or a clear camkit refusal. About 30 s single-process."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
import torchvision
from conftest import assert_untouched, model_state
from torch import Tensor, nn

import camkit

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers", reason="transformers builds the HF models")

tv = torchvision.models
hf = transformers
RAW = {"relu": False, "upsample": False, "normalize": False}
CLASS = 1


@dataclass(frozen=True)
class Arch:
    """A model, its default layer (known by hand) and how that layer's output is read:
    ``"grid"``, ``"last"`` (channels-last) or ``(prefix, (h, w))`` tokens."""

    name: str
    build: Callable[[], nn.Module]
    layer: str
    reading: str | tuple[int, tuple[int, int]] = "grid"
    size: int = 64


def _timm(name: str, **config) -> Callable[[], nn.Module]:
    return lambda: timm.create_model(name, num_classes=5, **config)


def _hf(model: type, config: object) -> Callable[[], nn.Module]:
    return lambda: model(config)


_TINY_VIT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}
_HF_VIT = {**_TINY_VIT, "intermediate_size": 64, "image_size": 64, "patch_size": 16}

ZOO = [
    Arch("timm-resnet10t", _timm("resnet10t"), "layer4"),
    Arch("timm-efficientnet_b0", _timm("efficientnet_b0"), "bn2"),
    Arch("timm-regnetx_002", _timm("regnetx_002"), "s4"),
    Arch("timm-mobilenetv3_small_050", _timm("mobilenetv3_small_050"), "blocks"),
    Arch("timm-convnext_atto", _timm("convnext_atto"), "stages"),
    Arch(
        "timm-deit_tiny_distilled",
        _timm("deit_tiny_distilled_patch16_224", img_size=64, depth=2),
        "blocks.1.norm1",
        (2, (4, 4)),
    ),
    Arch(
        "timm-vit_registers",
        _timm(
            "vit_small_patch16_224",
            img_size=64,
            depth=2,
            embed_dim=32,
            num_heads=2,
            reg_tokens=4,
            no_embed_class=True,
        ),
        "blocks.1.norm1",
        (5, (4, 4)),
    ),
    Arch("timm-levit_128s", _timm("levit_128s", img_size=64), "stem"),
    Arch("timm-mobilevit_xxs", _timm("mobilevit_xxs"), "final_conv"),
    Arch(
        "timm-eva02_tiny",
        _timm("eva02_tiny_patch14_224", img_size=56, depth=2),
        "blocks.1.norm1",
        (1, (4, 4)),
        size=56,
    ),
    Arch(
        "timm-maxvit_nano",
        _timm("maxvit_nano_rw_256", img_size=64),
        "stages.3.blocks.0.attn_grid.norm1",
        "last",
    ),
    Arch("timm-fastvit_t8", _timm("fastvit_t8"), "final_conv"),
    Arch("tv-resnet18", lambda: tv.resnet18(num_classes=5), "layer4"),
    Arch("tv-mobilenet_v3_small", lambda: tv.mobilenet_v3_small(num_classes=5), "features"),
    Arch("tv-squeezenet1_1", lambda: tv.squeezenet1_1(num_classes=5), "features"),
    Arch("tv-shufflenet_v2_x0_5", lambda: tv.shufflenet_v2_x0_5(num_classes=5), "conv5"),
    Arch("tv-densenet121", lambda: tv.densenet121(num_classes=5), "features"),
    Arch("tv-regnet_y_400mf", lambda: tv.regnet_y_400mf(num_classes=5), "trunk_output"),
    Arch(
        "tv-vit",
        lambda: tv.VisionTransformer(
            image_size=64,
            patch_size=16,
            num_layers=2,
            num_heads=2,
            hidden_dim=32,
            mlp_dim=64,
            num_classes=5,
        ),
        "encoder.layers.encoder_layer_1.ln_1",
        (1, (4, 4)),
    ),
    Arch("tv-swin_t", lambda: tv.swin_t(num_classes=5), "features.7.1.norm1", "last"),
    Arch(
        "hf-vit",
        _hf(hf.ViTForImageClassification, hf.ViTConfig(**_HF_VIT, num_labels=5)),
        "vit.layers.1.layernorm_before",
        (1, (4, 4)),
    ),
    Arch(
        "hf-deit",
        _hf(hf.DeiTForImageClassificationWithTeacher, hf.DeiTConfig(**_HF_VIT, num_labels=5)),
        "deit.layers.1.layernorm_before",
        (2, (4, 4)),
    ),
    Arch(
        "hf-beit",
        _hf(
            hf.BeitForImageClassification,
            hf.BeitConfig(**_HF_VIT, num_labels=5, use_mean_pooling=False),
        ),
        "beit.layers.1.layernorm_before",
        (1, (4, 4)),
    ),
    Arch(
        "hf-dinov2",
        _hf(
            hf.Dinov2ForImageClassification,
            hf.Dinov2Config(**_TINY_VIT, mlp_ratio=2, image_size=64, patch_size=16, num_labels=5),
        ),
        "dinov2.encoder.layer.1.norm1",
        (1, (4, 4)),
    ),
    Arch(
        "hf-convnext",
        _hf(
            hf.ConvNextForImageClassification,
            hf.ConvNextConfig(hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1], num_labels=5),
        ),
        "convnext.encoder.stages.3",
    ),
    Arch(
        "hf-swin",
        _hf(
            hf.SwinForImageClassification,
            hf.SwinConfig(
                image_size=64,
                patch_size=4,
                embed_dim=16,
                depths=[1, 1],
                num_heads=[1, 2],
                window_size=4,
                num_labels=5,
            ),
        ),
        "swin.encoder.layers.1.blocks.0.layernorm_before",
        (0, (8, 8)),
    ),
    Arch(
        "hf-resnet",
        _hf(
            hf.ResNetForImageClassification,
            hf.ResNetConfig(
                embedding_size=8, hidden_sizes=[8, 16, 24, 32], depths=[1, 1, 1, 1], num_labels=5
            ),
        ),
        "resnet.encoder.stages.3",
    ),
]
IDS = [arch.name for arch in ZOO]
_BUILT: dict[str, nn.Module] = {}


def _model(arch: Arch) -> nn.Module:
    """The architecture, seeded, eval mode; built once per session (the tests never change it:
    each checks that)."""
    if arch.name not in _BUILT:
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = arch.build().eval()
        with torch.no_grad():  # torchvision's ViT starts with a zero head: nothing to explain
            for module in model.modules():
                if isinstance(module, nn.Linear) and not module.weight.any():
                    module.weight.normal_(std=0.2)
        _BUILT[arch.name] = model
    return _BUILT[arch.name]


def _input(arch: Arch) -> Tensor:
    return torch.rand(2, 3, arch.size, arch.size, generator=torch.Generator().manual_seed(0))


def _logits(output: object) -> Tensor:
    return output if isinstance(output, Tensor) else output.logits


def _read(arch: Arch, t: Tensor) -> Tensor:
    """The layer output as ``(B, C, h, w)``, written by hand for this architecture."""
    if arch.reading == "grid":
        return t
    if arch.reading == "last":
        return t.permute(0, 3, 1, 2)
    prefix, grid = arch.reading
    return (
        t[:, prefix : prefix + grid[0] * grid[1]].reshape(t.shape[0], *grid, -1).permute(0, 3, 1, 2)
    )


def _hand_gradcam(arch: Arch, model: nn.Module, x: Tensor) -> Tensor:
    """Selvaraju et al. 2017: ``sum_c mean_ij(dy/dA_cij) A_c`` on the default layer."""
    with camkit.record(model, arch.layer) as rec:
        _logits(model(x))[:, CLASS].sum().backward()
    model.zero_grad(set_to_none=True)
    act, grad = _read(arch, rec.activations[arch.layer]), _read(arch, rec.gradients[arch.layer])
    return (grad.mean(dim=(2, 3), keepdim=True) * act).sum(dim=1)


@pytest.mark.parametrize("arch", ZOO, ids=IDS)
def test_gradcams_default_call_equals_the_hand_reference(arch: Arch) -> None:
    model, x = _model(arch), _input(arch)
    before = model_state(model)
    cam = camkit.GradCAM(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # LeViT: later layers are tokens
        maps = cam(x, CLASS, **RAW)
    assert cam.layers == [arch.layer]
    expected = _hand_gradcam(arch, model, x)
    scale = float(expected.abs().max())
    assert scale > 0
    torch.testing.assert_close(maps, expected, atol=2e-5 * scale, rtol=1e-4)
    assert_untouched(model, before)


def _perturbation(arch: Arch, model: nn.Module) -> camkit.Explainer:
    """Recipro-CAM on a grid (one masked forward per position); on tokens and channels-last
    outputs, which it cannot mask, Score-CAM on the 8 channels of largest gradient."""
    if arch.reading == "grid":
        return camkit.METHODS["reciprocam"].build(model)
    return camkit.ScoreCAM(model, top_channels=8)


@pytest.mark.parametrize("arch", ZOO, ids=IDS)
def test_every_family_default_call_gives_a_map_or_a_clear_refusal(arch: Arch) -> None:
    model, x = _model(arch), _input(arch)
    before = model_state(model)
    size = (arch.size, arch.size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        pixel = camkit.Saliency(model)(x, CLASS)
        assert pixel.shape == x.shape and torch.isfinite(pixel).all() and pixel.abs().sum() > 0
        perturbed = _perturbation(arch, model)(x, CLASS)
        assert perturbed.shape == (2, *size) and torch.isfinite(perturbed).all()
        try:
            attention = camkit.METHODS["rollout"].build(model)(x, CLASS)
        except camkit.errors.CamkitError as err:  # no supported attention blocks, windows
            assert arch.reading != (1, (4, 4)) or "timm-eva" in arch.name, err
        else:
            assert attention.shape == (2, *size) and torch.isfinite(attention).all()
    assert_untouched(model, before)
