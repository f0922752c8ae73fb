"""The explorer's prompt views (camkit.serve.prompts) on tiny random CLIP and LLaVA saved in local
folders: the API through the ASGI test client, equal to the library's maps, and the prompt box in
headless Chromium."""

from __future__ import annotations

import io as pyio
import json
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
import vlm_kit
from vlm_kit import save_folder

import camkit
from camkit import io as cio
from camkit.methods.cam.generation import explain_answer, explain_tokens
from camkit.models.vlm import load_vlm
from camkit.targets import PromptTarget
from camkit.viz.text import token_colours

pytest.importorskip("starlette", reason="camkit serve's web stack: pip install 'camkit[serve]'")
pytest.importorskip("httpx", reason="the ASGI test client needs httpx (the dev extra)")
from starlette.testclient import TestClient  # noqa: E402

from camkit.serve import security  # noqa: E402
from camkit.serve.app import create_app, running  # noqa: E402
from camkit.serve.explorer import Explorer  # noqa: E402
from camkit.serve.gallery import scan  # noqa: E402
from camkit.serve.prompts import MAX_PROMPT_CHARS, image_side  # noqa: E402
from tests.conftest import assert_untouched, model_state  # noqa: E402

TOKEN = "secret-token-for-tests"
QUESTION = "what is in the picture"


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    for k in range(2):
        cio.save_png(folder / f"photo{k}.png", rng.integers(0, 256, (40, 48, 3), dtype=np.uint8))
    return folder


@pytest.fixture(scope="module")
def clip_loaded(tmp_path_factory):
    return load_vlm(save_folder(vlm_kit.clip(), tmp_path_factory.mktemp("clip")))


@pytest.fixture(scope="module")
def llava_loaded(tmp_path_factory):
    folder = save_folder(vlm_kit.llava(), tmp_path_factory.mktemp("llava"), frame="<bos> $A")
    return load_vlm(folder)


def client_for(loaded, photos: Path) -> tuple[TestClient, Explorer]:
    explorer = Explorer({"a": image_side(loaded)}, scan([photos])[0])
    client = TestClient(create_app(explorer, token=TOKEN, vlm=loaded))
    client.headers[security.TOKEN_HEADER] = TOKEN
    return client, explorer


def npy(response) -> np.ndarray:
    assert response.status_code == 200, response.text
    return np.load(pyio.BytesIO(response.content))


def model_input(explorer: Explorer, image: int) -> torch.Tensor:
    return explorer.preprocess(cio.read_image(explorer.entries[image].path)).unsqueeze(0)


def test_a_prompts_map_equals_the_librarys_map_and_the_text_tower_runs_once(clip_loaded, photos):
    before = model_state(clip_loaded.model)
    client, explorer = client_for(clip_loaded, photos)
    with client:
        info = client.get("/api/info").json()
        assert info["prompts"]["kind"] == "dual"
        calls = []
        handle = clip_loaded.model.text_model.register_forward_hook(lambda *_: calls.append(1))
        try:
            got = npy(
                client.get(
                    "/api/prompt-map", params={"image": 1, "prompt": "a cat", "format": "npy"}
                )
            )
            again = client.get("/api/prompt-map", params={"image": 0, "prompt": "a cat"})
        finally:
            handle.remove()
        assert again.status_code == 200 and again.headers["content-type"] == "image/png"
        assert len(calls) == 1  # one prompt: the text tower ran once, for both images
    target = PromptTarget(clip_loaded.model, ["a cat"], tokenizer=clip_loaded.tokenizer)
    expected = (
        camkit.GradCAM(clip_loaded.explained).explain_batch(model_input(explorer, 1), target).maps
    )
    assert got.shape == expected.shape[-2:]
    assert np.array_equal(got, expected[0, 0].numpy())
    other = npy(
        client_for(clip_loaded, photos)[0].get(
            "/api/prompt-map", params={"image": 1, "prompt": "a dog", "format": "npy"}
        )
    )
    assert not np.array_equal(other, got)  # another prompt, another map
    assert_untouched(clip_loaded.model, before)


def test_a_click_on_word_k_equals_explain_tokens_map_k(llava_loaded, photos):
    client, explorer = client_for(llava_loaded, photos)
    with client:
        assert client.get("/api/info").json()["prompts"]["kind"] == "generative"
        asked = {"image": 0, "prompt": QUESTION, "max_new_tokens": 3}
        answer = client.get("/api/answer", params=asked)
        assert answer.status_code == 200, answer.text
        answer = answer.json()
        maps = [
            npy(client.get("/api/token-map", params={**asked, "word": k, "format": "npy"}))
            for k in range(len(answer["positions"]))
        ]
        assert client.get("/api/token-map", params={**asked, "word": 1}).status_code == 200
        beyond = client.get("/api/token-map", params={**asked, "word": 3})
        assert beyond.status_code == 422 and "0..2" in beyond.json()["error"]
    x = model_input(explorer, 0)
    ids = llava_loaded.prompt_ids(QUESTION, x)
    with torch.no_grad():
        sequence = llava_loaded.model.generate(
            input_ids=ids, pixel_values=x, max_new_tokens=3, do_sample=False
        )
    cam = camkit.GradCAM(llava_loaded.explained)
    result = explain_tokens(cam, x, sequence, prompt_length=ids.shape[1])
    positions = list(range(ids.shape[1], sequence.shape[1]))
    assert answer["positions"] == positions and len(maps) == 3
    tokens = llava_loaded.tokenizer.convert_ids_to_tokens(sequence[0].tolist())
    assert answer["tokens"] == tokens
    for k in range(3):
        assert np.array_equal(maps[k], result.maps[0, k].numpy())
    relevance = result.token_relevance[0].double()
    colours = token_colours(relevance, len(tokens), 3)
    for k, position in enumerate(positions):
        assert answer["colours"][k] == colours[k][:position]
        assert np.allclose(answer["relevance"][k], relevance[k, :position].numpy(), rtol=0, atol=0)


def test_a_qwen2_vl_folder_answers_and_each_word_has_the_answers_map(tmp_path, photos):
    """Qwen2-VL reads flattened patches: the explorer's image side and answer go through
    camkit.ImageInput' layout, and word k's map is map k of LoadedVLM.answer."""
    loaded = load_vlm(save_folder(vlm_kit.qwen2_vl(), tmp_path / "qwen2_vl", frame="<bos> $A"))
    client, explorer = client_for(loaded, photos)
    asked = {"image": 0, "prompt": QUESTION, "max_new_tokens": 3}
    with client:
        answer = client.get("/api/answer", params=asked)
        assert answer.status_code == 200, answer.text
        words = len(answer.json()["positions"])
        maps = [
            npy(client.get("/api/token-map", params={**asked, "word": k, "format": "npy"}))
            for k in range(words)
        ]
    expected = explain_answer(
        loaded, camkit.GradCAM(loaded.explained), model_input(explorer, 0), QUESTION, 3
    )
    assert words == 3 and answer.json()["positions"] == expected.positions
    for k in range(words):
        assert np.array_equal(maps[k], expected.explanation.maps[0, k].numpy())


def test_an_openclip_folder_gets_the_prompt_box_and_its_maps(tmp_path, photos):
    pytest.importorskip("open_clip", reason="open_clip builds the OpenCLIP model")
    loaded = load_vlm(vlm_kit.openclip_folder(tmp_path / "open_clip"))
    client, explorer = client_for(loaded, photos)
    with client:
        assert client.get("/api/info").json()["prompts"]["kind"] == "dual"
        asked = {"image": 1, "prompt": "a cat", "format": "npy"}
        got = npy(client.get("/api/prompt-map", params=asked))
    assert explorer.default_layer == "visual.transformer.resblocks.1.ln_1"
    target = PromptTarget(loaded.model, ["a cat"], tokenizer=loaded.tokenizer)
    x = model_input(explorer, 1)
    expected = camkit.GradCAM(loaded.explained).explain_batch(x, target).maps
    assert np.array_equal(got, expected[0, 0].numpy())


def test_bad_prompts_get_clear_errors(clip_loaded, llava_loaded, photos):
    from tests.test_serve import explorer_for, photo_folder  # a classifier's explorer

    classifier = TestClient(create_app(explorer_for(photo_folder(photos / "c")), token=TOKEN))
    classifier.headers[security.TOKEN_HEADER] = TOKEN
    with classifier:
        refused = classifier.get("/api/prompt-map", params={"image": 0, "prompt": "a cat"})
        assert refused.status_code == 422 and "no text tower" in refused.json()["error"]
        assert classifier.get("/api/info").json()["prompts"] is None
    llava, _ = client_for(llava_loaded, photos)
    with llava:
        refused = llava.get("/api/prompt-map", params={"image": 0, "prompt": "a cat"})
        assert refused.status_code == 422 and "no text tower" in refused.json()["error"]
    clip, _ = client_for(clip_loaded, photos)
    with clip:
        long = clip.get(
            "/api/prompt-map", params={"image": 0, "prompt": "a" * (MAX_PROMPT_CHARS + 1)}
        )
        assert long.status_code == 422 and str(MAX_PROMPT_CHARS) in long.json()["error"]
        words = clip.get("/api/prompt-map", params={"image": 0, "prompt": " ".join(["cat"] * 40)})
        assert words.status_code == 422, words.text
        assert "42 tokens" in words.json()["error"] and "16 positions" in words.json()["error"]
        empty = clip.get("/api/prompt-map", params={"image": 0, "prompt": " "})
        assert empty.status_code == 422 and "prompt" in empty.json()["error"]
        answered = clip.get("/api/answer", params={"image": 0, "prompt": "a cat"})
        assert answered.status_code == 422 and "dual encoder" in answered.json()["error"]
        assert clip.get("/api/prompt-map", params={"image": 9, "prompt": "a"}).status_code == 404
        clip.headers.pop(security.TOKEN_HEADER)
        assert clip.get("/api/prompt-map", params={"image": 0, "prompt": "a"}).status_code == 401


def test_camkit_serve_and_the_notebook_load_an_hf_folder_as_explain_does(clip_loaded, photos):
    from camkit.cli import build_parser
    from camkit.cli.commands.serve import build
    from camkit.cli.common import UsageError

    folder = f"hf:{clip_loaded.folder}"
    args = build_parser().parse_args(["serve", str(photos), "--model", folder, "--device", "cpu"])
    prepared = build(args)
    params = {"image": 0, "prompt": "a cat", "format": "npy"}
    with TestClient(prepared.app, base_url="http://127.0.0.1:8000") as client:
        client.headers[security.TOKEN_HEADER] = prepared.token
        info = client.get("/api/info").json()
        assert info["prompts"]["kind"] == "dual" and info["model"] == folder
        served = npy(client.get("/api/prompt-map", params=params))
    x = clip_loaded.preprocess(cio.read_image(sorted(photos.glob("*.png"))[0])).unsqueeze(0)
    target = PromptTarget(clip_loaded.model, ["a cat"], tokenizer=clip_loaded.tokenizer)
    expected = camkit.GradCAM(clip_loaded.explained).explain_batch(x, target).maps
    assert np.array_equal(served, expected[0, 0].numpy())
    with camkit.explore(folder, str(photos)) as view:  # the notebook: the same app
        base, token = view.url.split("?token=")
        query = f"image=0&prompt=a%20cat&format=npy&token={token}"
        with urllib.request.urlopen(f"{base}api/prompt-map?{query}") as reply:
            assert np.array_equal(np.load(pyio.BytesIO(reply.read())), served)
    empty = clip_loaded.folder.parent / "empty"
    empty.mkdir(exist_ok=True)
    bad = build_parser().parse_args(["serve", str(photos), "--model", f"hf:{empty}"])
    with pytest.raises(UsageError, match="config.json"):
        build(bad)


# ----------------------------------------------------------------------------- the browser

from tests.test_report import Browser, needs_browser  # noqa: E402

READY = """new Promise((done) => { (function poll() {
  if (document.body.dataset.ready === '1') done(); else setTimeout(poll, 20); })(); })"""
UNTIL = """new Promise((done) => { const t0 = Date.now(); (function poll() {
  if (%s || Date.now() - t0 > 20000) setTimeout(done, 50); else setTimeout(poll, 20); })(); })"""
PIXELS = """(async () => {
  const img = document.querySelector('#prompt-map');
  const canvas = document.createElement('canvas');
  canvas.width = img.naturalWidth; canvas.height = img.naturalHeight;
  canvas.getContext('2d').drawImage(img, 0, 0);
  return Array.from(canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data);
})()"""


@needs_browser
@pytest.mark.slow
def test_typing_a_prompt_shows_its_map_and_clicking_a_word_its_map(
    clip_loaded, llava_loaded, photos, tmp_path
):
    for loaded, kind in ((clip_loaded, "dual"), (llava_loaded, "generative")):
        explorer = Explorer({"a": image_side(loaded)}, scan([photos])[0])
        with running(create_app(explorer, token=TOKEN, vlm=loaded)) as base:
            browser = Browser(tmp_path / f"profile-{kind}")
            try:
                browser.open(f"{base}/?token={TOKEN}")
                browser.js(READY)
                browser.js("document.querySelector('.card[data-id=\"1\"]').click()")
                browser.js(UNTIL % "window.camkitState.image === 1")
                assert browser.js("document.getElementById('prompts').hidden") is False
                text = "a cat" if kind == "dual" else QUESTION
                browser.js(
                    f"""(() => {{ const box = document.getElementById('prompt');
                    box.value = {json.dumps(text)};
                    document.getElementById('prompt-form').requestSubmit(); }})()"""
                )
                if kind == "dual":
                    browser.js(UNTIL % "document.getElementById('prompt-map').dataset.shown")
                    pixels = browser.js(PIXELS)
                    assert len(pixels) == vlm_kit.SIZE * vlm_kit.SIZE * 4
                    assert "prompt=a+cat" in browser.js(
                        "document.getElementById('prompt-map').dataset.request"
                    )
                    browser.js(  # another colour map: the prompt's map drawn again with it
                        """(() => { const e = document.getElementById('colormap');
                        e.value = 'gray'; e.dispatchEvent(new Event('change')); })()"""
                    )
                    browser.js(UNTIL % "document.getElementById('prompt-map').dataset.shown")
                    request = browser.js("document.getElementById('prompt-map').dataset.request")
                    assert "colormap=gray" in request and "prompt=a+cat" in request
                else:
                    browser.js(UNTIL % "document.querySelectorAll('#answer .word').length")
                    words = browser.js("document.querySelectorAll('#answer .word').length")
                    assert words >= 1
                    browser.js("document.querySelectorAll('#answer .word')[0].click()")
                    browser.js(UNTIL % "document.getElementById('prompt-map').dataset.shown")
                    src = browser.js("document.getElementById('prompt-map').dataset.request")
                    assert src.startswith("api/token-map?") and "word=0" in src
                    coloured = browser.js(
                        "[...document.querySelectorAll('#answer-context .t')]"
                        ".filter((t) => t.style.background).length"
                    )
                    assert coloured >= 1
                assert browser.js("document.getElementById('prompt-message').textContent") == ""
                assert browser.problems() == []
            finally:
                browser.close()
