"""``camkit explain`` on video files: clips of the model's length, sliding windows, the animated
overlays and the per-frame plot, the manifest's frames and windows, a broken video reported
while the run goes on. Test videos are written with cv2.VideoWriter (16 frames of 32x32)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_video_io import frames, write_cv2

from camkit import cli, models
from camkit.io import video
from camkit.runs import manifest


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("videos") / "clip.mp4"
    assert write_cv2(path, "mp4v", frames())
    return path


def test_a_video_model_takes_clips_of_its_clip_length() -> None:
    loaded = models.load("torchvision:r3d_18", clip_length=4, num_classes=3)
    assert loaded.input_size == (4, 112, 112) and loaded.clip_length == 4
    assert loaded.default_layer == "layer4"
    with pytest.raises(ValueError, match="takes images, not clips"):
        models.load("torchvision:resnet18", clip_length=4, num_classes=3)


def test_explain_a_video_writes_animations_plot_and_windows(
    clip: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"\x00not a video" * 50)
    out = tmp_path / "out"
    status = cli.main(
        ["explain", str(clip), str(broken), "--model", "torchvision:r3d_18",
         "--clip-length", "8", "--clip-stride", "4", "--out", str(out), "--quiet"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert status == 1  # the broken video is reported, the other one written
    assert "cannot read" in err and "broken.mp4" in err
    records = json.loads((out / "manifest.json").read_text())["records"]
    failed = [r for r in records if "error" in r]
    assert [r["image"] for r in failed] == [str(broken)]
    (record,) = [r for r in records if "error" not in r]
    assert record["frames"] == 16 and record["fps"] == pytest.approx(8.0)
    assert record["windows"] == [[0, 8], [4, 12], [8, 16]] and record["clip_length"] == 8
    importance = np.array(record["frame_importance"])
    assert importance.shape == (16,) and importance.sum() == pytest.approx(1.0, abs=1e-4)
    mp4, gif = video.read_video(out / record["output"]), video.read_video(out / record["animation"])
    assert mp4.frames.shape == gif.frames.shape == (16, 32, 32, 3)
    assert (out / record["frame_plot"]).read_bytes().startswith(b"\x89PNG")
    # --resume: both are done (the broken one recorded as unreadable, as images are)
    again = cli.main(
        ["explain", str(clip), str(broken), "--model", "torchvision:r3d_18", "--clip-length",
         "8", "--clip-stride", "4", "--out", str(out), "--quiet", "--resume"]
    )  # fmt: skip
    assert again == 1
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["runs"][-1]["todo"] == 0 and len(manifest["records"]) == 2


def test_videos_need_a_video_model_and_a_run_of_their_own(
    clip: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert cli.main(["explain", str(clip), "--out", str(tmp_path / "a")]) == 2
    assert "takes images, not clips" in capsys.readouterr().err


def _tiny_loaded() -> models.LoadedModel:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv3d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool3d(1), nn.Flatten(),
        nn.Linear(4, 2),
    ).eval()  # fmt: skip
    return models.LoadedModel(
        name="tiny", model=model, preprocess=models.Preprocess(16, crop_mode="squash"),
        labels=["a", "b"], default_layer="0", input_size=(4, 16, 16),
    )  # fmt: skip


def _peak_bytes(tmp_path: Path, count: int) -> int:
    """Peak of the Python/numpy allocations while explaining a video of ``count`` frames."""
    import tracemalloc

    import torch

    from camkit.cli.pipeline import Job
    from camkit.cli.ranks import Ranks
    from camkit.cli.video import explain_videos

    path = tmp_path / f"long{count}.avi"
    assert write_cv2(path, "MJPG", np.tile(frames(16, 24), (count // 16, 1, 1, 1)))
    job = Job(methods=("gradcam",), layer="0", classes=None, out=tmp_path / f"o{count}",
              device=torch.device("cpu"), quiet=True)  # fmt: skip
    tracemalloc.start()
    try:
        explain_videos(_tiny_loaded(), [path], [0], job, Ranks(), {"settings": {}})
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_long_video_streams_with_flat_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Frames are decoded, drawn and written as they come (no GIF: it holds every frame, here
    from 0 frames on): four times the frames, about the same peak (a video held whole, or a
    plot artist per frame, grows with the frames: measured 3.3x for 5x frames before the plot
    became one artist)."""
    monkeypatch.setattr("camkit.cli.video.GIF_MAX_FRAMES", 0)
    short, long = _peak_bytes(tmp_path, 256), _peak_bytes(tmp_path, 1024)
    assert long < 1.3 * short
    (record,) = manifest.read(tmp_path / "o1024" / "manifest.rank0.jsonl")["records"]
    assert record["frames"] == 1024 and record["animation"] is None
