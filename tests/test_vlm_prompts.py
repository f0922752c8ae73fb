"""Text prompts as targets of dual encoders (CLIP, SigLIP) on tiny random models."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
import vlm_kit

import camkit
from camkit.errors import TargetError
from camkit.targets import PromptTarget, load_tokenizer

PROMPTS = ["a cat", "a dog", "a red sofa"]
LAYER = "vision_model.encoder.layers.0"  # the last layer: CLIP pools its class token only
RAW = {"relu": False, "upsample": False, "normalize": False}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return vlm_kit.tokenizer_folder(tmp_path_factory.mktemp("tokenizer"))


def hand_gradcam(model, x, folder, prompts):
    """Grad-CAM at vision layer 0 by hand: a forward hook keeps the layer's tokens, the score is
    exp(logit_scale) cos(image, text) (+ SigLIP's bias), autograd gives the gradient; the patch
    tokens (CLIP's class token dropped) are a 4 x 4 grid, weights = mean gradient over it."""
    tokenizer = load_tokenizer(folder)
    siglip = model.config.model_type == "siglip"
    options = {"padding": "max_length", "max_length": 16} if siglip else {"padding": True}
    texts = model.get_text_features(**tokenizer(prompts, return_tensors="pt", **options))
    kept = []
    handle = model.vision_model.encoder.layers[0].register_forward_hook(
        lambda m, i, o: kept.append(o)
    )
    try:
        image = model.get_image_features(pixel_values=x).pooler_output
    finally:
        handle.remove()
    cosine = F.normalize(image, dim=-1) @ F.normalize(texts.pooler_output, dim=-1).T
    scores = cosine * model.logit_scale.exp() + (model.logit_bias if siglip else 0)
    tokens = kept[0]
    maps = []
    for k in range(len(prompts)):
        (grad,) = torch.autograd.grad(scores[:, k].sum(), tokens, retain_graph=True)
        act, grad = tokens[:, -16:], grad[:, -16:]  # the patch tokens
        weights = grad.mean(dim=1, keepdim=True)
        maps.append((weights * act).sum(-1).reshape(-1, 4, 4))
    return torch.stack(maps, dim=1).detach()


@pytest.mark.parametrize("build", [vlm_kit.clip, vlm_kit.siglip])
def test_gradcam_of_prompts_equals_a_hand_reference_in_float64(build, folder):
    model = build().double()
    x = vlm_kit.image(2, dtype=torch.float64)
    target = PromptTarget(model, PROMPTS, tokenizer=folder)
    maps = camkit.GradCAM(camkit.ImageTower(model), LAYER)(x, target, **RAW)
    expected = hand_gradcam(model, x, folder, PROMPTS)
    assert maps.shape == (2, 3, 4, 4)
    torch.testing.assert_close(maps.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("build", [vlm_kit.clip, vlm_kit.siglip])
def test_k_prompts_in_one_call_equal_k_single_calls_and_a_contrast_their_difference(build, folder):
    model = build()
    x = vlm_kit.image(2)
    cam = camkit.GradCAM(camkit.ImageTower(model), LAYER)
    together = cam(x, PromptTarget(model, PROMPTS, tokenizer=folder), **RAW)
    for k, text in enumerate(PROMPTS):
        alone = cam(x, PromptTarget(model, text, tokenizer=folder), **RAW)
        assert alone.shape == (2, 4, 4)
        torch.testing.assert_close(alone, together[:, k], atol=1e-5, rtol=1e-5)
    contrast = PromptTarget(model, "a cat", tokenizer=folder, contrast="a dog")
    torch.testing.assert_close(
        cam(x, contrast, **RAW), together[:, 0] - together[:, 1], atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("build", [vlm_kit.clip, vlm_kit.siglip])
def test_the_prompt_scores_are_the_models_own_logits_per_image(build, folder):
    model = build()
    x = vlm_kit.image(2)
    target = PromptTarget(model, PROMPTS, tokenizer=folder)
    siglip = model.config.model_type == "siglip"
    options = {"padding": "max_length", "max_length": 16} if siglip else {"padding": True}
    texts = dict(load_tokenizer(folder)(PROMPTS, return_tensors="pt", **options))
    with torch.no_grad():
        output = model(pixel_values=x, **texts)
        torch.testing.assert_close(target(camkit.ImageTower(model)(x)), output.logits_per_image)
        torch.testing.assert_close(target(output), output.logits_per_image)
    # without output=: the whole model's similarities are read from logits_per_image
    whole = camkit.GradCAM(camkit.KeywordInput(model, "pixel_values"), LAYER)
    by_class = whole(x, [[0, 1, 2]] * 2, additional_forward_args=texts, **RAW)
    tower = camkit.GradCAM(camkit.ImageTower(model), LAYER)(x, target, **RAW)
    torch.testing.assert_close(by_class, tower, atol=1e-5, rtol=1e-5)


def test_prompts_as_token_ids_equal_prompts_as_texts(folder):
    model = vlm_kit.clip()
    framed = [[1, *vlm_kit.ids(text), 3] for text in ("a cat", "a dog")]
    by_ids = PromptTarget(model, input_ids=torch.tensor(framed))
    by_text = PromptTarget(model, ["a cat", "a dog"], tokenizer=folder)
    torch.testing.assert_close(by_ids.embeddings, by_text.embeddings)


def test_the_text_tower_runs_once_per_prompt_set(folder):
    model = vlm_kit.clip()
    calls = []
    handle = model.text_model.register_forward_hook(lambda *args: calls.append(1))
    try:
        target = PromptTarget(model, PROMPTS, tokenizer=folder)
        cam = camkit.GradCAM(camkit.ImageTower(model))
        cam(vlm_kit.image(2), target)
        camkit.IntegratedGradients(camkit.ImageTower(model))(vlm_kit.image(1), target)
    finally:
        handle.remove()
    assert calls == [1]


@pytest.mark.parametrize("method", ["gradcam++", "layercam", "scorecam", "saliency", "ig"])
def test_other_methods_explain_prompts(method, folder):
    model = vlm_kit.clip()
    target = PromptTarget(model, PROMPTS[:2], tokenizer=folder)
    entry = camkit.METHODS[method]
    tower = camkit.ImageTower(model)
    explainer = entry.cls(tower, LAYER) if entry.needs_layer else entry.cls(tower)
    result = explainer(vlm_kit.image(1), target)
    assert result.shape[:2] == (1, 2) and torch.isfinite(result).all() and result.abs().sum() > 0


def test_a_prompt_for_a_model_without_a_text_tower_says_so(folder):
    with pytest.raises(TargetError, match="text tower"):
        PromptTarget(vlm_kit.llava(), "a cat", tokenizer=folder)


def test_a_folder_without_a_tokenizer_says_so(tmp_path):
    with pytest.raises(TargetError, match="holds no tokenizer"):
        PromptTarget(vlm_kit.clip(), "a cat", tokenizer=tmp_path)
    with pytest.raises(TargetError, match="does not exist"):
        load_tokenizer(tmp_path / "absent")
    with pytest.raises(TargetError, match="tokenizer="):
        PromptTarget(vlm_kit.clip(), "a cat")


def test_lrp_through_the_normalised_similarity_conserves_the_score(folder):
    """The embedding's norm is a constant for LRP (AttnLRP's identity rule on a
    normalisation): the projected embedding's relevance sums to the score (CLIP's projection
    has no bias), and is ``e * exp(t) t_hat / |e|`` by hand."""
    model = vlm_kit.clip().double()
    x = vlm_kit.image(1, dtype=torch.float64)
    target = PromptTarget(model, ["a cat", "a dog"], tokenizer=folder)
    layer = "visual_projection"
    lrp = camkit.LRP(camkit.ImageTower(model), composite="epsilon-plus", layers=[layer])
    with warnings.catch_warnings():  # the pixels: what the patch embedding keeps (not tested)
        warnings.simplefilter("ignore", camkit.errors.ConservationWarning)
        found = lrp.explain_batch(x, target)
    embedding = model.get_image_features(pixel_values=x).pooler_output.detach()
    texts = F.normalize(target.embeddings, dim=-1)
    expected = embedding[:, None] * target.scale * texts[None] / embedding.norm()
    torch.testing.assert_close(found.layers[layer].double(), expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(
        found.layers[layer].sum(-1).double(),
        found.scores.double(),
        atol=1e-6,
        rtol=1e-5,
    )


def test_concepts_say_which_vision_channels_carry_a_prompt(folder):
    """Channel relevance (gradient x activation summed over the tokens) for a prompt equals a
    hand reference."""
    from camkit.methods.concepts import ConceptAttribution

    model = vlm_kit.clip().double()
    x = vlm_kit.image(2, dtype=torch.float64)
    target = PromptTarget(model, "a cat", tokenizer=folder)
    found = ConceptAttribution(camkit.ImageTower(model), LAYER).relevances(x, target)
    kept = []
    layer = model.vision_model.encoder.layers[0]
    handle = layer.register_forward_hook(lambda m, i, o: kept.append(o))
    try:
        score = target(model.get_image_features(pixel_values=x).pooler_output)
    finally:
        handle.remove()
    (grad,) = torch.autograd.grad(score.sum(), kept[0])
    expected = (grad * kept[0]).sum(dim=1).detach()
    assert found.shape == (2, 32)
    torch.testing.assert_close(found.double(), expected, atol=1e-6, rtol=1e-5)
