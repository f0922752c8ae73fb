"""The errors camkit raises on purpose: catch :class:`CamkitError` for all of them; each is also
a ``ValueError``. Messages say what was expected and what came.
"""

from __future__ import annotations

import sys
import warnings


class CamkitError(ValueError):
    """Base of every error camkit raises for a bad argument, input, layer, target or file."""


class ArgumentError(CamkitError):
    """An option of a method or function with a wrong type or value (``batch_size=0``)."""


class InputError(CamkitError):
    """The image tensor: wrong type, shape, dtype, device, or non-finite values."""


class LayerNotFoundError(CamkitError):
    """A layer name or module that is not part of the model."""


class ClassifierNotFoundError(LayerNotFoundError):
    """No classifier usable for CAM (one linear layer after the global pooling) was found."""


class LayerOutputError(CamkitError):
    """A layer that did not run, did not return a tensor, or does not reach the score."""


class OutputError(CamkitError):
    """The model's output holds nothing camkit can score (no logits, a missing key)."""


class TargetError(CamkitError):
    """A target that is malformed, out of the class range, or does not fit the output."""


class LayoutError(CamkitError):
    """A layer output that cannot be read as a spatial grid without guessing."""


class AttentionError(CamkitError):
    """A model whose attention cannot be read (no supported attention module, wrong blocks)."""


class GradientError(CamkitError):
    """The target score does not depend on the input (a detached or no-grad model)."""


class RelevanceError(CamkitError):
    """An operation on LRP's relevance path that no rule covers, or a rule that cannot apply."""


class UnknownMethodError(CamkitError):
    """A method name that is not in the registry."""


class UnknownModelError(CamkitError):
    """A model name that is neither the default model, torchvision:NAME nor timm:NAME."""


class RunFileError(CamkitError):
    """A run folder's file that is partial, corrupt, misshapen or of a newer version: the
    message names the file, its version and the command that writes it again."""


class CheckpointError(CamkitError):
    """A checkpoint file that camkit cannot use (unreadable, unnamed architecture...)."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint that can only be read by running pickled code (refused, never run)."""


class CheckpointMismatchError(CheckpointError):
    """A checkpoint whose tensors do not fit the architecture."""


class EmptyMapWarning(UserWarning):
    """A map that is zero everywhere: the method found nothing to show for that target."""


class NonFiniteWarning(UserWarning):
    """The model produced inf/NaN scores or gradients; those map entries were set to 0."""


class ZeroGradientWarning(UserWarning):
    """A layer whose gradient is zero for the target: its gradient-weighted map is blank."""


class IllConditionedWarning(UserWarning):
    """A formula evaluated where it is ill-conditioned (Grad-CAM++'s alphas whose denominator
    nearly cancels): the map is sensitive to small changes."""


class ConservationWarning(UserWarning):
    """LRP lost (or created) more of the target score than its composite allows."""


class UnmovedObjectiveWarning(UserWarning):
    """Feature visualisation could not move its objective from any start it tried (a unit
    closed for every image): the image is an unoptimised start."""


def warn(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` pointing at the caller's line: the first frame outside camkit."""
    frame, level = sys._getframe(1), 2  # stacklevel 2 is the frame that called warn()
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == "camkit":
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
