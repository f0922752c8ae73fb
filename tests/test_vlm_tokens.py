"""Generated tokens as targets of generative vision-language models (LLaVA, PaliGemma, Gemma 3,
InternVL, Aya Vision) on tiny random models: the layer the projector reads, hand references in
float64, and every generated token of an answer from one forward pass."""

from __future__ import annotations

import pytest
import torch
import vlm_kit

import camkit
from camkit.errors import TargetError
from camkit.methods.cam.generation import explain_tokens
from camkit.targets import SpanTarget, TokenTarget

RAW = {"relu": False, "upsample": False, "normalize": False}
# the layer each model's projector reads and the tokens before its patches there
FEATURES = {
    # vision_feature_layer=-2: hidden_states[-2] of 3 layers, the output of layer 1; CLIP's class
    "llava": ("model.vision_tower.encoder.layers.1", 1),
    "paligemma": ("model.vision_tower.post_layernorm", 0),
    "gemma3": ("model.vision_tower.post_layernorm", 0),
    "internvl": ("model.vision_tower.encoder.layer.1", 1),  # -2 of 3 layers; its class token
    "aya_vision": ("model.vision_tower.encoder.layers.1", 0),  # -1: the last of 2 layers
}


def answer(name, dtype=torch.float32):
    """``(model, image, prompt length, generated sequence)``: 4 greedy tokens."""
    build, image_tokens = vlm_kit.GENERATIVE[name]
    model = build().to(dtype)
    x = vlm_kit.image(1, dtype=dtype)
    ids = vlm_kit.prompt(image_tokens)
    with torch.no_grad():
        sequence = model.generate(input_ids=ids, pixel_values=x, max_new_tokens=4, do_sample=False)
    return model, x, ids.shape[1], sequence


def hand_reference(model, x, sequence, layer, embeddings, position, token, prefix):
    """Grad-CAM at ``layer`` and gradient x input at ``embeddings`` by hand: plain forward hooks
    keep the outputs, autograd differentiates the logit of ``token`` at ``position``."""
    kept = {}
    hooks = [
        module.register_forward_hook(lambda m, i, o, key=key: kept.__setitem__(key, o))
        for key, module in (("layer", layer), ("embeddings", embeddings))
    ]
    try:
        logits = model(input_ids=sequence, pixel_values=x).logits
    finally:
        for hook in hooks:
            hook.remove()
    score = logits[:, position - 1, token].sum()
    grad, grad_embeddings = torch.autograd.grad(score, [kept["layer"], kept["embeddings"]])
    act, grad = kept["layer"][:, prefix:], grad[:, prefix:]  # the patch tokens
    cam = (grad.mean(dim=1, keepdim=True) * act).sum(-1).reshape(-1, 4, 4)
    relevance = (grad_embeddings * kept["embeddings"]).sum(-1)
    return cam.detach(), relevance.detach()


@pytest.mark.parametrize("name", sorted(FEATURES))
def test_the_default_layer_is_the_one_the_projector_reads(name):
    build, image_tokens = vlm_kit.GENERATIVE[name]
    cam = camkit.GradCAM(camkit.KeywordInput(build(), "pixel_values"))
    ids = vlm_kit.prompt(image_tokens)
    cam(vlm_kit.image(), TokenTarget(-1, 5), additional_forward_args={"input_ids": ids})
    assert cam.layers == [FEATURES[name][0]]


@pytest.mark.parametrize("name", sorted(FEATURES))
def test_a_token_map_and_its_token_relevance_equal_hand_references_in_float64(name):
    """The layer LLaVA's projector reads is recorded by transformers' own hooks: camkit's
    capture must still hand the gradient on (it used to say the score does not depend on it).
    InternVL and Aya Vision merge 2 x 2 patches into one image token after that layer: the map
    is the 4 x 4 patch grid, read from the model."""
    model, x, prompt_length, sequence = answer(name, torch.float64)
    layer_name, prefix = FEATURES[name]
    layer = model.get_submodule(layer_name)
    cam = camkit.GradCAM(camkit.KeywordInput(model, "pixel_values"), layer)
    result = explain_tokens(cam, x, sequence, prompt_length=prompt_length, **RAW)
    embeddings = model.get_input_embeddings()
    for k, position in enumerate(range(prompt_length, sequence.shape[1])):
        token = int(sequence[0, position])
        expected, relevance = hand_reference(
            model, x, sequence, layer, embeddings, position, token, prefix
        )
        torch.testing.assert_close(result.maps[:, k].double(), expected, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(
            result.token_relevance[:, k].double(), relevance, atol=1e-6, rtol=1e-5
        )
    assert result.maps.abs().sum() > 0 and result.token_relevance.abs().sum() > 0


@pytest.mark.parametrize("name", sorted(FEATURES))
def test_k_generated_tokens_in_one_call_equal_k_single_calls(name):
    model, x, prompt_length, sequence = answer(name)
    cam = camkit.GradCAM(camkit.KeywordInput(model, "pixel_values"))
    result = explain_tokens(cam, x, sequence, prompt_length=prompt_length, token_batch=3, **RAW)
    generated = TokenTarget.generated(sequence, prompt_length)
    assert result.maps.shape == (1, len(generated.positions), 4, 4)
    assert result.maps.abs().sum() > 0
    for k, (position, token) in enumerate(zip(generated.positions, generated.tokens, strict=True)):
        alone = cam(
            x, TokenTarget(position, token), additional_forward_args={"input_ids": sequence}, **RAW
        )
        torch.testing.assert_close(alone, result.maps[:, k], atol=1e-5, rtol=1e-4)


def test_a_named_layer_the_projector_reads_gets_its_gradient_through_the_plain_call():
    model, x, _, sequence = answer("llava")
    cam = camkit.GradCAM(
        camkit.KeywordInput(model, "pixel_values"), "model.vision_tower.encoder.layers.0"
    )
    maps = cam(
        x, TokenTarget(-1, int(sequence[0, -1])), additional_forward_args={"input_ids": sequence}
    )
    assert maps.abs().sum() > 0
    with camkit.record(model, "model.vision_tower.encoder.layers.1") as rec:
        model(input_ids=sequence, pixel_values=x).logits[0, -1, 5].backward()
    assert rec.gradients["model.vision_tower.encoder.layers.1"].abs().sum() > 0
    model.zero_grad(set_to_none=True)


def test_token_targets_score_logits_contrasts_and_spans_as_by_hand():
    logits = torch.randn(2, 6, 10, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(TokenTarget(3, 7)(logits), logits[:, 2, 7])
    torch.testing.assert_close(TokenTarget(-1, 7)(logits), logits[:, 4, 7])
    both = TokenTarget([2, 5], [1, 4])(logits)
    torch.testing.assert_close(both, torch.stack([logits[:, 1, 1], logits[:, 4, 4]], 1))
    contrast = TokenTarget(3, 7, against=2)(logits)
    torch.testing.assert_close(contrast, logits[:, 2, 7] - logits[:, 2, 2])
    logp = logits.log_softmax(-1)
    torch.testing.assert_close(TokenTarget(3, 7, log_prob=True)(logits), logp[:, 2, 7])
    span = SpanTarget(2, [4, 9, 1])(logits)
    torch.testing.assert_close(span, logp[:, 1, 4] + logp[:, 2, 9] + logp[:, 3, 1])


def test_a_token_position_outside_the_sequence_says_so():
    logits = torch.zeros(1, 6, 10)
    for position in (0, 6, -6):
        with pytest.raises(TargetError, match="outside the sequence of 6 tokens"):
            TokenTarget(position, 1)(logits)
    with pytest.raises(TargetError, match="outside the vocabulary"):
        TokenTarget(2, 10)(logits)
    with pytest.raises(TargetError, match="vocabulary"):
        TokenTarget(2, 1)(torch.zeros(1, 10))
    model, x, _, sequence = answer("llava")
    cam = camkit.GradCAM(camkit.KeywordInput(model, "pixel_values"))
    with pytest.raises(TargetError, match="outside the sequence"):
        cam(x, TokenTarget(40, 5), additional_forward_args={"input_ids": sequence})


def test_explaining_an_answer_leaves_the_model_as_it_was():
    from conftest import assert_untouched, model_state

    model, x, prompt_length, sequence = answer("llava")
    with torch.no_grad():
        model(input_ids=sequence, pixel_values=x)  # transformers installs its own recorders once
    before = model_state(model)
    cam = camkit.GradCAM(camkit.KeywordInput(model, "pixel_values"))
    explain_tokens(cam, x, sequence, prompt_length=prompt_length, token_batch=2)
    assert_untouched(model, before)
