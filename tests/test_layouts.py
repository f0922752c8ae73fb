"""Reading layer outputs as grids: tokens, channels-last, volumes (camkit.layouts).

Real architectures are built with random weights (no download); each layer's output is captured
with a forward hook, its inferred layout checked, and the Grad-CAM computed through the layout
compared with the one computed through the reshape function a pytorch-grad-cam user writes by
hand for that layer (and with pytorch-grad-cam itself when it is installed).
"""

from __future__ import annotations

import pytest
import torch
from conftest import TinyNet, assert_untouched, model_state
from torch import Tensor, nn

import camkit
from camkit.core.architecture import default_token_layer, prefix_tokens
from camkit.core.layouts import Layout, LayoutError, fits_input, infer_layout, resolve_reshape

timm = pytest.importorskip("timm")
torchvision = pytest.importorskip("torchvision")


def _correlation(a: Tensor, b: Tensor) -> float:
    return float(torch.corrcoef(torch.stack([a.flatten().float(), b.flatten().float()]))[0, 1])


def _output_shape(model: nn.Module, layer: str, x: Tensor) -> tuple[int, ...]:
    shapes = []
    handle = model.get_submodule(layer).register_forward_hook(
        lambda module, args, out: shapes.append(tuple(out.shape))
    )
    try:
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
    return shapes[-1]


def drop_prefix_reshape(prefix: int, h: int, w: int):
    """The reshape_transform of pytorch-grad-cam's ViT tutorial, for ``prefix`` tokens."""

    def reshape_transform(tensor: Tensor) -> Tensor:
        result = tensor[:, prefix:, :].reshape(tensor.size(0), h, w, tensor.size(2))
        return result.transpose(2, 3).transpose(1, 2)

    return reshape_transform


def swin_reshape(tensor: Tensor) -> Tensor:
    """pytorch-grad-cam's Swin tutorial reshape for a (B, h, w, C) block output."""
    return tensor.permute(0, 3, 1, 2)


def check_architecture(
    model: nn.Module,
    layer: str,
    size: tuple[int, int],
    expected: Layout,
    hand_reshape,
    target: int = 1,
    logits=None,
) -> None:
    """Layout of ``layer`` == ``expected``; Grad-CAM through it == through the hand reshape."""
    torch.manual_seed(0)
    x = torch.randn(1, 3, *size)
    shape = _output_shape(model, layer, x)
    layout = infer_layout(shape, model, size)
    assert layout == expected, str(layout)
    assert layout is not None and str(layout)

    before = model_state(model)
    auto = camkit.GradCAM(model, layer, reshape=lambda t: layout.to_grid(t))(x[0], target=target)
    assert_untouched(model, before)
    hand = camkit.GradCAM(model, layer, reshape=hand_reshape)(x[0], target=target)
    assert auto.shape == size and torch.isfinite(auto).all()
    assert auto.max() - auto.min() > 0.5, "constant map"
    assert _correlation(auto, hand) >= 0.999
    torch.testing.assert_close(auto, hand)

    pgc = pytest.importorskip("pytorch_grad_cam")
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    module = model.get_submodule(layer)
    reference_model = model if logits is None else Logits(model, logits)
    with pgc.GradCAM(reference_model, [module], reshape_transform=hand_reshape) as reference:
        theirs = torch.from_numpy(reference(x, targets=[ClassifierOutputTarget(target)]))[0]
    model.zero_grad(set_to_none=True)  # pytorch-grad-cam leaves .grad on the parameters
    assert _correlation(auto, theirs) >= 0.999


class Logits(nn.Module):
    """pytorch-grad-cam needs a tensor output: ``pick(model(x))``."""

    def __init__(self, model: nn.Module, pick):
        super().__init__()
        self.model, self.pick = model, pick

    def forward(self, x: Tensor) -> Tensor:
        return self.pick(self.model(x))


# ----------------------------------------------------------------------------- layouts by hand


def test_tokens_to_grid_drops_prefix_and_lays_patches_row_major():
    layout = Layout("tokens", (2, 3), channels=4, prefix=2)
    t = torch.arange(2 * 8 * 4, dtype=torch.float32).reshape(2, 8, 4)  # (B, 2 + 6, C)
    grid = layout.to_grid(t)
    assert grid.shape == (2, 4, 2, 3)
    # patch token 2 + (i * 3 + j), channel c, lands at [c, i, j]
    for i in range(2):
        for j in range(3):
            assert torch.equal(grid[1, :, i, j], t[1, 2 + i * 3 + j])
    assert layout(t).data_ptr() == grid.data_ptr()  # callable, and a view


def test_channels_last_to_grid_moves_channels():
    layout = Layout("channels_last", (2, 3), channels=5)
    t = torch.randn(1, 2, 3, 5)
    assert torch.equal(layout.to_grid(t)[0, 4, 1, 2], t[0, 1, 2, 4])
    assert torch.equal(layout.to_grid(t), t.permute(0, 3, 1, 2))


def test_grid_and_volume_pass_through_and_wrong_shapes_are_refused():
    grid = Layout("grid", (7, 7), channels=3)
    t = torch.randn(2, 3, 7, 7)
    assert grid.to_grid(t) is t
    volume = Layout("volume", (4, 7, 7), channels=3)
    v = torch.randn(1, 3, 4, 7, 7)
    assert volume.to_grid(v) is v
    with pytest.raises(LayoutError, match=r"expected a layer output of shape \(B, 3, 7, 7\)"):
        grid.to_grid(torch.randn(2, 7, 7, 3))


def test_layout_str_says_what_was_chosen():
    layout = infer_layout((1, 197, 192), None, 224)
    assert str(layout).startswith("tokens (B, 197, 192): 1 prefix token(s) dropped, 14x14")
    assert "(B, 192, 14, 14)" in str(layout)


def test_fits_input_stride_rules():
    assert fits_input((7, 7), (224, 224))  # stride 32
    assert fits_input((8, 8), (299, 299))  # Inception's valid convolutions: stride ~37
    assert fits_input((7, 10), (224, 320))
    assert not fits_input((7, 768), (224, 224))  # wider than the input
    assert not fits_input((64, 56), (224, 224))  # a square input gives a square map
    assert not fits_input((7, 14), (224, 320))  # no common stride


def test_channels_first_and_channels_last_decided_by_geometry():
    # Swin: (B, 7, 7, 768) must never be read as 7 channels of 7x768 maps
    assert infer_layout((2, 7, 7, 768), None, (224, 224)).kind == "channels_last"
    assert infer_layout((2, 768, 7, 7), None, (224, 224)).kind == "grid"
    assert infer_layout((2, 56, 56, 96), None, 224) == Layout("channels_last", (56, 56), 96)
    assert infer_layout((2, 64, 56, 56), None, 224) == Layout("grid", (56, 56), 64)
    assert infer_layout((1, 8, 4, 7, 7), None, (16, 224, 224)) == Layout("volume", (4, 7, 7), 8)


def test_channel_counts_decide_when_geometry_cannot():
    # (B, 7, 7, 8) for a 224x256 input: (7, 8) fits a stride of 32, (7, 7) one of 32-37
    assert fits_input((7, 8), (224, 256)) and fits_input((7, 7), (224, 256))
    channels_last = nn.Sequential(nn.Linear(3, 8), nn.LayerNorm(8))
    assert infer_layout((1, 7, 7, 8), channels_last, (224, 256)).kind == "channels_last"
    channels_first = nn.Sequential(nn.Conv2d(3, 7, 3), nn.LayerNorm(12))
    assert infer_layout((1, 7, 7, 8), channels_first, (224, 256)).kind == "grid"


def test_truly_ambiguous_dense_output_names_both_readings():
    both = nn.Sequential(nn.Conv2d(3, 7, 1), nn.LayerNorm(7))
    with pytest.raises(LayoutError) as err:
        infer_layout((1, 7, 7, 7), both, 224)
    message = str(err.value)
    assert "grid (B, 7, 7, 7)" in message and "channels-last (B, 7, 7, 7)" in message
    assert "reshape=" in message


def test_cnn_without_layer_norm_keeps_pytorch_convention():
    # TinyNet's (B, 2, 2, 2) on a 2x2 input fits both readings; a CNN has no channels-last norm
    assert infer_layout((1, 2, 2, 2), TinyNet(), (2, 2)) == Layout("grid", (2, 2), 2)


def test_tokens_without_model_found_when_unambiguous_and_refused_otherwise():
    assert infer_layout((1, 50, 768), None, 224) == Layout("tokens", (7, 7), 768, 1)  # /32
    assert infer_layout((1, 281, 192), None, (224, 320)) == Layout("tokens", (14, 20), 192, 1)
    with pytest.raises(LayoutError, match="several ways") as err:
        infer_layout((1, 17, 32), None, 64)
    assert "1 prefix token(s) dropped, 4x4" in str(err.value)
    assert "13 prefix token(s) dropped, 2x2" in str(err.value)
    with pytest.raises(LayoutError, match="single token"):
        infer_layout((1, 1, 32), None, 64)
    # 150 - 6 = 144 = 12x12, but 224 is not a multiple of 12: no patch grid
    with pytest.raises(LayoutError, match="cannot lay out 150 tokens"):
        infer_layout((1, 150, 32), None, 224)


def test_prefix_and_patch_from_model_attributes():
    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.cls_token = nn.Parameter(torch.zeros(1, 1, 8))
            self.register_tokens = nn.Parameter(torch.zeros(1, 3, 8))
            self.patch_size = 4

    assert prefix_tokens(Tiny()) == (4, "model: cls_token x1, register_tokens x3")
    # 4 + 16 tokens on a 16x16 input with 4x4 patches; no guessing needed
    assert infer_layout((1, 20, 8), Tiny(), 16) == Layout("tokens", (4, 4), 8, 4)


def test_non_three_or_four_dimensional_outputs_are_refused():
    with pytest.raises(LayoutError, match=r"expected \(B, C, h, w\), \(B, h, w, C\)"):
        infer_layout((1, 10), None, 224)
    with pytest.raises(ValueError, match="input_size"):
        infer_layout((1, 8, 7, 7), None, (0, 224))


def test_resolve_reshape_semantics():
    fn = swin_reshape
    assert resolve_reshape(fn, None, 224, (1, 7, 7, 768)) is fn
    assert resolve_reshape(None, None, 224, (1, 7, 7, 768)) is None
    auto = resolve_reshape("auto", None, 224, (1, 7, 7, 768))
    assert auto == Layout("channels_last", (7, 7), 768)
    with pytest.raises(ValueError, match='"auto", None or a callable'):
        resolve_reshape("tokens", None, 224, (1, 7, 7, 768))


# ----------------------------------------------------------------------------- planted tokens


class TokenNet(nn.Module):
    """16x16 input, 4x4 patches (linear patch embedding), a class token, ``blocks.0.norm1`` (an
    identity-initialised LayerNorm) and a logit that reads only the patch tokens of ``region``:
    ``y = sum_{t in region} <w, token_t>``."""

    def __init__(self, region: list[int]):
        super().__init__()
        torch.manual_seed(0)
        self.patch_embed = nn.Conv2d(3, 8, kernel_size=4, stride=4)
        self.cls_token = nn.Parameter(torch.randn(1, 1, 8))
        self.blocks = nn.Sequential(nn.Module())
        self.blocks[0].norm1 = nn.LayerNorm(8)
        self.w = nn.Parameter(torch.randn(8))
        self.region = region

    def forward(self, x: Tensor) -> Tensor:
        tokens = self.patch_embed(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls_token.expand(len(x), -1, -1), tokens], dim=1)
        tokens = self.blocks[0].norm1(tokens)
        patches = tokens[:, 1:][:, self.region]
        y = (patches @ self.w).sum(1)
        return torch.stack([y, -y], dim=1)


def test_planted_token_evidence_hand_computed():
    """d y / d token_t = w inside the region, 0 elsewhere, so Grad-CAM's channel weights are
    ``w * |region| / 16`` and its raw map is ``|region| / 16 * <w, token_ij>``; HiResCAM's map
    (gradient times activation) is exactly 0 outside the region."""
    region = [5, 6, 9, 10]  # the 2x2 centre of the 4x4 patch grid
    model = TokenNet(region).eval()
    assert default_token_layer(model) == "blocks.0.norm1"
    torch.manual_seed(1)
    x = torch.randn(1, 3, 16, 16)
    layout = infer_layout(_output_shape(model, "blocks.0.norm1", x), model, (16, 16))
    assert layout == Layout("tokens", (4, 4), 8, 1)

    with torch.no_grad():
        tokens = model.blocks[0].norm1(
            torch.cat([model.cls_token, model.patch_embed(x).flatten(2).transpose(1, 2)], dim=1)
        )
    expected = (len(region) / 16 * tokens[0, 1:] @ model.w).reshape(4, 4)
    raw = camkit.GradCAM(model, "blocks.0.norm1", reshape=layout)(
        x, target=0, relu=False, upsample=False, normalize=False
    )[0]
    torch.testing.assert_close(raw, expected.detach())

    hires = camkit.HiResCAM(model, "blocks.0.norm1", reshape=layout)(
        x, target=0, relu=False, upsample=False, normalize=False
    )[0]
    inside = torch.zeros(16, dtype=torch.bool)
    inside[region] = True
    assert torch.all(hires.flatten()[~inside] == 0)
    torch.testing.assert_close(hires.flatten()[inside], (tokens[0, 1:][inside] @ model.w).detach())


# ----------------------------------------------------------------------------- architectures


def test_timm_vit_tiny_224():
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False).eval()
    layer = default_token_layer(model)
    assert layer == "blocks.11.norm1"
    check_architecture(
        model, layer, (224, 224), Layout("tokens", (14, 14), 192, 1), drop_prefix_reshape(1, 14, 14)
    )


def test_timm_vit_dynamic_non_square():
    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, dynamic_img_size=True
    ).eval()
    check_architecture(
        model,
        "blocks.11.norm1",
        (224, 320),
        Layout("tokens", (14, 20), 192, 1),
        drop_prefix_reshape(1, 14, 20),
    )


def test_timm_deit_distilled_two_prefix_tokens():
    torch.manual_seed(0)
    model = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False).eval()
    assert prefix_tokens(model) == (2, "num_prefix_tokens")
    check_architecture(
        model,
        default_token_layer(model),
        (224, 224),
        Layout("tokens", (14, 14), 192, 2),
        drop_prefix_reshape(2, 14, 14),
    )


def test_timm_dinov2_with_register_tokens():
    torch.manual_seed(0)
    model = timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, img_size=112)
    model.eval()
    check_architecture(
        model,
        default_token_layer(model),
        (112, 112),
        Layout("tokens", (8, 8), 384, 5),  # class token + 4 registers
        drop_prefix_reshape(5, 8, 8),
    )


def test_timm_swin_channels_last():
    torch.manual_seed(0)
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False).eval()
    layer = default_token_layer(model)
    assert layer == "layers.3.blocks.1.norm1"
    check_architecture(model, layer, (224, 224), Layout("channels_last", (7, 7), 768), swin_reshape)


@pytest.mark.parametrize("size", [(224, 224), (192, 256)])
def test_timm_convnext_both_layouts(size):
    torch.manual_seed(0)
    h, w = size[0] // 32, size[1] // 32
    model = timm.create_model("convnext_atto", pretrained=False).eval()
    assert default_token_layer(model) is None
    check_architecture(model, "stages.3", size, Layout("grid", (h, w), 320), lambda t: t)
    # with a linear MLP, ConvNeXt blocks normalise channels-last activations
    linear = timm.create_model("convnext_atto", pretrained=False, conv_mlp=False).eval()
    check_architecture(
        linear, "stages.3.blocks.1.norm", size, Layout("channels_last", (h, w), 320), swin_reshape
    )


def test_torchvision_swin_t():
    torch.manual_seed(0)
    model = torchvision.models.swin_t(weights=None).eval()
    layer = default_token_layer(model)
    assert layer == "features.7.1.norm1"
    check_architecture(model, layer, (224, 224), Layout("channels_last", (7, 7), 768), swin_reshape)


@pytest.mark.slow
def test_torchvision_vit_b_16():
    torch.manual_seed(0)
    model = torchvision.models.vit_b_16(weights=None).eval()
    nn.init.normal_(model.heads.head.weight, std=0.02)  # torchvision zero-initialises the head
    layer = default_token_layer(model)
    assert layer == "encoder.layers.encoder_layer_11.ln_1"
    check_architecture(
        model, layer, (224, 224), Layout("tokens", (14, 14), 768, 1), drop_prefix_reshape(1, 14, 14)
    )


def test_huggingface_vit():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.ViTConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=64,
        patch_size=8,
        num_labels=5,
    )
    model = transformers.ViTForImageClassification(config).eval()
    layer = default_token_layer(model)
    assert layer is not None and layer.endswith("1.layernorm_before")
    check_architecture(
        model,
        layer,
        (64, 64),
        Layout("tokens", (8, 8), 32, 1),
        drop_prefix_reshape(1, 8, 8),
        logits=lambda out: out.logits,
    )


def test_timm_vit_with_registers_and_no_class_token():
    torch.manual_seed(0)
    model = timm.create_model(
        "vit_tiny_patch16_224",
        pretrained=False,
        img_size=64,
        class_token=False,
        reg_tokens=4,
        global_pool="avg",
    ).eval()
    x = torch.randn(1, 3, 64, 64)
    shape = _output_shape(model, default_token_layer(model), x)
    assert shape == (1, 20, 192)
    assert infer_layout(shape, model, 64) == Layout("tokens", (4, 4), 192, 4)
    assert issubclass(LayoutError, ValueError)
