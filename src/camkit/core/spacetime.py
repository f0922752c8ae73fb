"""What a video model says about its space-time layers, read from the model, never guessed:

* tubelet tokens (VideoMAE, Tong et al., NeurIPS 2022; ViViT, Arnab et al., ICCV 2021; MViT,
  Fan et al., ICCV 2021): the first ``nn.Conv3d``'s output grid, time-major; MViT's ``pool_q``
  pool the later grids;
* TimeSformer (Bertasius et al., ICML 2021): tokens patch by patch, each patch's frames
  together, on a ``(T, H / p, W / p)`` grid;
* frames folded into the batch (TSN, Wang et al., ECCV 2016; TSM, Lin et al., ICCV 2019),
  declared by ``InputLayout(..., frame_wise=True)``: ``B * T`` rows read as ``(B, T, h, w)``;
* X-CLIP (Ni et al., "Expanding Language-Image Pretrained Models for General Video
  Recognition", ECCV 2022): frame-wise by its config's ``vision_config.num_frames``.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from camkit.errors import InputError

_POOLS_3D = (nn.Conv3d, nn.MaxPool3d, nn.AvgPool3d)


@dataclass(frozen=True)
class TokenGrid:
    """A space-time token grid ``(t, h, w)``; ``frames_last``: tokens in ``(h, w, t)`` order;
    ``source``: where the model says so."""

    grid: tuple[int, int, int]
    frames_last: bool
    source: str


def _triple(value: object) -> tuple[int, int, int]:
    return tuple(value) if isinstance(value, tuple | list) else (value,) * 3  # type: ignore[return-value]


def pooled_size(size: tuple[int, ...], module: nn.Module) -> tuple[int, int, int]:
    """The output grid of a 3-D convolution or pooling for an input grid ``size``."""
    kernel, stride = _triple(module.kernel_size), _triple(module.stride)
    padding, dilation = _triple(module.padding), _triple(getattr(module, "dilation", 1))
    return tuple(  # type: ignore[return-value]
        (n + 2 * p - d * (k - 1) - 1) // s + 1
        for n, k, s, p, d in zip(size, kernel, stride, padding, dilation, strict=True)
    )


def _timesformer(model: nn.Module) -> nn.Module | None:
    """The HuggingFace TimeSformer (divided or joint space-time attention) inside ``model``."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if getattr(config, "model_type", None) == "timesformer":
            return module if getattr(config, "attention_type", "") != "space_only" else None
    return None


def token_grids(model: nn.Module | None, size: tuple[int, int, int]) -> list[TokenGrid]:
    """The space-time token grids a video transformer has for a clip ``(T, H, W)``, in the
    order its layers see them; [] when the model declares none."""
    if model is None:
        return []
    timesformer = _timesformer(model)
    if timesformer is not None:
        ph, pw = _triple(timesformer.config.patch_size)[:2]
        grid = (size[0], size[1] // ph, size[2] // pw)
        return [TokenGrid(grid, True, "TimeSformer: patch-major tokens, each patch's frames")]
    named = list(model.named_modules())
    embed = next(((n, m) for n, m in named if isinstance(m, nn.Conv3d)), None)
    if embed is None:
        return []
    grid = pooled_size(size, embed[1])
    found = [TokenGrid(grid, False, f"tubelet embedding {embed[0]} (time-major)")]
    for name, module in named:
        pool = getattr(module, "pool", None)
        if name.endswith("pool_q") and isinstance(pool, _POOLS_3D):
            grid = pooled_size(found[-1].grid, pool)
            if grid != found[-1].grid:
                found.append(TokenGrid(grid, False, f"pooled by {name}"))
    return found


def _xclip_frames(model: nn.Module | None) -> int | None:
    """The clip length of the HuggingFace X-CLIP inside ``model``, or None."""
    for module in () if model is None else model.modules():
        config = getattr(module, "config", None)
        if getattr(config, "model_type", None) == "xclip":
            return int(config.vision_config.num_frames)
    return None


def message_tokens(model: nn.Module | None) -> tuple[int, str] | None:
    """``(count, source)`` of the tokens a frame-wise video transformer appends inside its
    blocks only (X-CLIP's message token: ``layer_norm1`` sees it, the block's output not);
    None for other models."""
    if _xclip_frames(model) is None:
        return None
    return 1, "X-CLIP's message token, inside its cross-frame blocks"


def frame_wise(model: nn.Module | None) -> bool:
    """Whether the model folds a clip's frames into its batch (row ``b * T + t``): declared
    (``frame_wise``) or read from it (X-CLIP)."""
    return bool(getattr(model, "frame_wise", False)) or _xclip_frames(model) is not None


def folded_frames(model: nn.Module | None, input_shape: tuple[int, ...]) -> int | None:
    """``T`` for a frame-wise model given a clip ``(B, C, T, H, W)`` (its layers may have
    ``B * T`` rows), else None; a clip of another length than X-CLIP's raises InputError."""
    if len(input_shape) != 5 or not frame_wise(model):
        return None
    frames, built = input_shape[2], _xclip_frames(model)
    if built is not None and frames != built:
        raise InputError(
            f"this X-CLIP runs clips of {built} frames (its config's vision_config.num_frames: "
            f"the cross-frame attention views the B * T frame rows as (B, {built})), got a clip "
            f"of {frames}; sample {built} frames per clip"
        )
    return frames


def default_video_layer(model: nn.Module) -> str | None:
    """The layer to explain in a video transformer whose block norms see frames in the batch:
    TimeSformer's last ``temporal_dense`` (``(B, h * w * T, C)``, feeding the last spatial
    attention), X-CLIP's last cross-frame block's ``layer_norm1`` (as CLIP's); else None."""
    if _xclip_frames(model) is not None:
        blocks = [name for name, m in model.named_modules() if hasattr(m, "message_fc")]
        return f"{blocks[-1]}.layer_norm1" if blocks else None
    if _timesformer(model) is None:
        return None
    found = [name for name, _ in model.named_modules() if name.endswith("temporal_dense")]
    return found[-1] if found else None


__all__ = [
    "TokenGrid",
    "default_video_layer",
    "folded_frames",
    "frame_wise",
    "message_tokens",
    "pooled_size",
    "token_grids",
]
