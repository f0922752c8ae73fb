"""Video files in and out (camkit.io.video) and the animated overlay (camkit.viz.video):
test videos are written here with cv2.VideoWriter and Pillow, 16 frames of 32x32."""

from __future__ import annotations

import base64
import weakref
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from camkit.errors import ArgumentError
from camkit.io import video
from camkit.viz.video import animate, importance_plot, overlay_frames


def frames(count: int = 16, size: int = 32) -> np.ndarray:
    """Frame t: gray level 15 t, with a white 8x8 square moving right one pixel a frame."""
    clip = np.zeros((count, size, size, 3), np.uint8)
    for t in range(count):
        clip[t] = 15 * t % 240
        clip[t, 8:16, t : t + 8] = 255
    return clip


def write_cv2(path: Path, codec: str, clip: np.ndarray, fps: float = 8.0) -> bool:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*codec), fps, clip.shape[2:0:-1])
    if not writer.isOpened():
        return False
    for frame in clip:
        writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
    writer.release()
    return path.stat().st_size > 0


@pytest.mark.parametrize(
    ("suffix", "codec"), [(".mp4", "mp4v"), (".avi", "MJPG"), (".webm", "VP80")]
)
def test_videos_are_decoded_frame_by_frame_in_rgb(tmp_path: Path, suffix: str, codec: str) -> None:
    path = tmp_path / f"clip{suffix}"
    if not write_cv2(path, codec, frames()):
        pytest.skip(f"this OpenCV cannot write {codec} into {suffix}")
    read = video.read_video(path)
    assert read.frames.shape == (16, 32, 32, 3) and read.frames.dtype == np.uint8
    assert read.fps == pytest.approx(8.0)
    assert video.is_video(path)
    # lossy codecs: the moving square is where it was written, in RGB order (not BGR)
    square = read.frames[:, 8:16].astype(int)
    for t in (0, 5, 8):
        assert square[t, :, t + 1 : t + 7].mean() > 200
        assert abs(read.frames[t, 24:, 24:].astype(int).mean() - 15 * t) < 12


def test_an_animated_gif_is_a_video_and_a_still_one_is_not(tmp_path: Path) -> None:
    clip = frames(6)
    animated, still = tmp_path / "a.gif", tmp_path / "still.gif"
    images = [Image.fromarray(f) for f in clip]
    images[0].save(animated, save_all=True, append_images=images[1:], duration=100, loop=0)
    images[0].save(still)
    read = video.read_video(animated)
    assert read.frames.shape == (6, 32, 32, 3) and read.fps == pytest.approx(10.0)
    np.testing.assert_array_equal(read.frames[3, 8:16, 3:11], 255)
    assert video.is_video(animated) and not video.is_video(still)


def test_broken_and_missing_videos_raise_a_read_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"\x00not a video" * 50)
    with pytest.raises(video.VideoReadError, match="no frame could be decoded"):
        video.read_video(broken)
    with pytest.raises(video.VideoReadError, match="no such file"):
        video.read_video(tmp_path / "missing.mp4")
    path = tmp_path / "long.avi"
    assert write_cv2(path, "MJPG", frames())
    with pytest.raises(video.VideoReadError, match="more than 10 frames"):
        video.read_video(path, max_frames=10)


def test_clip_windows_slide_by_the_stride_and_end_on_the_last_frame() -> None:
    assert video.clip_windows(16, 8) == [(0, 8), (8, 16)]
    assert video.clip_windows(16, 8, 4) == [(0, 8), (4, 12), (8, 16)]
    assert video.clip_windows(20, 8, 5) == [(0, 8), (5, 13), (10, 18), (12, 20)]
    assert video.clip_windows(5, 8) == [(0, 8)]  # shorter: one clip, last frame repeated
    np.testing.assert_array_equal(video.clip_frames(np.arange(5), (0, 8)), [0, 1, 2, 3, 4, 4, 4, 4])
    with pytest.raises(ArgumentError, match="stride"):
        video.clip_windows(16, 8, 0)


def test_animations_round_trip_with_one_frame_per_input_frame(tmp_path: Path) -> None:
    clip = frames()
    heat = np.zeros((16, 4, 4), np.float32)
    heat[5:9] = 1.0  # only frames 5-8 are hot
    drawn = overlay_frames(clip, heat, alpha=0.5, colormap="jet")
    assert drawn.shape == clip.shape
    # a cold frame is blended with jet's blue, a hot one with its red
    assert drawn[0, 0, 0, 2] > drawn[0, 0, 0, 0] and drawn[6, 0, 0, 0] > drawn[6, 0, 0, 2]
    video.save_mp4(tmp_path / "o.mp4", drawn, 8.0)
    video.save_gif(tmp_path / "o.gif", drawn, 8.0)
    mp4, gif = video.read_video(tmp_path / "o.mp4"), video.read_video(tmp_path / "o.gif")
    assert len(mp4) == len(gif) == 16 and mp4.fps == pytest.approx(8.0)
    assert np.abs(gif.frames.astype(int) - drawn).mean() < 8
    png = importance_plot(np.r_[np.zeros(5), np.full(4, 0.25), np.zeros(7)], 8.0, title="t")
    assert png.startswith(b"\x89PNG")
    with pytest.raises(ValueError, match="one heat map per frame"):
        overlay_frames(clip, heat[:4])


def test_a_notebook_plays_the_animation_camkit_writes(tmp_path: Path) -> None:
    """``animate`` -> an object a notebook shows as the inline GIF that ``save`` writes, one
    frame per input frame; a file that is neither MP4 nor GIF is refused."""
    clip = frames()
    heat = np.zeros((16, 4, 4), np.float32)
    heat[5:9] = 1.0
    animation = animate(clip, heat, 8.0)
    assert np.array_equal(animation.frames, overlay_frames(clip, heat))
    html = animation._repr_html_()
    prefix = '<img src="data:image/gif;base64,'
    assert html.startswith(prefix)
    shown = base64.b64decode(html[len(prefix) : html.index('"', len(prefix))])
    saved = animation.save(tmp_path / "a.gif").read_bytes()
    assert shown == saved and shown.startswith(b"GIF89a")
    assert len(video.read_video(animation.save(tmp_path / "a.mp4"))) == 16
    with pytest.raises(ArgumentError, match=r"\.mp4 or \.gif"):
        animation.save(tmp_path / "a.avi")


def test_streamed_clips_are_the_windows_of_the_whole_video() -> None:
    for count in (1, 5, 8, 9, 16, 20, 23):
        clip = frames(count, 4)
        for length, stride in ((8, None), (8, 4), (8, 5), (4, 3), (3, 7)):
            windows = video.clip_windows(count, length, stride)
            streamed = list(video.stream_clips(iter(clip), windows))
            assert [w for w, _ in streamed] == windows
            for window, got in streamed:
                np.testing.assert_array_equal(got, video.clip_frames(clip, window))


def test_frames_are_decoded_lazily(tmp_path: Path) -> None:
    path = tmp_path / "clip.avi"
    assert write_cv2(path, "MJPG", frames())
    stream = video.iter_frames(path)
    first = next(stream)
    assert first.shape == (32, 32, 3)
    assert sum(1 for _ in stream) == 15
    assert video.frame_rate(path) == pytest.approx(8.0)


def test_streaming_reads_no_further_than_the_clip_it_gives() -> None:
    pulled = []

    def source():
        for t in range(40):
            pulled.append(t)
            yield np.full((2, 2, 3), t, np.uint8)

    windows = video.clip_windows(40, 8, 4)
    for (start, stop), clip in video.stream_clips(source(), windows):
        assert len(pulled) == stop  # a long video is never read ahead of the clip in use
        assert clip[0, 0, 0, 0] == start


@pytest.mark.parametrize(("suffix", "codec"), [(".avi", "MJPG"), (".gif", None)])
def test_frames_from_a_start_and_counted(tmp_path: Path, suffix: str, codec: str | None) -> None:
    path = tmp_path / f"clip{suffix}"
    clip = frames()
    if codec is None:
        video.save_gif(path, clip, 8.0)
    else:
        assert write_cv2(path, codec, clip)
    whole = video.read_video(path).frames
    assert video.count_frames(path) == 16
    later = np.stack(list(video.iter_frames(path, start=5)))
    np.testing.assert_array_equal(later, whole[5:])
    assert not list(video.iter_frames(path, start=16))
    with pytest.raises(video.VideoReadError, match="more than 10 frames"):
        video.count_frames(path, max_frames=10)


def test_windows_of_a_span_cut_from_a_stream_that_starts_there() -> None:
    """Some windows (those a resumed run still needs), from a stream that starts at the first:
    the same clips, and the frames between two windows are not kept."""
    clip = frames(40, 4)
    windows = video.clip_windows(40, 8, 4)
    some = [windows[2], windows[3], windows[7]]  # (8, 16), (12, 20), (28, 36)
    alive: dict[int, weakref.ref] = {}

    def source():
        for t in range(some[0][0], 40):
            frame = clip[t].copy()
            alive[t] = weakref.ref(frame)
            yield frame

    for window, got in video.stream_clips(source(), some, start=some[0][0]):
        np.testing.assert_array_equal(got, video.clip_frames(clip, window))
        if window == some[-1]:
            assert not [t for t in range(20, 28) if alive[t]() is not None]
    assert max(alive) == 35  # read no further than the last window
