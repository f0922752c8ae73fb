"""The base of the target objects (:class:`Target`) and what a ``target=`` may be
(:data:`TargetSpec`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor


class Target:
    """Base of the target objects: what score a map explains.

    A subclass implements ``__call__(output) -> scores``: from the model's whole output (a
    tensor, tuple, dict, list of detections...) ``(B,)`` scores, or ``(B, K)`` for ``K`` maps
    per sample, row ``i`` from sample ``i`` only (perturbation methods call it on batches of
    copies); on an output of another structure, a :class:`~camkit.errors.TargetError` saying
    what it expected. Class targets are data: :meth:`classes` gives their indices (scored as
    softmax probabilities with ``probability = True``), read exactly as plain class indices.
    """

    probability: bool = False

    def classes(self) -> int | Sequence[int] | Sequence[Sequence[int]] | Tensor | None:
        """The class indices this target scores, or None for a target that is not a class."""
        return None

    def for_copies(self) -> Target:
        """The target as perturbed copies of a sample are scored: the same by default; a
        detection target scores a lost detection 0 there."""
        return self

    def for_relevance(self) -> Target:
        """The target as LRP scores it: the same by default; one that normalises (a
        :class:`~camkit.targets.prompts.PromptTarget`'s cosine) takes the norm as a constant
        (AttnLRP's identity rule on a normalisation, Achtibat et al., ICML 2024, Prop. 3.4)."""
        return self

    def __call__(self, output: Any) -> Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


TargetSpec = (
    int | Sequence[int] | Sequence[Sequence[int]] | Tensor | Callable[[Any], Tensor] | Target | None
)


__all__ = ["Target", "TargetSpec"]
