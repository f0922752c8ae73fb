"""What "target" means, in one package: the target objects (:mod:`.kinds`, :mod:`.boxes`,
:mod:`.prompts`, :mod:`.tokens`) and their base, the one resolver every family and metric uses
(any ``target=`` -> a :class:`~camkit.targets.resolver.RowScorer`), and how scores are read
from any model output (:mod:`.outputs`). Below :mod:`camkit.core`: it imports nothing of camkit
but :mod:`camkit.errors`.
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
