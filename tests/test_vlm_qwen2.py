"""Qwen2-VL (Wang et al., "Qwen2-VL", 2024) on a tiny random model: images given as flattened
patches with ``image_grid_thw`` (camkit.ImageInput), the vision blocks' ``(B * h * w, C)``
rows in 2 x 2 merge windows read as maps, M-RoPE positions; hand references in float64."""

from __future__ import annotations

import pytest
import torch
import vlm_kit
from vlm_kit import save_folder

import camkit
from camkit.errors import ArgumentError, InputError, LayerOutputError
from camkit.methods.cam.generation import explain_answer, explain_tokens
from camkit.models.vlm import load_vlm
from camkit.targets import TokenTarget

RAW = {"relu": False, "upsample": False, "normalize": False}
LAYER = "model.visual.blocks.1"  # the last vision block: the merger reads its output
NOT_GENERATED = [vlm_kit.IMAGE, 2]  # the image and video tokens


def processor_inputs(x, ids):
    """The model's inputs as its own image processor lays the images out (``patchify``), the
    token types as its processor marks them (1 at the image tokens)."""
    processor = vlm_kit.transformers.Qwen2VLImageProcessor()
    flat, h, w = processor.patchify(x, patch_size=8, merge_size=2, temporal_patch_size=2)
    grid = torch.tensor([[1, h, w]] * x.shape[0])
    types = (ids == vlm_kit.IMAGE).int()
    return {"pixel_values": flat.flatten(0, 1), "image_grid_thw": grid, "mm_token_type_ids": types}


def answer(dtype=torch.float32):
    """``(model, image, prompt length, sequence)``: 4 greedy tokens about one image."""
    model = vlm_kit.qwen2_vl().to(dtype)
    x = vlm_kit.image(1, dtype=dtype)
    ids = vlm_kit.prompt(4)  # 4 x 4 patches merged 2 x 2: 4 image tokens
    with torch.no_grad():
        sequence = model.generate(
            input_ids=ids,
            **processor_inputs(x, ids),
            max_new_tokens=4,
            do_sample=False,
            suppress_tokens=NOT_GENERATED,
        )
    return model, x, ids.shape[1], sequence


def hand_reference(model, x, sequence, position, token):
    """Grad-CAM at the last vision block and gradient x input at the embeddings by hand: plain
    forward hooks, autograd, and the 16 rows put on the 4 x 4 grid one by one: row
    ``((i * 2 + j) * 2 + a) * 2 + b`` is patch ``(2 i + a, 2 j + b)`` (window (i, j), place
    (a, b) in it)."""
    kept = {}
    layer, embeddings = model.get_submodule(LAYER), model.get_input_embeddings()
    hooks = [
        module.register_forward_hook(lambda m, i, o, key=key: kept.__setitem__(key, o))
        for key, module in (("layer", layer), ("embeddings", embeddings))
    ]
    try:
        logits = model(input_ids=sequence, **processor_inputs(x, sequence)).logits
    finally:
        for hook in hooks:
            hook.remove()
    score = logits[:, position - 1, token].sum()
    grad, grad_embeddings = torch.autograd.grad(score, [kept["layer"], kept["embeddings"]])
    weights = grad.mean(dim=0)  # one image: its 16 rows
    cam = torch.zeros(4, 4, dtype=grad.dtype)
    for i in range(2):
        for j in range(2):
            for a in range(2):
                for b in range(2):
                    row = ((i * 2 + j) * 2 + a) * 2 + b
                    cam[2 * i + a, 2 * j + b] = (weights * kept["layer"][row]).sum()
    relevance = (grad_embeddings * kept["embeddings"]).sum(-1)
    return cam[None].detach(), relevance.detach()


def test_the_default_layer_is_the_last_vision_block_read_in_merge_windows():
    model, x, _, sequence = answer()
    cam = camkit.GradCAM(camkit.ImageInput(model))
    cam(x, TokenTarget(-1, 5), additional_forward_args={"input_ids": sequence})
    assert cam.layers == [LAYER]
    layout = cam.layouts[LAYER]
    assert (layout.grid, layout.rows, layout.merge) == ((4, 4), 16, 2)
    assert "merge windows" in str(layout)


def test_a_token_map_and_its_token_relevance_equal_hand_references_in_float64():
    model, x, prompt_length, sequence = answer(torch.float64)
    cam = camkit.GradCAM(camkit.ImageInput(model), LAYER)
    result = explain_tokens(cam, x, sequence, prompt_length=prompt_length, **RAW)
    assert result.maps.shape == (1, sequence.shape[1] - prompt_length, 4, 4)
    for k, position in enumerate(range(prompt_length, sequence.shape[1])):
        token = int(sequence[0, position])
        expected, relevance = hand_reference(model, x, sequence, position, token)
        torch.testing.assert_close(result.maps[:, k].double(), expected, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(
            result.token_relevance[:, k].double(), relevance, atol=1e-6, rtol=1e-5
        )
    assert result.maps.abs().sum() > 0 and result.token_relevance.abs().sum() > 0


def test_k_generated_tokens_in_one_call_equal_k_single_calls_and_images_their_own_maps():
    model, x, prompt_length, sequence = answer()
    cam = camkit.GradCAM(camkit.ImageInput(model))
    result = explain_tokens(cam, x, sequence, prompt_length=prompt_length, token_batch=3, **RAW)
    generated = TokenTarget.generated(sequence, prompt_length)
    pair = torch.cat([x, vlm_kit.image(1, seed=1)])  # two images: 32 rows in the vision blocks
    extra = {"input_ids": sequence.expand(2, -1)}
    for k, (position, token) in enumerate(zip(generated.positions, generated.tokens, strict=True)):
        alone = cam(
            x,
            TokenTarget(position, token),
            additional_forward_args=extra | {"input_ids": sequence},
            **RAW,
        )
        torch.testing.assert_close(alone, result.maps[:, k], atol=1e-5, rtol=1e-4)
        both = cam(pair, TokenTarget(position, token), additional_forward_args=extra, **RAW)
        torch.testing.assert_close(both[:1], alone, atol=1e-5, rtol=1e-4)
        other = cam(
            pair[1:],
            TokenTarget(position, token),
            additional_forward_args={"input_ids": sequence},
            **RAW,
        )
        torch.testing.assert_close(both[1:], other, atol=1e-5, rtol=1e-4)


def test_a_saved_folder_loads_and_its_answer_is_explained_as_in_memory(tmp_path):
    model = vlm_kit.qwen2_vl()
    loaded = load_vlm(save_folder(model, tmp_path / "qwen2_vl", frame="<bos> $A"))
    assert isinstance(loaded.explained, camkit.ImageInput)
    x = vlm_kit.image()
    ids = loaded.prompt_ids("what is in the picture", x)
    torch.testing.assert_close(ids, vlm_kit.prompt(4))
    answer_ = explain_answer(
        loaded, camkit.GradCAM(loaded.explained), x, "what is in the picture", 3
    )
    sequence = torch.tensor([[vlm_kit.WORDS.index(t) for t in answer_.tokens]])
    expected = explain_tokens(
        camkit.GradCAM(camkit.ImageInput(model)), x, sequence, prompt_length=ids.shape[1]
    )
    torch.testing.assert_close(answer_.explanation.maps, expected.maps)
    torch.testing.assert_close(answer_.explanation.token_relevance, expected.token_relevance)


def test_what_cannot_be_laid_out_is_refused_with_what_to_pass():
    model, x, _, sequence = answer()
    with pytest.raises(ArgumentError, match="camkit.ImageInput"):
        camkit.KeywordInput(model, "pixel_values")
    extra = {"input_ids": sequence}
    with pytest.raises(LayerOutputError, match="reads flattened patches"):
        camkit.ScoreCAM(camkit.ImageInput(model))(
            x, TokenTarget(-1, 5), additional_forward_args=extra
        )
    cam = camkit.GradCAM(camkit.ImageInput(model))
    with pytest.raises(InputError, match="multiples of 16"):
        cam(
            vlm_kit.image()[..., :24],
            TokenTarget(-1, 5),
            additional_forward_args={"input_ids": sequence},
        )


def test_explaining_an_answer_leaves_the_model_as_it_was():
    from conftest import assert_untouched, model_state

    model, x, prompt_length, sequence = answer()
    before = model_state(model)
    cam = camkit.GradCAM(camkit.ImageInput(model))
    explain_tokens(cam, x, sequence, prompt_length=prompt_length, token_batch=2)
    assert_untouched(model, before)


def test_the_cli_writes_an_overlay_per_generated_token_of_a_saved_qwen2_vl(tmp_path):
    import numpy as np

    from camkit import io
    from camkit.cli import main

    photo = tmp_path / "photo.png"
    rng = np.random.default_rng(0)
    io.save_image(photo, rng.integers(0, 256, (40, 48, 3), dtype=np.uint8))
    folder = save_folder(vlm_kit.qwen2_vl(), tmp_path / "qwen2_vl", frame="<bos> $A")
    out = tmp_path / "out"
    argv = ["explain", str(photo), "--model", f"hf:{folder}", "--out", str(out), "--quiet"]
    assert main([*argv, "--prompt", "what is in the picture", "--max-new-tokens", "3"]) == 0
    assert len(list(out.glob("photo_gradcam_*.jpg"))) == 3
    assert (out / "photo_gradcam_tokens.html").read_text().count('<span class="word">') == 3


def test_lrp_runs_through_the_flattened_patches_and_the_vision_tower_conserves():
    """AttnLRP through Qwen2-VL (Achtibat et al., ICML 2024): the relevance that enters the
    patch merger reaches the last vision block whole and the pixels within 5% (through the
    vision attention over each image's rows, its rotary embeddings, the 3-D patch embedding and
    ImageInput' layout); the image tokens' embeddings get none (the vision features replace
    them); the language model's final norm passes the logit on."""
    import warnings

    from camkit.errors import ConservationWarning

    model = vlm_kit.qwen2_vl().double()
    embeddings, norm = "model.language_model.embed_tokens", "model.language_model.norm"
    merger, block = "model.visual.merger", LAYER
    lrp = camkit.LRP(
        camkit.ImageInput(model),
        composite="epsilon-plus",
        layers=[embeddings, norm, merger, block],
    )
    ids = vlm_kit.prompt(4)
    for token in (5, 17):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConservationWarning)  # the pixels hold a part
            found = lrp.explain_batch(
                vlm_kit.image(dtype=torch.float64),
                TokenTarget(-1, token),
                additional_forward_args={"input_ids": ids},
            )
        score = float(found.scores.sum())
        assert float(found.layers[norm].sum()) == pytest.approx(score, rel=1e-4)
        entering = float(found.layers[merger].sum())
        assert abs(entering) > 1e-3 * abs(score)
        assert float(found.layers[block].sum()) == pytest.approx(entering, rel=1e-4)
        assert float(found.input.sum()) == pytest.approx(entering, rel=0.05)
        tokens = found.layers[embeddings][0, 0]
        assert float(tokens[ids[0] == vlm_kit.IMAGE].abs().sum()) == 0
