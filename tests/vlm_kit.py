"""Tiny random vision-language models built from transformers configs, and a tiny word-level
tokenizer saved in a local folder: nothing is downloaded.

Dual encoders: CLIP, SigLIP. Generative: LLaVA (CLIP vision tower, LLaMA text model with
grouped-query attention, ``vision_feature_layer=-2``), PaliGemma (SigLIP + Gemma), Gemma 3
(SigLIP + Gemma 3, pooled image tokens), InternVL and Aya Vision (2 x 2 patches merged into one
image token). OpenCLIP: a folder laid out as on the HuggingFace hub.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers builds the VLMs")
tokenizers = pytest.importorskip("tokenizers", reason="tokenizers builds the tokenizer")

WORDS = ["<pad>", "<bos>", "<unk>", "<eos>", "<image>", "a", "cat", "dog", "photo", "of"]
WORDS += ["the", "is", "on", "grass", "sofa", "red", "blue", "what", "in", "picture"]
WORDS += [f"w{i}" for i in range(len(WORDS), 32)]  # fillers: every id of the models is a word
VOCABULARY = len(WORDS)
IMAGE = WORDS.index("<image>")
SIZE, PATCH = 32, 8  # 4 x 4 patches
PATCHES = (SIZE // PATCH) ** 2


def tokenizer_folder(folder: Path, frame: str = "<bos> $A <eos>") -> Path:
    """A WordLevel tokenizer over :data:`WORDS` that frames a text as ``frame`` (CLIP's
    ``<bos> ... <eos>``; a language model's ``<bos> $A``), saved with ``save_pretrained`` in
    ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    words.post_processor = processors.TemplateProcessing(
        single=frame, special_tokens=[("<bos>", 1), ("<eos>", 3)]
    )
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=words,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
    )
    fast.save_pretrained(folder)
    return folder


def save_folder(model: torch.nn.Module, folder: Path, frame: str = "<bos> $A <eos>") -> Path:
    """The model, the tokenizer (:func:`tokenizer_folder`) and the image processor's settings
    in ``folder``: what ``load_vlm`` and ``--model hf:FOLDER`` read."""
    model.save_pretrained(folder)
    tokenizer_folder(folder, frame=frame)
    size = {"height": SIZE, "width": SIZE}
    transformers.CLIPImageProcessor(size=size, crop_size=size).save_pretrained(folder)
    return folder


def ids(text: str) -> list[int]:
    """Token ids of ``text`` without the frame (the words' indices)."""
    return [WORDS.index(word) for word in text.split()]


def _vision(**extra: object) -> dict:
    return dict(
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
        image_size=SIZE,
        patch_size=PATCH,
        num_hidden_layers=2,
        **extra,
    )


def _text(**extra: object) -> dict:
    settings = dict(
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=VOCABULARY,
        num_hidden_layers=2,
    )
    return {**settings, **extra}


def _text_tower(**extra: object) -> dict:
    """A dual encoder's one-layer text tower."""
    return dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        vocab_size=VOCABULARY,
        max_position_embeddings=16,
        **extra,
    )


def clip() -> torch.nn.Module:
    torch.manual_seed(0)
    text = _text_tower(bos_token_id=1, eos_token_id=3, pad_token_id=0)
    config = transformers.CLIPConfig(text_config=text, vision_config=_vision(), projection_dim=16)
    return transformers.CLIPModel(config).eval()


def siglip() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.SiglipConfig(text_config=_text_tower(), vision_config=_vision())
    return transformers.SiglipModel(config).eval()


def llava() -> torch.nn.Module:
    """LLaVA: 3 CLIP vision layers, the projector reading layer 1's output (``-2``)."""
    torch.manual_seed(0)
    vision = _vision(model_type="clip_vision_model") | {"num_hidden_layers": 3}
    config = transformers.LlavaConfig(
        vision_config=vision,
        text_config=_text(model_type="llama", max_position_embeddings=64),
        image_token_id=IMAGE,
        projector_hidden_act="gelu",
        vision_feature_layer=-2,
    )
    return transformers.LlavaForConditionalGeneration(config).eval()


def paligemma() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.PaliGemmaConfig(
        vision_config=_vision(model_type="siglip_vision_model", projection_dim=32),
        text_config=_text(model_type="gemma", num_key_value_heads=1),
        image_token_id=IMAGE,
        projection_dim=32,
    )
    return transformers.PaliGemmaForConditionalGeneration(config).eval()


def gemma3() -> torch.nn.Module:
    """Gemma 3: the 16 patch features average-pooled to 4 image tokens."""
    torch.manual_seed(0)
    config = transformers.Gemma3Config(
        vision_config=_vision(model_type="siglip_vision_model"),
        text_config=_text(model_type="gemma3_text", sliding_window=16),
        image_token_id=IMAGE,
        mm_tokens_per_image=4,
        boi_token_index=1,
        eoi_token_index=3,
    )
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():  # initialised to zeros: the answer would not depend on the image
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0, 0.2)
    return model


def internvl() -> torch.nn.Module:
    """InternVL (Chen et al., CVPR 2024): its own vision tower (a class token, the encoder list
    named ``layer``), the projector reading ``hidden_states[-2]`` (the output of layer 1 of 3)
    and merging each 2 x 2 patches into one image token (pixel shuffle, ``downsample_ratio``)."""
    torch.manual_seed(0)
    vision = _vision() | {"image_size": [SIZE] * 2, "patch_size": [PATCH] * 2}
    vision["num_hidden_layers"] = 3
    config = transformers.InternVLConfig(
        vision_config=vision,
        text_config=_text(model_type="qwen2", max_position_embeddings=64),
        image_token_id=IMAGE,
        downsample_ratio=0.5,
        vision_feature_layer=-2,
        projector_hidden_act="gelu",
    )
    return transformers.InternVLForConditionalGeneration(config).eval()


def aya_vision() -> torch.nn.Module:
    """Aya Vision: SigLIP's patches, each 2 x 2 merged into one image token
    (``downsample_factor``) for a Cohere 2 language model."""
    torch.manual_seed(0)
    config = transformers.AyaVisionConfig(
        vision_config=_vision(model_type="siglip_vision_model"),
        text_config=_text(model_type="cohere2", max_position_embeddings=64, sliding_window=16),
        image_token_index=IMAGE,
        downsample_factor=2,
        vision_feature_layer=-1,
    )
    return transformers.AyaVisionForConditionalGeneration(config).eval()


# each generative model and the number of image tokens its prompt holds
GENERATIVE = {
    "llava": (llava, PATCHES),
    "paligemma": (paligemma, PATCHES),
    "gemma3": (gemma3, 4),
    "internvl": (internvl, PATCHES // 4),
    "aya_vision": (aya_vision, PATCHES // 4),
}


def prompt(image_tokens: int, text: str = "what is in the picture") -> torch.Tensor:
    """``(1, T)`` ids: ``<bos>``, the image tokens, then the text."""
    return torch.tensor([[1] + [IMAGE] * image_tokens + ids(text)])


def image(batch: int = 1, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, SIZE, SIZE, generator=generator).to(dtype)


def openclip_folder(folder: Path) -> Path:
    """A tiny OpenCLIP model (2 vision blocks, one text block, the bundled CLIP tokenizer's
    vocabulary) saved as OpenCLIP models are on the HuggingFace hub: ``open_clip_config.json``
    (``model_cfg``, ``preprocess_cfg``) and ``open_clip_model.safetensors``; read back with
    ``open_clip.create_model("local-dir:FOLDER")`` and ``open_clip.get_tokenizer(...)``."""
    import json

    open_clip = pytest.importorskip("open_clip", reason="open_clip builds the OpenCLIP model")
    from safetensors.torch import save_file

    vision = dict(image_size=SIZE, layers=2, width=32, head_width=16, patch_size=PATCH)
    text = dict(context_length=16, vocab_size=49408, width=32, heads=2, layers=1)
    config = dict(embed_dim=16, vision_cfg=vision, text_cfg=text)
    torch.manual_seed(0)
    model = open_clip.CLIP(**config)
    folder.mkdir(parents=True, exist_ok=True)
    preprocess = {"mean": [0.5] * 3, "std": [0.5] * 3}
    settings = {"model_cfg": config, "preprocess_cfg": preprocess}
    (folder / "open_clip_config.json").write_text(json.dumps(settings))
    save_file(model.state_dict(), folder / "open_clip_model.safetensors")
    return folder


def qwen2_vl() -> torch.nn.Module:
    """Qwen2-VL (Wang et al. 2024): images as flattened 8 px patches (each repeated over 2
    frames) with ``image_grid_thw``, 2 x 2 patches merged into one image token after the last
    vision block, M-RoPE in the language model; ``<bos>`` opens the image (vision start)."""
    torch.manual_seed(0)
    vision = dict(depth=2, embed_dim=32, hidden_size=32, num_heads=2, mlp_ratio=2)
    vision |= dict(patch_size=PATCH, spatial_merge_size=2, temporal_patch_size=2)
    rope = {"rope_type": "default", "mrope_section": [1, 1, 2]}
    text = _text(max_position_embeddings=64, rope_parameters=rope)
    config = transformers.Qwen2VLConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=IMAGE,
        video_token_id=2,
        vision_start_token_id=1,
        vision_end_token_id=3,
    )
    return transformers.Qwen2VLForConditionalGeneration(config).eval()


def llava_next() -> torch.nn.Module:
    """LLaVA-NeXt (Liu et al. 2024, anyres): an image at 32x64 or 64x64 is read as the whole
    image resized to 32 px and its 32 px tiles; the projector reads ``hidden_states[-2]``."""
    torch.manual_seed(0)
    vision = _vision(model_type="clip_vision_model") | {"num_hidden_layers": 3}
    config = transformers.LlavaNextConfig(
        vision_config=vision,
        text_config=_text(model_type="llama", max_position_embeddings=256),
        image_token_id=IMAGE,
        image_grid_pinpoints=[[SIZE, SIZE], [SIZE, 2 * SIZE], [2 * SIZE, 2 * SIZE]],
        vision_feature_layer=-2,
    )
    return transformers.LlavaNextForConditionalGeneration(config).eval()
