"""Prompts in the explorer: a dual encoder's map of a typed prompt, a generative model's answer
with a map per generated word and the prompt tokens' relevance to it. The model comes from a
local HuggingFace folder (:func:`camkit.models.vlm.load_vlm`); the gallery's class views see
its image side (:func:`image_side`). Every call runs on the batcher's model thread.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from camkit import registry
from camkit.core.explainer import displayed
from camkit.core.trace import default_layer
from camkit.core.wrappers import ImageTower, image_inputs
from camkit.errors import ArgumentError, TargetError
from camkit.methods.cam.base import BaseCAM
from camkit.methods.cam.generation import Answer, explain_answer
from camkit.models import LoadedModel
from camkit.models.vlm import LoadedVLM
from camkit.serve.cache import LRU
from camkit.serve.explorer import Explorer
from camkit.targets import PromptTarget
from camkit.viz.text import token_colours

MAX_PROMPT_CHARS = 500
"""The longest prompt the explorer takes (characters); a longer one is a 422."""
MAX_NEW_TOKENS = 32
"""The most tokens a generative model answers with in the explorer."""
METHOD = "gradcam"


class ImageFeatures(nn.Module):
    """A generative model's image side for the gallery's class views: the mean over the image
    tokens of ``get_image_features`` (what the projector hands the language model), ``(B, D)``."""

    wraps_model = True

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.module = model

    def forward(self, x: Tensor) -> Tensor:
        features = self.module.get_image_features(**image_inputs(self.module, x))
        features = features if isinstance(features, Tensor) else features.pooler_output
        if isinstance(features, list | tuple):
            features = torch.stack([f.reshape(-1, f.shape[-1]).mean(0) for f in features])
        return features.mean(1) if features.ndim == 3 else features


def image_side(loaded: LoadedVLM) -> LoadedModel:
    """The model's image side as a :class:`~camkit.models.LoadedModel` whose "classes" are the
    feature dimensions: a dual encoder's :class:`~camkit.core.wrappers.ImageTower`, a generative
    model's :class:`ImageFeatures`."""
    side = ImageFeatures(loaded.model) if loaded.generative else ImageTower(loaded.model)
    size = loaded.preprocess.size
    reference = next(loaded.model.parameters())
    with torch.no_grad():
        width = side(torch.zeros(1, 3, *size, dtype=reference.dtype, device=reference.device))
    labels = [f"image feature {k}" for k in range(width.shape[-1])]
    layer = default_layer(side, size)
    return LoadedModel(f"hf:{loaded.folder}", side, loaded.preprocess, labels, layer, tuple(size))


def check_prompt(prompt: str | None) -> str:
    """A prompt the explorer explains: not empty, at most :data:`MAX_PROMPT_CHARS`."""
    if prompt is None or not prompt.strip():
        raise ArgumentError("missing query parameter 'prompt' (the text to explain)")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ArgumentError(
            f"the prompt has {len(prompt)} characters, more than {MAX_PROMPT_CHARS}: shorten it"
        )
    return prompt


@dataclass
class Prompts:
    """The vision-language model of an explorer and the caches of its prompts' targets (the
    text tower runs once per prompt), maps and explained answers."""

    loaded: LoadedVLM
    explorer: Explorer

    def __post_init__(self) -> None:
        explained = self.loaded.explained
        self.cam: BaseCAM = registry.build(METHOD, explained, None, self.explorer.settings)
        self.targets = LRU(64)
        self.maps = LRU(256)
        self.answers = LRU(32)

    def info(self) -> dict:
        """What the page needs to show the prompt box."""
        return {
            "kind": "generative" if self.loaded.generative else "dual",
            "method": METHOD,
            "max_prompt": MAX_PROMPT_CHARS,
            "max_new_tokens": MAX_NEW_TOKENS,
        }

    def _input(self, image: int) -> Tensor:
        reference = next(self.loaded.model.parameters())
        x = self.explorer.model_input(image).unsqueeze(0)
        return x.to(device=reference.device, dtype=reference.dtype)

    def prompt_map(self, image: int, prompt: str) -> np.ndarray:
        """A dual encoder's map of ``prompt`` over ``image`` (the model's input size)."""
        if self.loaded.generative:
            raise TargetError(
                "this model generates text: it has no text tower to score a prompt against the "
                "image; ask it the prompt (/api/answer) and click a generated word"
            )

        def make() -> np.ndarray:
            model, tokenizer = self.loaded.model, self.loaded.tokenizer
            target = self.targets.fetch(
                prompt, lambda: PromptTarget(model, [prompt], tokenizer=tokenizer)
            )
            maps, _ = displayed(self.cam, self._input(image), target)  # (1, 1, H, W), as the CLI
            return maps[0, 0].detach().cpu().numpy()

        return self.maps.fetch((image, prompt), make)

    def answer(self, image: int, prompt: str, max_new_tokens: int) -> Answer:
        """A generative model's explained answer to ``prompt`` about ``image`` (cached)."""
        if not self.loaded.generative:
            raise TargetError(
                "this model is a dual encoder: it scores a prompt, it does not answer one; "
                "ask for the prompt's map (/api/prompt-map)"
            )
        if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
            raise ArgumentError(f"max_new_tokens must be 1..{MAX_NEW_TOKENS}, got {max_new_tokens}")
        return self.answers.fetch(
            (image, prompt, max_new_tokens),
            lambda: explain_answer(
                self.loaded, self.cam, self._input(image), prompt, max_new_tokens
            ),
        )

    def answer_json(self, answer: Answer) -> dict:
        """The answer for the page: the tokens, the generated ones' positions, and for each
        generated token the colours (:func:`~camkit.viz.text.token_colours`) and values of the
        tokens before it."""
        relevance = answer.explanation.token_relevance[0].detach().cpu().double()
        colours = token_colours(relevance, len(answer.tokens), len(answer.positions))
        return {
            "tokens": answer.tokens,
            "positions": answer.positions,
            "colours": [row[:p] for row, p in zip(colours, answer.positions, strict=True)],
            "relevance": [
                row[:p].tolist() for row, p in zip(relevance, answer.positions, strict=True)
            ],
        }

    def token_map(self, image: int, prompt: str, max_new_tokens: int, k: int) -> np.ndarray:
        """The map of the ``k``-th generated token of the answer."""
        answer = self.answer(image, prompt, max_new_tokens)
        if not 0 <= k < len(answer.positions):
            raise TargetError(
                f"token {k} is out of range: the answer has {len(answer.positions)} generated "
                f"tokens, 0..{len(answer.positions) - 1}"
            )
        return answer.explanation.maps[0, k].detach().cpu().numpy()
