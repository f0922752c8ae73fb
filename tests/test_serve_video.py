"""camkit serve with a video model: the gallery lists videos, each explained over its whole length
window by window (clips of the model's length side by side, the last ending on the last frame);
``/api/map`` gives the ``(N, H, W)`` map of every frame (``.npy``; a frame two windows hold gets
their mean) and one frame's overlay (``frame=t``) on the video's one colour scale,
``/api/frames`` the per-frame importance and the windows; each checked against the library on a
tiny 3-D CNN and MP4s of 16, 10 and 2 frames written with cv2.VideoWriter."""

from __future__ import annotations

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
    """A tiny 3-D CNN (clips of 4 frames of 16x16) over a folder of three videos and a photo."""
    folder = tmp_path / "videos"
    folder.mkdir()
    assert write_cv2(folder / "clip.mp4", "mp4v", frames())  # 16 frames: 4 windows
    assert write_cv2(folder / "odd.mp4", "mp4v", frames(10))  # windows 0-3, 4-7, 6-9
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


WINDOWS = {0: [(0, 4), (4, 8), (8, 12), (12, 16)], 1: [(0, 4), (4, 8), (6, 10)], 2: [(0, 4)]}


def windows_by_hand(explorer: Explorer, image: int) -> tuple[np.ndarray, torch.Tensor]:
    """Every frame as camkit decodes it, and the windows' inputs (n, 3, 4, H, W), the last
    frame repeated past the end."""
    decoded = np.stack(list(video.iter_frames(explorer.entries[image].path)))
    clips_ = [decoded[np.minimum(np.arange(a, b), len(decoded) - 1)] for a, b in WINDOWS[image]]
    x = [torch.stack([explorer.preprocess(frame) for frame in clip], dim=1) for clip in clips_]
    return decoded, torch.stack(x)


def test_the_gallery_lists_videos_predicted_over_all_their_windows(served) -> None:
    client, explorer = served
    info = client.get("/api/info").json()
    assert info["clip_length"] == 4
    page = client.get("/api/gallery").json()
    assert [item["name"] for item in page["items"]] == ["clip.mp4", "odd.mp4", "short.mp4"]
    model = explorer.checkpoints["a"].model
    for item in page["items"]:
        _, x = windows_by_hand(explorer, item["id"])
        probabilities = model(x).softmax(-1).mean(dim=0)  # the mean of the windows' softmax
        assert item["top"][0]["index"] == int(probabilities.argmax())
        assert item["top"][0]["probability"] == pytest.approx(probabilities.max().item(), abs=1e-6)
    assert [len(explorer.photo(i)) for i in range(3)] == [16, 10, 2]  # every frame, held
    assert explorer.model_input(2).shape == (1, 3, 4, 16, 16)  # one window, the last repeated
    assert client.get("/api/thumb/0").headers["content-type"] == "image/jpeg"
    assert client.get("/api/image/0").json()["size"] == [32, 32]


def map_by_hand(explorer: Explorer, image: int, target: int) -> np.ndarray:
    """The library's Grad-CAM of each window, laid out over the video's frames: a frame's map
    is the mean of the windows that hold it; the repeated frames past the end dropped."""
    decoded, x = windows_by_hand(explorer, image)
    heat = camkit.GradCAM(explorer.checkpoints["a"].model, "0")(x, target=target).numpy()
    frames_ = [[] for _ in decoded]
    for (start, _), window in zip(WINDOWS[image], heat, strict=True):
        for t, frame_map in enumerate(window):
            if start + t < len(decoded):
                frames_[start + t].append(frame_map)
    return np.stack([np.mean(held, axis=0) for held in frames_])


@pytest.mark.parametrize("image", [0, 1, 2])
def test_each_frame_of_the_whole_video_s_map_is_the_librarys(served, image: int) -> None:
    client, explorer = served
    count = [16, 10, 2][image]
    for target in (0, 1):
        query = {"image": image, "class": target, "method": "gradcam", "layer": "0"}
        heat = map_by_hand(explorer, image, target)  # (N, H, W)
        raw = npy(client.get("/api/map", params=query | {"format": "npy"}))
        assert raw.shape == (count, 16, 16) and np.abs(raw - heat).max() < 1e-5
        decoded, _ = windows_by_hand(explorer, image)
        views = np.stack([explorer.preprocess.resize_crop(frame) for frame in decoded])
        drawn = overlay_frames(views, heat, 0.6, "inferno")  # one scale for the whole video
        for k in sorted({0, count // 2, 6, count - 1} & set(range(count))):
            shown = {"frame": k, "alpha": 0.6, "colormap": "inferno"}
            picture = png(client.get("/api/map", params=query | shown))
            assert np.abs(picture.astype(int) - drawn[k]).max() <= 1, k
        found = client.get("/api/frames", params=query).json()
        expected = metrics.frame_importance(torch.from_numpy(heat)[None])[0]
        assert found["frames"] == count and found["fps"] == pytest.approx(8.0)
        assert found["windows"] == [list(w) for w in WINDOWS[image]]
        assert found["importance"] == pytest.approx(expected.tolist(), abs=1e-6)
        masses = heat.sum(axis=(1, 2))
        assert found["importance"] == pytest.approx((masses / masses.sum()).tolist(), abs=1e-5)
    late = client.get("/api/map", params={"image": image, "class": 0, "frame": count})
    assert late.status_code == 422 and f"frames 0..{count - 1}" in late.text
    concepts = client.get("/api/concepts", params={"image": image, "class": 0, "layer": "0"})
    assert concepts.status_code == 422 and "ConceptAttribution" in concepts.text


def test_a_video_the_explorer_cannot_hold_is_refused_with_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "long.mp4"
    assert write_cv2(path, "mp4v", frames(clips.MAX_FRAMES + 1, size=8))
    with pytest.raises(video.VideoReadError, match=r"more than 600 frames.*camkit explain"):
        clips.read(path, 4, None)


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
    """The page plays a whole video's overlay: the timeline has a bar per frame, as high as the
    frame's share, and a tick per window; clicking frame 9 (the third window) shows frame 9's
    map, the server's (and the library's)."""
    explorer = video_explorer(tmp_path)
    with running(create_app(explorer, token=None)) as base:
        browser = Browser(tmp_path / "profile")
        try:
            open_explorer(browser, f"{base}/")
            assert browser.js("document.querySelectorAll('#gallery .card').length") == 3
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
            assert len(heights) == 16 and int(np.argmax(heights)) == int(np.argmax(masses))
            ticks = browser.js(
                "[...document.querySelectorAll('#timeline line.window')]"
                ".map((l) => l.querySelector('title').textContent)"
            )
            assert ticks == [f"window {i}: frames {4 * i}..{4 * i + 3}" for i in range(4)]
            assert np.allclose(np.array(heights) / max(heights), masses / masses.max(), atol=0.02)
            assert browser.js("$('clip-frame').dataset.frame") == "0"
            browser.js("document.querySelectorAll('#timeline rect.frame')[9].dispatchEvent("
                       "new MouseEvent('click'))")  # fmt: skip
            assert browser.js("$('clip-frame').dataset.frame") == "9"
            label = browser.js("$('clip-label').textContent")
            assert "frame 9 of 0..15" in label and "window 2 of 4" in label
            pixels = np.array(browser.js(FRAME_PIXELS), np.int64).reshape(16, 16, 4)[..., :3]
            clip = explorer.photo(0)
            views = np.stack([explorer.preprocess.resize_crop(frame) for frame in clip])
            drawn = overlay_frames(views, np.abs(heat), 0.5, "jet")
            assert np.abs(pixels - drawn[9]).max() <= 1
            assert np.abs(heat - map_by_hand(explorer, 0, target)).max() < 1e-5
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
        assert info["clip_length"] == 4 and info["images"] == 3
        query = f"image=0&class=1&method=gradcam&layer=0&token={token}"
        with urllib.request.urlopen(f"{base}api/frames?{query}") as reply:
            assert len(json.load(reply)["importance"]) == 16
