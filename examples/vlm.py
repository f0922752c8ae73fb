"""Vision-language models: where a dual encoder (CLIP, OpenCLIP) sees a prompt, and where a
generative model (LLaVA; Qwen2-VL, which reads flattened patches) looked for each word it said,
with the prompt tokens that mattered.

No weights exist offline here, so tiny random models are built from transformers configs and
saved in a local folder with a tiny tokenizer, then loaded back as a real checkpoint would be
(``camkit.models.vlm.load_vlm(folder)``, or ``camkit explain photo.jpg --model hf:FOLDER
--prompt "..."``). The maps of random weights mean nothing; the workflow is the real one.

    python examples/vlm.py
"""

import tempfile
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, processors

import camkit
from camkit.methods.cam.generation import explain_answer, explain_tokens
from camkit.models.vlm import load_vlm
from camkit.targets import PromptTarget, TokenTarget
from camkit.viz.text import token_html

WORDS = ["<pad>", "<bos>", "<unk>", "<eos>", "<image>", "a", "cat", "dog", "photo", "of"]
WORDS += ["what", "is", "in", "the", "picture", "on", "grass", "sofa", "red", "blue"]
WORDS += [f"w{i}" for i in range(len(WORDS), 32)]
VISION = dict(hidden_size=32, intermediate_size=64, num_attention_heads=2, image_size=32)
VISION |= dict(patch_size=8, num_hidden_layers=3)


def save_folder(model: torch.nn.Module, folder: Path, frame: str) -> Path:
    """Model, tokenizer (word level, texts framed as ``frame``) and image settings in ``folder``."""
    words = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    special = [("<bos>", 1), ("<eos>", 3)]
    words.post_processor = processors.TemplateProcessing(single=frame, special_tokens=special)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=words, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>"
    )
    size = {"height": 32, "width": 32}
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    transformers.CLIPImageProcessor(size=size, crop_size=size).save_pretrained(folder)
    return folder


def dual_encoder(root: Path, image: torch.Tensor) -> None:
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    text |= dict(vocab_size=32, max_position_embeddings=16, bos_token_id=1, eos_token_id=3)
    config = transformers.CLIPConfig(text_config=text, vision_config=VISION, projection_dim=16)
    folder = save_folder(transformers.CLIPModel(config).eval(), root / "clip", "<bos> $A <eos>")
    clip = load_vlm(folder)
    x = clip.preprocess(image).unsqueeze(0)
    prompts = PromptTarget(clip.model, ["a cat", "a dog"], tokenizer=clip.tokenizer)
    cam = camkit.GradCAM(clip.explained)  # the image tower: the text tower ran once, above
    maps = cam(x, prompts)
    print(f"CLIP: {cam.layers[0]}, maps {tuple(maps.shape)} (one per prompt)")
    print(f"  similarities {prompts(clip.explained(x)).detach().numpy().round(3)}")
    contrast = PromptTarget(clip.model, "a cat", tokenizer=clip.tokenizer, contrast="a dog")
    print(f"  'a cat' against 'a dog': map {tuple(cam(x, contrast).shape)}")


def generative(root: Path, image: torch.Tensor) -> None:
    torch.manual_seed(0)
    llama = dict(model_type="llama", hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    llama |= dict(num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=32)
    vision = VISION | {"model_type": "clip_vision_model"}
    config = transformers.LlavaConfig(vision_config=vision, text_config=llama, image_token_id=4)
    model = transformers.LlavaForConditionalGeneration(config).eval()
    llava = load_vlm(save_folder(model, root / "llava", "<bos> $A"))
    x = llava.preprocess(image).unsqueeze(0)
    ids = llava.prompt_ids("what is in the picture", x)
    with torch.no_grad():
        answer = llava.model.generate(input_ids=ids, pixel_values=x, max_new_tokens=4)
    cam = camkit.GradCAM(llava.explained)  # default: the vision layer the projector reads
    result = explain_tokens(cam, x, answer, prompt_length=ids.shape[1])
    tokens = llava.tokenizer.convert_ids_to_tokens(answer[0].tolist())
    print(f"LLaVA: {result.layer}, {result.maps.shape[1]} words from one forward pass")
    text = [k for k in range(ids.shape[1]) if ids[0, k] != llava.model.config.image_token_id]
    for k, position in enumerate(range(ids.shape[1], answer.shape[1])):
        relevance = result.token_relevance[0, k, text]
        top = text[int(relevance.abs().argmax())]
        print(f"  {tokens[position]!r}: prompt token {tokens[top]!r} mattered most")
    one = cam(
        x,
        TokenTarget(ids.shape[1], int(answer[0, ids.shape[1]])),
        additional_forward_args={"input_ids": answer},
    )
    print(f"  the first word alone: the same map ({torch.allclose(one, result.maps[0, 0])})")
    page = token_html(tokens, list(range(ids.shape[1], answer.shape[1])), result.token_relevance[0])
    (root / "tokens.html").write_text(page)


def open_clip_model(root: Path, image: torch.Tensor) -> None:
    """An OpenCLIP model saved as OpenCLIP models are on the HuggingFace hub, read offline."""
    import json

    import open_clip
    from safetensors.torch import save_file

    vision = dict(image_size=32, layers=2, width=32, head_width=16, patch_size=8)
    text = dict(context_length=16, vocab_size=49408, width=32, heads=2, layers=1)
    config = dict(embed_dim=16, vision_cfg=vision, text_cfg=text)
    folder = root / "open_clip"
    folder.mkdir()
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": config}))
    save_file(open_clip.CLIP(**config).state_dict(), folder / "open_clip_model.safetensors")
    model = open_clip.create_model(f"local-dir:{folder}").eval()
    tokenizer = open_clip.get_tokenizer(f"local-dir:{folder}")
    x = torch.nn.functional.interpolate(
        torch.as_tensor(image).permute(2, 0, 1)[None].float() / 255, size=(32, 32)
    )
    prompts = PromptTarget(model, ["a cat", "a dog"], tokenizer=tokenizer)
    cam = camkit.GradCAM(camkit.ImageTower(model))
    maps = cam(x, prompts)  # default layer: the image tower's last block
    print(f"OpenCLIP: {cam.layers[0]}, maps {tuple(maps.shape)} (one per prompt)")


def flat_patches(root: Path, image: torch.Tensor) -> None:
    """Qwen2-VL: images as flattened patches, 2 x 2 merged into one token (ImageInput)."""
    torch.manual_seed(0)
    vision = dict(depth=2, embed_dim=32, hidden_size=32, num_heads=2, patch_size=8)
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, vocab_size=32)
    text |= dict(num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    text |= dict(rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2]})
    config = transformers.Qwen2VLConfig(
        vision_config=vision, text_config=text, image_token_id=4, video_token_id=2
    )
    model = transformers.Qwen2VLForConditionalGeneration(config).eval()
    qwen = load_vlm(save_folder(model, root / "qwen2_vl", "<bos> $A"))
    x = qwen.preprocess(image).unsqueeze(0)
    answer = explain_answer(qwen, camkit.GradCAM(qwen.explained), x, "what is in the picture", 4)
    maps = answer.explanation.maps
    print(f"Qwen2-VL: {answer.explanation.layer}, {tuple(maps.shape)} from flattened patches")


if __name__ == "__main__":
    from skimage import data

    photo = data.chelsea()  # a cat
    with tempfile.TemporaryDirectory() as folder:
        dual_encoder(Path(folder), photo)
        generative(Path(folder), photo)
        flat_patches(Path(folder), photo)
        open_clip_model(Path(folder), photo)
