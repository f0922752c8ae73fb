"""``camkit explain --model hf:FOLDER --prompt ...`` on tiny random models saved in local folders,
and the token page (viz.text)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import vlm_kit
from vlm_kit import save_folder

import camkit
from camkit import io
from camkit.cli import main
from camkit.methods.cam.generation import explain_answer, explain_tokens
from camkit.models.vlm import load_vlm
from camkit.targets import PromptTarget
from camkit.viz.text import token_colour, token_html


@pytest.fixture(scope="module")
def photo(tmp_path_factory):
    path = tmp_path_factory.mktemp("photos") / "photo.png"
    rng = np.random.default_rng(0)
    io.save_image(path, rng.integers(0, 256, (40, 48, 3), dtype=np.uint8))
    return path


def test_a_dual_encoder_gets_an_overlay_per_prompt_equal_to_the_librarys_maps(tmp_path, photo):
    folder = save_folder(vlm_kit.clip(), tmp_path / "clip")
    out = tmp_path / "out"
    argv = ["explain", str(photo), "--model", f"hf:{folder}", "--out", str(out), "--quiet"]
    status = main([*argv, "--prompt", "a cat", "--prompt", "a dog", "--format", "png"])
    assert status == 0
    written = sorted(p.name for p in out.iterdir())
    assert written == ["manifest.json", "photo_gradcam_0_a-cat.png", "photo_gradcam_1_a-dog.png"]
    written = written[1:]
    loaded = load_vlm(folder)
    x = loaded.preprocess(io.read_image(photo)).unsqueeze(0)
    target = PromptTarget(loaded.model, ["a cat", "a dog"], tokenizer=loaded.tokenizer)
    heat = camkit.GradCAM(loaded.explained).explain_batch(x, target).maps
    region = loaded.preprocess.photo_region(40, 48)
    expected = camkit.viz.overlay_on_photo(io.read_image(photo), heat[0, 1], region)
    assert np.array_equal(io.read_image(out / written[1]), expected)


def test_a_generative_model_gets_an_overlay_per_token_and_the_token_page(tmp_path, photo):
    folder = save_folder(vlm_kit.llava(), tmp_path / "llava", frame="<bos> $A")
    out = tmp_path / "out"
    argv = ["explain", str(photo), "--model", f"hf:{folder}", "--out", str(out), "--quiet"]
    assert main([*argv, "--prompt", "what is in the picture", "--max-new-tokens", "3"]) == 0
    overlays = sorted(p.name for p in out.glob("*.jpg"))
    assert len(overlays) == 3 and all(n.startswith("photo_gradcam_") for n in overlays)
    page = (out / "photo_gradcam_tokens.html").read_text()
    assert page.count('<span class="word">') == 3 and "picture" in page


def test_the_cli_says_what_is_wrong(tmp_path, photo, capsys):
    argv = ["explain", str(photo), "--out", str(tmp_path / "out")]
    assert main([*argv, "--prompt", "a cat"]) == 2
    assert "--prompt needs a vision-language model" in capsys.readouterr().err
    folder = tmp_path / "clip"
    vlm_kit.clip().save_pretrained(folder)  # no tokenizer
    assert main([*argv, "--model", f"hf:{folder}", "--prompt", "a cat"]) == 2
    assert "holds no tokenizer" in capsys.readouterr().err
    assert main([*argv, "--model", f"hf:{folder}"]) == 2
    assert "--prompt" in capsys.readouterr().err
    assert main([*argv, "--model", f"hf:{folder}", "--prompt", "a", "--target", "3"]) == 2
    assert "not classes" in capsys.readouterr().err
    llava = save_folder(vlm_kit.llava(), tmp_path / "llava", frame="<bos> $A")
    assert main([*argv, "--model", f"hf:{llava}", "--prompt", "a", "--method", "scorecam"]) == 2
    assert "one pass" in capsys.readouterr().err


def test_the_token_page_colours_each_token_by_its_relevance():
    tokens = ["<bos>", "a", "<cat>", "sat"]
    relevance = torch.tensor([[0.0, 2.0, -1.0, 0.0]])
    page = token_html(tokens, [3], relevance, "t")
    assert "&lt;cat&gt;" in page and '<span class="word">sat</span>' in page
    limit = camkit.viz.colour.signed_limit(relevance.numpy().astype(np.float64))
    assert f"background:{token_colour(2.0, limit)}" in page
    assert token_colour(2.0, 2.0) == "rgba(220, 40, 40, 1.000)"
    assert token_colour(-1.0, 2.0) == "rgba(40, 40, 220, 0.500)"
    assert token_colour(0.0, 2.0) == "transparent"


def test_the_token_relevance_of_the_page_is_the_explanations(tmp_path):
    folder = save_folder(vlm_kit.llava(), tmp_path / "llava", frame="<bos> $A")
    loaded = load_vlm(folder)
    x = vlm_kit.image()
    ids = loaded.prompt_ids("what is in the picture", x)
    assert ids.shape[1] == 1 + vlm_kit.PATCHES + 5
    assert (ids[0, 1 : 1 + vlm_kit.PATCHES] == vlm_kit.IMAGE).all()
    sequence = loaded.model.generate(input_ids=ids, pixel_values=x, max_new_tokens=2)
    result = explain_tokens(
        camkit.GradCAM(loaded.explained), x, sequence, prompt_length=ids.shape[1]
    )
    assert result.token_relevance.shape == (1, 2, sequence.shape[1])


def test_the_example_runs(capsys):
    import runpy
    from pathlib import Path

    example = Path(__file__).parent.parent / "examples" / "vlm.py"
    runpy.run_path(str(example), run_name="__main__")
    printed = capsys.readouterr().out
    assert "maps (1, 2, 32, 32)" in printed and "the same map (True)" in printed
    assert "Qwen2-VL: model.visual.blocks.1" in printed
    assert "OpenCLIP: visual.transformer.resblocks.1.ln_1" in printed


def test_an_hf_run_writes_a_manifest_the_report_shows_with_the_token_page(tmp_path, photo):
    from camkit.runs.manifest import read_manifest
    from tests.test_report import page_data

    clip = save_folder(vlm_kit.clip(), tmp_path / "clip")
    llava = save_folder(vlm_kit.llava(), tmp_path / "llava", frame="<bos> $A")
    argv = ["explain", str(photo), "--quiet", "--report"]
    dual = tmp_path / "dual"
    assert main([*argv, "--model", f"hf:{clip}", "--out", str(dual), "--prompt", "a cat",
                 "--prompt", "a dog"]) == 0  # fmt: skip
    records = read_manifest(dual).records
    assert [(r["label"], r["target"], r["output"]) for r in records] == [
        ("a cat", 0, "photo_gradcam_0_a-cat.jpg"),
        ("a dog", 1, "photo_gradcam_1_a-dog.jpg"),
    ]
    overlays = page_data(dual / "index.html")["images"][0]["overlays"]
    assert [(o["label"], o["src"], o["tokens"]) for o in overlays] == [
        ("a cat", "photo_gradcam_0_a-cat.jpg", None),
        ("a dog", "photo_gradcam_1_a-dog.jpg", None),
    ]
    answer = tmp_path / "answer"
    assert main([*argv, "--model", f"hf:{llava}", "--out", str(answer), "--prompt",
                 "what is in the picture", "--max-new-tokens", "2"]) == 0  # fmt: skip
    records = read_manifest(answer).records
    assert [r["target"] for r in records] == [0, 1]
    assert all(r["tokens"] == "photo_gradcam_tokens.html" for r in records)
    overlays = page_data(answer / "index.html")["images"][0]["overlays"]
    assert [o["tokens"] for o in overlays] == ["photo_gradcam_tokens.html"] * 2
    assert (answer / overlays[0]["tokens"]).is_file()


@pytest.mark.parametrize("name", ["internvl", "aya_vision"])
def test_a_saved_folder_loads_and_its_answer_is_explained_as_in_memory(tmp_path, name):
    """InternVL and Aya Vision from a local folder: the prompt holds as many image tokens as the
    model makes of the image (its 2 x 2 merged patches: 4), and the answer's maps and token
    relevance equal explain_tokens on the model built in memory."""
    build, image_tokens = vlm_kit.GENERATIVE[name]
    model = build()
    loaded = load_vlm(save_folder(model, tmp_path / name, frame="<bos> $A"))
    assert loaded.generative and type(loaded.model) is type(model)
    x = vlm_kit.image()
    ids = loaded.prompt_ids("what is in the picture", x)
    torch.testing.assert_close(ids, vlm_kit.prompt(image_tokens))
    answer = explain_answer(
        loaded, camkit.GradCAM(loaded.explained), x, "what is in the picture", 3
    )
    sequence = torch.tensor([[vlm_kit.WORDS.index(t) for t in answer.tokens]])
    cam = camkit.GradCAM(camkit.KeywordInput(model, "pixel_values"))
    expected = explain_tokens(cam, x, sequence, prompt_length=ids.shape[1])
    assert answer.positions == list(range(ids.shape[1], sequence.shape[1]))
    torch.testing.assert_close(answer.explanation.maps, expected.maps)
    torch.testing.assert_close(answer.explanation.token_relevance, expected.token_relevance)
