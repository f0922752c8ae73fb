"""Prompts as targets of a model built the OpenCLIP way (Ilharco et al., 2021; Cherti et al.,
CVPR 2023): ``encode_image``, ``encode_text``, ``logit_scale``, read from a folder laid out as
OpenCLIP models are on the HuggingFace hub, with OpenCLIP's own tokenizer; random weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import vlm_kit

import camkit
from camkit.errors import TargetError
from camkit.targets import PromptTarget

open_clip = pytest.importorskip("open_clip", reason="open_clip builds the OpenCLIP model")

PROMPTS = ["a cat", "a dog", "a red sofa"]
LAYER = "visual.transformer.resblocks.1.ln_1"  # the image tower's last block
RAW = {"relu": False, "upsample": False, "normalize": False}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return f"local-dir:{vlm_kit.openclip_folder(tmp_path_factory.mktemp('openclip'))}"


def load(folder, dtype=torch.float32):
    model = open_clip.create_model(folder).eval().to(dtype)
    return model, open_clip.get_tokenizer(folder)


def hand_gradcam(model, tokenizer, x, prompts):
    """Grad-CAM at the last block's ``ln_1`` by hand: a forward hook keeps its tokens, the
    score is exp(logit_scale) cos(image, text), autograd gives the gradient; the 16 patch
    tokens after the class token are the 4 x 4 grid, weights = their mean gradient."""
    with torch.no_grad():
        texts = model.encode_text(tokenizer(prompts))
    kept = []
    layer = model.visual.transformer.resblocks[1].ln_1
    handle = layer.register_forward_hook(lambda m, i, o: kept.append(o))
    try:
        image = model.encode_image(x)
    finally:
        handle.remove()
    cosine = F.normalize(image, dim=-1) @ F.normalize(texts, dim=-1).T
    scores = cosine * model.logit_scale.exp()
    maps = []
    for k in range(len(prompts)):
        (grad,) = torch.autograd.grad(scores[:, k].sum(), kept[0], retain_graph=True)
        act, grad = kept[0][:, 1:], grad[:, 1:]
        maps.append((grad.mean(dim=1, keepdim=True) * act).sum(-1).reshape(-1, 4, 4))
    return torch.stack(maps, dim=1).detach()


def test_gradcam_of_prompts_equals_a_hand_reference_in_float64(folder):
    model, tokenizer = load(folder, torch.float64)
    x = vlm_kit.image(2, dtype=torch.float64)
    target = PromptTarget(model, PROMPTS, tokenizer=tokenizer)
    cam = camkit.GradCAM(camkit.ImageTower(model))
    maps = cam(x, target, **RAW)
    # the default layer is the image tower's, not the text tower's blocks named like it
    assert cam.layers == [LAYER]
    expected = hand_gradcam(model, tokenizer, x, PROMPTS)
    assert maps.shape == (2, 3, 4, 4) and expected.abs().sum() > 0
    torch.testing.assert_close(maps.double(), expected, atol=1e-6, rtol=1e-5)


def test_the_score_is_the_models_own_similarity_and_ids_give_the_same_target(folder):
    model, tokenizer = load(folder)
    x = vlm_kit.image(2)
    with torch.no_grad():
        image, text, scale = model(x, tokenizer(PROMPTS))  # normalised features
        expected = scale * image @ text.T
        scores = PromptTarget(model, PROMPTS, tokenizer=tokenizer)(model.encode_image(x))
        from_ids = PromptTarget(model, input_ids=tokenizer(PROMPTS))(model.encode_image(x))
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(from_ids, scores)


def test_k_prompts_in_one_call_equal_k_single_calls_and_a_contrast_their_difference(folder):
    model, tokenizer = load(folder)
    x = vlm_kit.image(2)
    cam = camkit.GradCAM(camkit.ImageTower(model))
    together = cam(x, PromptTarget(model, PROMPTS, tokenizer=tokenizer), **RAW)
    for k, text in enumerate(PROMPTS):
        alone = cam(x, PromptTarget(model, text, tokenizer=tokenizer), **RAW)
        assert alone.shape == (2, 4, 4)
        torch.testing.assert_close(alone, together[:, k], atol=1e-5, rtol=1e-5)
    contrast = PromptTarget(model, "a cat", tokenizer=tokenizer, contrast="a dog")
    torch.testing.assert_close(
        cam(x, contrast, **RAW), together[:, 0] - together[:, 1], atol=1e-5, rtol=1e-5
    )


def test_bad_prompts_say_what_to_give(folder):
    model, tokenizer = load(folder)
    ids = tokenizer(["a cat"])
    with pytest.raises(TargetError, match="takes no attention_mask"):
        PromptTarget(model, input_ids=ids, attention_mask=torch.ones_like(ids))
    with pytest.raises(TargetError, match="49407"):
        PromptTarget(model, input_ids=torch.tensor([[49406, 49408]]))
    with pytest.raises(TargetError, match="more than the 16 positions"):
        PromptTarget(model, input_ids=torch.ones(1, 17, dtype=torch.long))
    with pytest.raises(TargetError, match="get_tokenizer"):
        PromptTarget(model, "a cat")


def test_explaining_leaves_the_model_as_it_was(folder):
    from conftest import assert_untouched, model_state

    model, tokenizer = load(folder)
    before = model_state(model)
    target = PromptTarget(model, PROMPTS, tokenizer=tokenizer)
    camkit.GradCAM(camkit.ImageTower(model))(vlm_kit.image(), target)
    assert_untouched(model, before)


def test_the_cli_reads_an_openclip_folder_as_a_dual_encoder(tmp_path, folder):
    """``--model hf:FOLDER`` on an OpenCLIP folder: an overlay per prompt, equal to the
    library's map of the model OpenCLIP reads from it (its preprocess_cfg: 32 px, mean 0.5)."""
    import numpy as np

    from camkit import io
    from camkit.cli import main
    from camkit.models.vlm import load_vlm

    photo = tmp_path / "photo.png"
    io.save_image(photo, np.random.default_rng(0).integers(0, 256, (40, 48, 3), dtype=np.uint8))
    path = folder.removeprefix("local-dir:")
    out = tmp_path / "out"
    argv = ["explain", str(photo), "--model", f"hf:{path}", "--out", str(out), "--quiet"]
    assert main([*argv, "--prompt", "a cat", "--prompt", "a dog", "--format", "png"]) == 0
    assert sorted(p.name for p in out.glob("*.png")) == [
        "photo_gradcam_0_a-cat.png",
        "photo_gradcam_1_a-dog.png",
    ]
    loaded = load_vlm(path)
    assert loaded.preprocess.size == (32, 32) and loaded.preprocess.mean == (0.5, 0.5, 0.5)
    model, tokenizer = load(folder)
    x = loaded.preprocess(io.read_image(photo)).unsqueeze(0)
    target = PromptTarget(model, ["a cat", "a dog"], tokenizer=tokenizer)
    heat = camkit.GradCAM(camkit.ImageTower(model)).explain_batch(x, target).maps
    region = loaded.preprocess.photo_region(40, 48)
    expected = camkit.viz.overlay_on_photo(io.read_image(photo), heat[0, 1], region)
    assert np.array_equal(io.read_image(out / "photo_gradcam_1_a-dog.png"), expected)


def test_an_openclip_folder_without_weights_is_refused(tmp_path, folder):
    from camkit.models.vlm import load_vlm

    empty = tmp_path / "empty"
    empty.mkdir()
    config = "open_clip_config.json"
    (empty / config).write_text(
        (vlm_kit.Path(folder.removeprefix("local-dir:")) / config).read_text()
    )
    with pytest.raises(camkit.errors.UnknownModelError, match="holds no weights"):
        load_vlm(empty)
