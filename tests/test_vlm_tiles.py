"""LLaVA-NeXt (Liu et al., "LLaVA-NeXt: improved reasoning, OCR, and world knowledge", 2024:
anyres) on a tiny random model: an image at one of its ``image_grid_pinpoints`` is read as views,
the whole image resized to the tile side and its tiles (camkit.ImageInput); a map of the views
is put back on the image, each position the sum of the views' values that cover it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import vlm_kit
from vlm_kit import save_folder

import camkit
from camkit.errors import ArgumentError, InputError
from camkit.methods.cam.generation import explain_answer, explain_tokens
from camkit.models.vlm import image_token_count, load_vlm
from camkit.targets import TokenTarget

RAW = {"relu": False, "upsample": False, "normalize": False}
LAYER = "model.vision_tower.encoder.layers.1"  # vision_feature_layer=-2 of 3 layers


def photo(height, width, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, 3, height, width, generator=generator).to(dtype)


def views_by_hand(x):
    """The whole image squashed to 32 px, then the 32 px tiles row by row, and the sizes."""
    whole = F.interpolate(x, size=(32, 32), mode="bicubic", antialias=True)
    tiles = [
        x[:, :, i : i + 32, j : j + 32]
        for i in range(0, x.shape[2], 32)
        for j in range(0, x.shape[3], 32)
    ]
    return torch.cat([whole, *tiles]), torch.tensor([list(x.shape[2:])])


def answer(height, width, dtype=torch.float32):
    model = vlm_kit.llava_next().to(dtype)
    x = photo(height, width, dtype)
    ids = vlm_kit.prompt(image_token_count(model, x))
    views, sizes = views_by_hand(x)
    with torch.no_grad():
        sequence = model.generate(
            input_ids=ids,
            pixel_values=views,
            image_sizes=sizes,
            max_new_tokens=3,
            do_sample=False,
            suppress_tokens=[vlm_kit.IMAGE],
        )
    return model, x, ids.shape[1], sequence


def hand_reference(model, x, sequence, position, token):
    """Grad-CAM at the layer by hand over the 3 views of a 32x64 image: one weight per channel,
    the mean gradient over every patch of every view; the 4 x 8 map's cell (i, j) is the whole
    view's cell (i, j // 2) plus tile j // 4's cell (i, j % 4)."""
    kept = []
    handle = model.get_submodule(LAYER).register_forward_hook(lambda m, i, o: kept.append(o))
    views, sizes = views_by_hand(x)
    try:
        logits = model(input_ids=sequence, pixel_values=views, image_sizes=sizes).logits
    finally:
        handle.remove()
    (grad,) = torch.autograd.grad(logits[0, position - 1, token], kept[0])
    act, grad = kept[0][:, 1:], grad[:, 1:]  # (3 views, 16 patches, C): CLIP's class dropped
    weights = grad.mean(dim=(0, 1))
    per_view = (weights * act).sum(-1).reshape(3, 4, 4)
    cam = torch.zeros(4, 8, dtype=act.dtype)
    for i in range(4):
        for j in range(8):
            cam[i, j] = per_view[0, i, j // 2] + per_view[1 + j // 4, i, j % 4]
    return cam[None].detach()


def test_a_token_map_over_the_views_equals_a_hand_reference_in_float64():
    model, x, prompt_length, sequence = answer(32, 64, torch.float64)
    cam = camkit.GradCAM(camkit.ImageInput(model))
    result = explain_tokens(cam, x, sequence, prompt_length=prompt_length, **RAW)
    assert cam.layers == [LAYER]
    assert cam.layouts[LAYER].tiles == (1, 2) and cam.layouts[LAYER].frames == 3
    assert result.maps.shape == (1, 3, 4, 8)
    for k, position in enumerate(range(prompt_length, sequence.shape[1])):
        expected = hand_reference(model, x, sequence, position, int(sequence[0, position]))
        torch.testing.assert_close(result.maps[:, k].double(), expected, atol=1e-6, rtol=1e-5)
    assert result.maps.abs().sum() > 0


def test_k_generated_tokens_in_one_call_equal_k_single_calls_and_images_their_own_maps():
    model, x, prompt_length, sequence = answer(64, 64)
    cam = camkit.GradCAM(camkit.ImageInput(model))
    result = explain_tokens(cam, x, sequence, prompt_length=prompt_length, token_batch=2, **RAW)
    assert result.maps.shape == (1, 3, 8, 8)  # 2 x 2 tiles of 4 x 4 patches
    generated = TokenTarget.generated(sequence, prompt_length)
    pair = torch.cat([x, photo(64, 64, seed=1)])  # two images: 10 views in the vision tower
    for k, (position, token) in enumerate(zip(generated.positions, generated.tokens, strict=True)):
        target = TokenTarget(position, token)
        alone = cam(x, target, additional_forward_args={"input_ids": sequence}, **RAW)
        torch.testing.assert_close(alone, result.maps[:, k], atol=1e-5, rtol=1e-4)
        both = cam(
            pair, target, additional_forward_args={"input_ids": sequence.expand(2, -1)}, **RAW
        )
        other = cam(pair[1:], target, additional_forward_args={"input_ids": sequence}, **RAW)
        torch.testing.assert_close(both, torch.cat([alone, other]), atol=1e-5, rtol=1e-4)


def test_a_saved_folder_loads_and_its_answer_is_explained_as_in_memory(tmp_path):
    model = vlm_kit.llava_next()
    loaded = load_vlm(save_folder(model, tmp_path / "llava_next", frame="<bos> $A"))
    assert loaded.preprocess.size == (32, 32)  # the first of its pinpoints
    x = photo(32, 32)
    answer_ = explain_answer(
        loaded, camkit.GradCAM(loaded.explained), x, "what is in the picture", 3
    )
    sequence = torch.tensor([[vlm_kit.WORDS.index(t) for t in answer_.tokens]])
    prompt_length = answer_.positions[0]
    expected = explain_tokens(
        camkit.GradCAM(camkit.ImageInput(model)), x, sequence, prompt_length=prompt_length
    )
    torch.testing.assert_close(answer_.explanation.maps, expected.maps)
    torch.testing.assert_close(answer_.explanation.token_relevance, expected.token_relevance)


def test_what_cannot_be_laid_out_is_refused_with_what_to_pass():
    model = vlm_kit.llava_next()
    with pytest.raises(ArgumentError, match="camkit.ImageInput"):
        camkit.KeywordInput(model, "pixel_values")
    cam = camkit.GradCAM(camkit.ImageInput(model))
    ids = vlm_kit.prompt(16)
    with pytest.raises(InputError, match="32x32, 32x64, 64x64"):
        cam(photo(48, 48), TokenTarget(-1, 5), additional_forward_args={"input_ids": ids})


def test_the_cli_writes_an_overlay_per_generated_token_of_a_saved_llava_next(tmp_path):
    import numpy as np

    from camkit import io
    from camkit.cli import main

    path = tmp_path / "photo.png"
    io.save_image(path, np.random.default_rng(0).integers(0, 256, (40, 48, 3), dtype=np.uint8))
    folder = save_folder(vlm_kit.llava_next(), tmp_path / "llava_next", frame="<bos> $A")
    out = tmp_path / "out"
    argv = ["explain", str(path), "--model", f"hf:{folder}", "--out", str(out), "--quiet"]
    assert main([*argv, "--prompt", "what is in the picture", "--max-new-tokens", "3"]) == 0
    overlays = len(list(out.glob("photo_gradcam_*.jpg")))  # the answer may end before 3
    words = (out / "photo_gradcam_tokens.html").read_text().count('<span class="word">')
    assert 1 <= overlays == words <= 3
