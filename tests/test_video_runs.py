"""``camkit explain`` on videos as a run: windows decoded in DataLoader workers, a run stopped
after N windows resumed to the result of an uninterrupted one, two torchrun ranks sharing the
windows, and a broken video reported while the run goes on in each of these. Test videos are
written with cv2.VideoWriter (MJPG in AVI: the frames decode the same in every process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_video_io import frames, write_cv2
from torch import nn
from torch.utils.data import DataLoader

from camkit import models
from camkit.cli.commands.explain import explain
from camkit.cli.pipeline import Job
from camkit.cli.ranks import span
from camkit.cli.video_windows import VideoWindows, WindowStore, collate_windows
from camkit.io import video
from camkit.runs import manifest

CLIP, STRIDE = 4, 3


def tiny_loaded() -> models.LoadedModel:
    """A clip model with fixed weights: class 0 sums the channels' ReLU, class 1 their
    negation (so both classes have non-empty maps)."""
    conv = nn.Conv3d(3, 2, 3, padding=1)
    with torch.no_grad():
        conv.weight.fill_(0.02)
        conv.weight[1].mul_(-1.0)
        conv.bias.zero_()
    head = nn.Linear(2, 2)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[1.0, -1.0], [-1.0, 1.0]]))
        head.bias.zero_()
    model = nn.Sequential(conv, nn.ReLU(), nn.AdaptiveAvgPool3d(1), nn.Flatten(), head).eval()
    return models.LoadedModel(
        name="tiny", model=model, preprocess=models.Preprocess(16, crop_mode="squash"),
        labels=["a", "b"], default_layer="1", input_size=(CLIP, 16, 16),
    )  # fmt: skip


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two readable videos (20 and 11 frames: 7 and 4 windows) and a broken one."""
    folder = tmp_path_factory.mktemp("videos")
    first, second = folder / "a.avi", folder / "c.avi"
    assert write_cv2(first, "MJPG", frames(20, 24))
    assert write_cv2(second, "MJPG", frames(11, 24)[::-1].copy())
    broken = folder / "b.avi"
    broken.write_bytes(b"\x00not a video" * 50)
    return [first, broken, second]


def job(out: Path, **changes: object) -> Job:
    fields = {"methods": ("gradcam", "layercam"), "layer": "1", "classes": (0, 1), "out": out,
              "device": torch.device("cpu"), "images_per_batch": 1, "quiet": True}  # fmt: skip
    return Job(**(fields | changes))


def run(loaded: models.LoadedModel, paths: list[Path], the_job: Job, **kw: object) -> dict:
    return explain(loaded, paths, the_job, clip_stride=STRIDE, **kw)


def same_results(one: dict, two: dict, out_one: Path, out_two: Path) -> None:
    """The same records (floats within float32 noise) and the same animations."""
    assert [r["image"] for r in one["records"]] == [r["image"] for r in two["records"]]
    for a, b in zip(one["records"], two["records"], strict=True):
        if "error" in a:
            assert "error" in b and "windows" not in b
            continue
        exact = ("output", "animation", "method", "target", "frames", "windows", "size")
        assert {k: a[k] for k in exact} == {k: b[k] for k in exact}
        np.testing.assert_allclose(a["frame_importance"], b["frame_importance"], atol=1e-4)
        assert a["probability"] == pytest.approx(b["probability"], abs=1e-5)
        gif_one = video.read_video(out_one / a["animation"]).frames.astype(int)
        gif_two = video.read_video(out_two / b["animation"]).frames.astype(int)
        assert np.abs(gif_one - gif_two).mean() < 1.0  # a palette may differ by a level


def test_spans_split_items_in_order_into_near_equal_runs() -> None:
    for count in range(12):
        items = list(range(count))
        for parts in range(1, 6):
            spans = [span(items, parts, index) for index in range(parts)]
            assert [item for part in spans for item in part] == items
            assert max(map(len, spans)) - min(map(len, spans)) <= 1


def test_the_windows_of_videos_are_shared_by_the_workers_each_video_decoded_once(
    videos: list[Path],
) -> None:
    first, broken, second = map(str, videos)
    windows = video.clip_windows(20, CLIP, STRIDE)
    items = [(0, first, w) for w in windows] + [(1, broken, (0, CLIP))]
    items += [(2, second, w) for w in video.clip_windows(11, CLIP, STRIDE)]
    dataset = VideoWindows(items, tiny_loaded().preprocess)
    loader = DataLoader(dataset, batch_size=2, num_workers=2, collate_fn=collate_windows)
    seen, failures = [], []
    for batch in loader:
        seen += list(zip(batch.videos, batch.windows, strict=True))
        failures += batch.failures
        assert batch.inputs is None or batch.inputs.shape[1:] == (3, CLIP, 16, 16)
    assert sorted(seen) == sorted((i, w) for i, p, w in items if p != broken)
    assert [index for index, _ in failures] == [1]
    # a clip equals the one cut from the whole video
    one = VideoWindows(items[2:3], dataset.preprocess)
    (clip,) = DataLoader(one, batch_size=1, collate_fn=collate_windows)
    whole = video.read_video(first).frames
    expected = dataset.preprocess.clip(video.clip_frames(whole, windows[2]))
    assert clip.windows == [windows[2]]
    torch.testing.assert_close(clip.inputs[0], expected)


def test_workers_give_the_result_of_the_main_process_and_report_the_broken_video(
    videos: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    loaded = tiny_loaded()
    alone = run(loaded, videos, job(tmp_path / "alone", workers=0))
    pooled = run(loaded, videos, job(tmp_path / "pooled", workers=2, images_per_batch=2))
    assert capsys.readouterr().err.count("cannot read") == 2  # once per run
    same_results(alone, pooled, tmp_path / "alone", tmp_path / "pooled")
    assert alone["unreadable"] == 1 and alone["explained"] == 2
    assert len(alone["records"]) == 9 and "windows" not in alone  # 2 videos x 2 methods x 2
    assert not list((tmp_path / "pooled").rglob("*.npy"))  # the window files are removed
    (rank,) = pooled["throughput"]["ranks"]
    assert rank["windows"] == 2 * (7 + 4)  # predict and maps, each window once


class Stopped(BaseException):
    """The run is stopped here (as a kill would: nothing after it runs)."""


@pytest.mark.parametrize("stop_after", [4, 15])  # in the predict stage, in the maps stage
def test_a_run_stopped_after_n_windows_resumes_to_the_uninterrupted_result(
    videos: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop_after: int
) -> None:
    loaded = tiny_loaded()
    whole = run(loaded, videos, job(tmp_path / "whole"))
    out = tmp_path / "stopped"
    saved: list[tuple[str, str, tuple[int, int]]] = []
    resuming = False
    original = WindowStore.save

    def save(store: WindowStore, stage: str, window: tuple[int, int], array: np.ndarray) -> None:
        if len(saved) == stop_after and not resuming:
            raise Stopped
        original(store, stage, window, array)
        saved.append((store.folder.name, stage, window))

    monkeypatch.setattr(WindowStore, "save", save)
    with pytest.raises(Stopped):
        run(loaded, videos, job(out))
    part = manifest.read(out / "manifest.rank0.jsonl")
    assert len(part["windows"]) == stop_after and not part["records"]
    before, resuming = list(saved), True
    resumed = run(loaded, videos, job(out), resume=True)
    redone = saved[len(before) :]
    assert len(redone) == 2 * (7 + 4) - stop_after  # only the windows not finished
    assert not set(redone) & set(before)
    same_results(whole, resumed, tmp_path / "whole", out)
    assert resumed["unreadable"] == 1 and "windows" not in resumed
    assert not list(out.glob("manifest.rank*.jsonl"))


def test_a_video_that_breaks_mid_way_is_reported_and_the_run_goes_on(
    videos: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Counted, then undecodable past frame 9 (a corrupt tail), read by two workers: one error
    record for it, the other video explained as in a run without it."""
    first, _, second = videos
    decode = video.iter_frames

    def corrupt_tail(path, *, start=0, **kw):
        for index, frame in enumerate(decode(path, start=start, **kw), start):
            if Path(path) == first and index >= 9:
                raise video.VideoReadError("corrupt frame 9")
            yield frame

    loaded = tiny_loaded()
    clean = run(loaded, [second], job(tmp_path / "clean"))
    monkeypatch.setattr(video, "iter_frames", corrupt_tail)
    broken = run(loaded, [first, second], job(tmp_path / "out", workers=2))
    assert capsys.readouterr().err.count("corrupt frame 9") == 1
    error, *records = broken["records"]
    assert error == {"image": str(first), "error": "corrupt frame 9", "rank": 0}
    same_results(clean, {"records": records}, tmp_path / "clean", tmp_path / "out")
    assert not list((tmp_path / "out").glob("a_*"))  # nothing written for the broken video


@pytest.mark.slow
def test_two_torchrun_ranks_share_the_windows_as_one_process(
    videos: list[Path], tmp_path: Path
) -> None:
    torch.manual_seed(0)
    weights = tmp_path / "r3d.pt"
    torch.save(__import__("torchvision").models.video.r3d_18(num_classes=3).state_dict(), weights)
    common = [*map(str, videos), "--model", "torchvision:r3d_18", "--weights", str(weights),
              "--clip-length", str(CLIP), "--clip-stride", str(STRIDE), "--target", "0",
              "--method", "gradcam", "--workers", "1", "--quiet", "--report"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node"]
    outputs = {}
    for name, launcher in (("one", [sys.executable]), ("two", [*torchrun, "2"])):
        out = tmp_path / name
        command = [*launcher, "-m", "camkit", "explain", *common, "--out", str(out)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 1, done.stderr  # the broken video
        assert "cannot read" in done.stderr and "b.avi" in done.stderr
        # exit status 1 is also Python's for a crash (torchrun prints its own traceback)
        assert name == "two" or "Traceback" not in done.stderr
        outputs[name] = json.loads((out / "manifest.json").read_text())
    one, two = outputs["one"], outputs["two"]
    same_results(one, two, tmp_path / "one", tmp_path / "two")
    ranks = two["throughput"]["ranks"]
    assert sorted(rank["rank"] for rank in ranks) == [0, 1]
    assert all(rank["windows"] > 0 for rank in ranks)  # both explained windows
    assert sum(rank["windows"] for rank in ranks) == 2 * (7 + 4)
    assert {r["rank"] for r in two["records"]} == {0, 1}  # the videos drawn by both
    assert not list((tmp_path / "two").glob("manifest.rank*.jsonl"))
    assert (tmp_path / "two" / "index.html").is_file()


def test_windows_of_a_resumed_run_must_still_be_on_disk(videos: list[Path], tmp_path) -> None:
    """A window recorded but whose file is gone is explained again (not read as missing)."""
    loaded = tiny_loaded()
    out = tmp_path / "out"
    first = [videos[0]]
    with pytest.MonkeyPatch.context() as patch:
        calls = []
        original = WindowStore.save

        def save(store, stage, window, array):
            if len(calls) == 9:  # all 7 predict windows and 2 maps windows
                raise Stopped
            original(store, stage, window, array)
            calls.append(window)

        patch.setattr(WindowStore, "save", save)
        with pytest.raises(Stopped):
            run(loaded, first, job(out))
    store = WindowStore(out, "a")
    store.path("predict", (0, CLIP)).unlink()
    resumed = run(loaded, first, job(out), resume=True)
    whole = run(loaded, first, job(tmp_path / "whole"))
    same_results(whole, resumed, tmp_path / "whole", out)


def test_a_video_that_breaks_while_drawn_leaves_no_file_and_an_error_record(
    videos: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Decoded well for its windows (predict, maps), then not when drawn (the third decoding):
    no MP4, GIF or plot of it, one error record; the window files are gone."""
    first = videos[0]
    decode, calls = video.iter_frames, []

    def fails_third_time(path, *, start=0, **kw):
        calls.append(path)
        for index, frame in enumerate(decode(path, start=start, **kw), start):
            if len(calls) == 3 and index == 5:
                raise video.VideoReadError("corrupt frame 5")
            yield frame

    monkeypatch.setattr(video, "iter_frames", fails_third_time)
    out = tmp_path / "out"
    done = run(tiny_loaded(), [first], job(out, workers=0))
    assert len(calls) == 3 and capsys.readouterr().err.count("corrupt frame 5") == 1
    assert done["records"] == [{"image": str(first), "error": "corrupt frame 5", "rank": 0}]
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json"]
