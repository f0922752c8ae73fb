"""An image classifier as a video model: run on every frame of a clip, its scores averaged (the
segmental consensus of Wang et al., "Temporal Segment Networks: Towards Good Practices for Deep
Action Recognition", ECCV 2016), declared frame-wise so that CAMs give one map per frame."""

from __future__ import annotations

from torch import Tensor, nn

from camkit.core.wrappers import InputLayout
from camkit.errors import ArgumentError
from camkit.models.load import CLIP_LENGTH, LoadedModel


class FrameConsensus(nn.Module):
    """``(B, T, C, H, W)`` clips -> ``net``'s scores of their ``B * T`` frames (row
    ``b * T + t``), averaged over the frames: ``(B, K)``."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, clip: Tensor) -> Tensor:
        batch, frames = clip.shape[:2]
        return self.net(clip.flatten(0, 1)).unflatten(0, (batch, frames)).mean(dim=1)


def frame_wise(loaded: LoadedModel, clip_length: int = CLIP_LENGTH) -> LoadedModel:
    """``loaded`` (an image model) as a video model over clips of ``clip_length`` frames: its
    module wrapped, unchanged, in :class:`FrameConsensus` and a frame-wise
    :class:`~camkit.InputLayout`; same preprocessing per frame, same labels and layer."""
    if loaded.clip_length is not None:
        raise ArgumentError(f"{loaded.name} takes clips already: frame_wise wraps image models")
    if not isinstance(clip_length, int) or clip_length < 1:
        raise ArgumentError(f"clip_length must be a positive int, got {clip_length!r}")
    return LoadedModel(
        name=f"{loaded.name} per frame",
        model=InputLayout(FrameConsensus(loaded.model), "BTCHW", frame_wise=True),
        preprocess=loaded.preprocess,
        labels=loaded.labels,
        default_layer=f"net.{loaded.default_layer}",
        input_size=(clip_length, *loaded.input_size),
    )


__all__ = ["FrameConsensus", "frame_wise"]
