"""What "target" means, in one package: the target objects a user builds (:mod:`.kinds`,
:mod:`.boxes`; a dual encoder's prompts :mod:`.prompts`, a language model's tokens
:mod:`.tokens`), their base (:mod:`.base`), the one resolver every family and metric uses
(:mod:`.resolver`: any ``target=`` -> a :class:`~camkit.targets.resolver.RowScorer`), and how
the scores are read from any model output (:mod:`.outputs`).

The package sits below :mod:`camkit.core`: it imports nothing of camkit but
:mod:`camkit.errors` (transformers, for a tokenizer, only when a prompt is tokenized), and the
engine imports it (the arrows run downward).
"""

from camkit.errors import TargetError
from camkit.targets.base import Target, TargetSpec
from camkit.targets.boxes import BoxTarget
from camkit.targets.kinds import (
    ClassTarget,
    EmbeddingTarget,
    FrameSpanTarget,
    SegmentationTarget,
    SoftmaxTarget,
)
from camkit.targets.prompts import PromptTarget, load_tokenizer
from camkit.targets.resolver import RowScorer, resolve
from camkit.targets.tokens import SpanTarget, TokenTarget

__all__ = [
    "BoxTarget",
    "ClassTarget",
    "EmbeddingTarget",
    "FrameSpanTarget",
    "PromptTarget",
    "RowScorer",
    "SegmentationTarget",
    "SoftmaxTarget",
    "SpanTarget",
    "Target",
    "TargetError",
    "TargetSpec",
    "TokenTarget",
    "load_tokenizer",
    "resolve",
]
