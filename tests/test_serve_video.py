"""camkit serve with a video model: the gallery lists videos, each explained on its first clip;
``/api/map`` gives the ``(T, H, W)`` map (``.npy``) and one frame's overlay (``frame=t``) on the
clip's one colour scale, ``/api/frames`` the per-frame importance; each checked against the
library on a tiny 3-D CNN and 16-frame MP4s written with cv2.VideoWriter."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("starlette", reason="camkit serve's web stack: pip install 'camkit[serve]'")
pytest.importorskip("httpx", reason="the ASGI test client needs httpx (the dev extra)")

from starlette.testclient import TestClient  # noqa: E402

import camkit  # noqa: E402
from camkit import io as cio  # noqa: E402
from camkit import metrics  # noqa: E402
from camkit.io import video  # noqa: E402
from camkit.serve import clips  # noqa: E402
from camkit.serve.app import create_app, running  # noqa: E402
from camkit.serve.explorer import Explorer, MapKey  # noqa: E402
from camkit.serve.gallery import scan  # noqa: E402
from camkit.viz.video import overlay_frames  # noqa: E402
from tests.test_report import Browser, needs_browser  # noqa: E402
from tests.test_serve import MAP_PIXELS, npy, open_explorer, png, settle  # noqa: E402
from tests.test_video_cli import _tiny_loaded  # noqa: E402
from tests.test_video_io import frames, write_cv2  # noqa: E402


def video_explorer(tmp_path: Path) -> Explorer:
    """A tiny 3-D CNN (clips of 4 frames of 16x16) over a folder of two videos and a photo."""
    folder = tmp_path / "videos"
    folder.mkdir()
    assert write_cv2(folder / "clip.mp4", "mp4v", frames())
    assert write_cv2(folder / "short.mp4", "mp4v", frames(2))  # shorter than a clip
    cio.save_png(folder / "photo.png", frames(1)[0])  # an image: not a video model's input
    loaded = _tiny_loaded()  # clips of 4 frames of 16x16
    entries, _ = scan([folder], clips.suffixes(loaded.clip_length))
    return Explorer({"a": loaded}, entries)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[TestClient, Explorer]]:
    explorer = video_explorer(tmp_path)
    with TestClient(create_app(explorer, token=None)) as client:
        yield client, explorer


def first_clip(path: Path, length: int = 4) -> np.ndarray:
    """The first ``length`` frames as camkit decodes them, the last one repeated."""
    decoded = list(itertools.islice(video.iter_frames(path), length))
    return np.stack(decoded + decoded[-1:] * (length - len(decoded)))


def test_the_gallery_lists_videos_predicted_on_their_first_clip(served) -> None:
    client, explorer = served
    info = client.get("/api/info").json()
    assert info["clip_length"] == 4
    page = client.get("/api/gallery").json()
    assert [item["name"] for item in page["items"]] == ["clip.mp4", "short.mp4"]
    model = explorer.checkpoints["a"].model
    for item in page["items"]:
        clip = first_clip(explorer.entries[item["id"]].path)
        x = torch.stack([explorer.preprocess(frame) for frame in clip], dim=1)  # (3, T, H, W)
        probabilities = model(x[None]).softmax(-1)[0]
        assert item["top"][0]["index"] == int(probabilities.argmax())
        assert item["top"][0]["probability"] == pytest.approx(probabilities.max().item(), abs=1e-6)
    short = explorer.photo(1)
    assert short.shape == (4, 32, 32, 3) and (short[2] == short[1]).all()  # the last repeated
    assert client.get("/api/thumb/0").headers["content-type"] == "image/jpeg"
    assert client.get("/api/image/0").json()["size"] == [32, 32]


def test_each_frame_of_the_map_is_the_librarys(served) -> None:
    client, explorer = served
    model = explorer.checkpoints["a"].model
    clip = first_clip(explorer.entries[0].path)
    x = torch.stack([explorer.preprocess(frame) for frame in clip], dim=1)[None]
    for target in (0, 1):
        query = {"image": 0, "class": target, "method": "gradcam", "layer": "0"}
        heat = camkit.GradCAM(model, "0")(x, target=target)[0].numpy()  # (T, H, W)
        raw = npy(client.get("/api/map", params=query | {"format": "npy"}))
        assert raw.shape == (4, 16, 16) and np.abs(raw - heat).max() < 1e-5
        views = np.stack([explorer.preprocess.resize_crop(frame) for frame in clip])
        drawn = overlay_frames(views, heat, 0.6, "inferno")  # one scale for the whole clip
        for k in range(4):
            shown = {"frame": k, "alpha": 0.6, "colormap": "inferno"}
            picture = png(client.get("/api/map", params=query | shown))
            assert np.abs(picture.astype(int) - drawn[k]).max() <= 1, k
        found = client.get("/api/frames", params=query).json()
        expected = metrics.frame_importance(torch.from_numpy(heat)[None])[0]
        assert found["frames"] == 4 and found["fps"] == pytest.approx(8.0)
        assert found["importance"] == pytest.approx(expected.tolist(), abs=1e-6)
        masses = heat.sum(axis=(1, 2))
        assert found["importance"] == pytest.approx((masses / masses.sum()).tolist(), abs=1e-5)
    late = client.get("/api/map", params={"image": 0, "class": 0, "frame": 4})
    assert late.status_code == 422 and "frames 0..3" in late.text


def test_frames_refuse_an_image_model(tmp_path: Path) -> None:
    from tests.test_serve import loaded, photo_folder

    entries, _ = scan([photo_folder(tmp_path)])
    with TestClient(create_app(Explorer({"a": loaded()}, entries), token=None)) as client:
        answer = client.get("/api/frames", params={"image": 0, "class": 0})
        assert answer.status_code == 422 and "takes images" in answer.text
        assert client.get("/api/info").json()["clip_length"] is None


FRAME_PIXELS = MAP_PIXELS.replace("#maps img.map", "#clip-frame")  # the frame shown, read back


@needs_browser
@pytest.mark.slow
def test_the_clip_view_in_headless_chromium(tmp_path: Path) -> None:
    """The page plays a video's overlay: the timeline has a bar per frame, as high as the
    frame's share; clicking frame 2 shows frame 2's map, the server's (and the library's)."""
    explorer = video_explorer(tmp_path)
    with running(create_app(explorer, token=None)) as base:
        browser = Browser(tmp_path / "profile")
        try:
            open_explorer(browser, f"{base}/")
            assert browser.js("document.querySelectorAll('#gallery .card').length") == 2
            browser.js("document.querySelector('.card[data-id=\"0\"]').click()")
            browser.js("new Promise((done) => setTimeout(done, 100))")
            settle(browser)
            assert browser.js("document.getElementById('clip-view').hidden") is False
            heights = browser.js(
                "[...document.querySelectorAll('#timeline rect.frame')]"
                ".map((r) => +r.getAttribute('height'))"
            )
            method, layer = browser.js("[$('method').value, $('layer').value]")
            target = explorer.predictions["a"][0][0][0]
            heat = explorer.maps.get_item(MapKey("a", method, layer, 0, target))
            masses = np.abs(heat).sum(axis=(1, 2))
            assert len(heights) == 4 and int(np.argmax(heights)) == int(np.argmax(masses))
            assert np.allclose(np.array(heights) / max(heights), masses / masses.max(), atol=0.02)
            assert browser.js("$('clip-frame').dataset.frame") == "0"
            browser.js("document.querySelectorAll('#timeline rect.frame')[2].dispatchEvent("
                       "new MouseEvent('click'))")  # fmt: skip
            assert browser.js("$('clip-frame').dataset.frame") == "2"
            assert "frame 2 of 0..3" in browser.js("$('clip-label').textContent")
            pixels = np.array(browser.js(FRAME_PIXELS), np.int64).reshape(16, 16, 4)[..., :3]
            clip = explorer.photo(0)
            views = np.stack([explorer.preprocess.resize_crop(frame) for frame in clip])
            drawn = overlay_frames(views, np.abs(heat), 0.5, "jet")
            assert np.abs(pixels - drawn[2]).max() <= 1
            browser.js("$('clip-play').click()")
            assert browser.js("$('clip-play').textContent") == "pause"
            browser.js("$('clip-play').click()")
            assert browser.js("$('clip-play').textContent") == "play"
            assert browser.js("document.getElementById('message').hidden") is True
            assert browser.problems() == []
        finally:
            browser.close()


def test_the_notebook_explorer_takes_a_video_model(tmp_path: Path) -> None:
    """``camkit.explore`` is the same app: a video model's gallery lists the videos."""
    import json
    import urllib.request

    explorer = video_explorer(tmp_path)  # writes the folder
    loaded = explorer.checkpoints["a"]
    with camkit.explore(loaded, tmp_path / "videos") as view:
        base, token = view.url.split("?token=")
        with urllib.request.urlopen(f"{base}api/info?token={token}") as reply:
            info = json.load(reply)
        assert info["clip_length"] == 4 and info["images"] == 2
        query = f"image=0&class=1&method=gradcam&layer=0&token={token}"
        with urllib.request.urlopen(f"{base}api/frames?{query}") as reply:
            assert len(json.load(reply)["importance"]) == 4
