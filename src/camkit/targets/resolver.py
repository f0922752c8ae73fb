"""What "target" means: one resolver turns any target into the scores of a model output.

Accepted targets, for a batch of ``B`` images:

* ``None`` -- each sample's top-1 class;
* ``int`` -- the same class for every sample;
* a list of ``B`` ints or a ``(B,)`` tensor -- one class per sample;
* a list of ``B`` lists of ``K`` ints or a ``(B, K)`` tensor -- ``K`` classes per sample,
  answered from one forward pass;
* a callable ``f(output) -> (B,)`` or ``(B, K)`` scores, on the model's whole output (a
  tensor, tuple, dict or object), row ``i`` scored from row ``i``;
* a :class:`~camkit.targets.base.Target` object: class targets (``ClassTarget(3)``) are read as
  data, exactly as ``3``; other kinds are callables as above;
* a list of ``B`` target objects or callables (one per sample) or ``B`` lists of ``K``: a camkit
  :class:`Target` gets the whole output, any other callable (pytorch-grad-cam's
  ``ClassifierOutputTarget(281)``) sample ``i``'s own output ``output[i]`` and returns a scalar.

Class scores are the logits before softmax, as in the Grad-CAM paper. Every family uses the
:class:`RowScorer`, on the clean pass or on perturbed copies whose row ``i`` belongs to sample
``rows[i]`` (top-1 classes pinned on the clean pass first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from camkit.errors import NonFiniteWarning, TargetError, warn
from camkit.targets.base import Target, TargetSpec
from camkit.targets.outputs import OutputSelector, class_logits, select_output
from camkit.targets.per_sample import PerSample
from camkit.targets.ranking import top1


def _class_tensor(target: TargetSpec, batch: int, device: torch.device) -> tuple[Tensor, bool]:
    """An explicit class target as ``(classes (B, K), several)``; type and shape checked."""
    if isinstance(target, bool | str) or not isinstance(target, int | Tensor | Sequence):
        raise TargetError(
            "target must be None, an int, a list of ints, a list of lists, a tensor or a "
            f"callable, got {type(target).__name__}"
        )
    if isinstance(target, int):
        return torch.full((batch, 1), target, dtype=torch.long, device=device), False
    if _has_bool(target):
        raise TargetError(f"target classes must be integers, not booleans: got {target!r}")
    try:
        classes = torch.as_tensor(target, device=device)
    except (TypeError, ValueError) as err:
        raise TargetError(
            f"target lists must be rectangular lists of ints ({err}); "
            "give every sample the same number of classes"
        ) from None
    if classes.is_floating_point() or classes.is_complex() or classes.dtype == torch.bool:
        raise TargetError(f"target classes must be integers, got {classes.dtype}")
    if classes.ndim not in (1, 2) or classes.shape[0] != batch:
        raise TargetError(
            f"expected one target per sample ({batch},) or several per sample "
            f"({batch}, K), got shape {tuple(classes.shape)} for a batch of {batch}; "
            "for several classes per image pass a list of lists or a (B, K) tensor"
        )
    if classes.ndim == 2 and classes.shape[1] == 0:
        raise TargetError("the target lists no class")
    # a copy: a tensor made under torch.inference_mode() could not be saved for backward
    return classes.long().reshape(batch, -1).clone(), classes.ndim == 2


@dataclass
class Learned:
    """What scoring taught a resolved target, shared by its pinned and copy variants."""

    several: bool = False  # a callable returned (n, K) scores
    top1: Tensor | None = None  # (B, 1) each sample's top-1 class, once scored


@dataclass(frozen=True)
class RowScorer:
    """A target resolved for a batch of ``B`` samples (see :func:`resolve`): ``scorer(output,
    rows)`` gives the scores ``(n, K)`` of an output whose row ``i`` belongs to sample
    ``rows[i]``: the logits (softmax probabilities with ``probability``) of the fixed ``classes
    (B, K)``, each row's top-1 logit (``classes is None``: see :meth:`pinned`), or the
    callable's scores. Methods ask it questions rather than reading its fields.
    """

    selector: OutputSelector = None
    classes: Tensor | None = None
    function: Callable[[Any], Tensor] | None = None
    asked_k: bool = False  # a 2-D class target or K target objects per sample
    probability: bool = False
    free: bool = False  # a target-free method (Eigen-CAM): (n, 1) zeros, the output untouched
    samples: int = 0  # B, for the top-1 classes learned
    learned: Learned = field(default_factory=Learned, compare=False, repr=False)

    @property
    def several(self) -> bool:
        """Whether ``K`` targets per sample were asked (a callable's: once it was called)."""
        return self.asked_k or self.learned.several

    @property
    def explained(self) -> Tensor | None:
        """The classes explained ``(B, K)``: fixed, or top-1 once scored; None for a callable."""
        return self.classes if self.classes is not None else self.learned.top1

    @property
    def has_classes(self) -> bool:
        """Whether the target is class indices (fixed or each row's top-1), not a callable."""
        return self.function is None and not self.free

    @property
    def top1(self) -> bool:
        """Whether the classes are each row's own top-1 (not fixed yet)."""
        return self.classes is None and self.has_classes

    def pinned(self, output: Any) -> RowScorer:
        """The same target with top-1 classes fixed from a clean pass over the ``B`` samples,
        so that perturbed copies keep explaining the clean prediction."""
        if not self.top1:
            return self
        logits = class_logits(output, self.selector)
        return replace(self, classes=self.top1_of(logits, torch.arange(logits.shape[0])))

    def classes_of(self, output: Any, rows: Tensor) -> Tensor:
        """The classes ``(n, K)`` that score the output's rows (the fixed classes of samples
        ``rows``, or each row's top-1), checked against the logits; a callable target has none:
        :class:`~camkit.errors.TargetError`."""
        if not self.has_classes:
            raise TargetError("this method needs class targets (class indices), not a callable")
        self(output, rows)  # checks the logits and the class range
        if self.classes is None:
            return self.top1_of(class_logits(output, self.selector), rows)
        return self.classes[rows.to(self.classes.device)]

    def top1_of(self, logits: Tensor, rows: Tensor) -> Tensor:
        """Each row's top-1 class ``(n, 1)``, learned as the class explained of its sample
        ``rows[i]`` (out of place: the pinning pass runs in inference mode)."""
        best = top1(logits.detach(), keepdim=True)
        known = self.learned.top1
        known = best.new_full((self.samples, 1), -1) if known is None else known
        self.learned.top1 = known.index_put((rows.to(best.device),), best)
        return best

    def target_of(self, rows: Tensor, k: int) -> Tensor | Callable[[Any], Tensor]:
        """Target ``k`` of samples ``rows`` as the target of a batch of ``n`` rows: ``(n,)``
        classes, or the callable's ``k``-th score; top-1 targets must be :meth:`pinned`."""
        if self.classes is not None:
            return self.classes[rows.to(self.classes.device), k]
        if self.top1:
            raise TargetError("pin the top-1 classes on a clean pass before splitting them")
        return lambda output: self._scores(output, rows)[:, k]

    def for_copies(self) -> RowScorer:
        """The scorer of perturbed copies: each target object's :meth:`Target.for_copies`."""
        return self._each("for_copies")

    def for_relevance(self) -> RowScorer:
        """The scorer LRP uses: each target object's :meth:`Target.for_relevance`."""
        return self._each("for_relevance")

    def _each(self, form: str) -> RowScorer:
        if isinstance(self.function, PerSample):
            return replace(self, function=self.function.each(form))
        if isinstance(self.function, Target):
            return replace(self, function=getattr(self.function, form)())
        return self

    def probabilities(self, output: Any, rows: Tensor) -> Tensor:
        """As calling the scorer, but a class target scores its softmax probability (a callable
        target keeps its own scores); float32, detached."""
        if not self.has_classes:
            return self(output, rows).detach().float()
        classes = self.classes_of(output, rows)
        logits = select_output(output, self.selector).float()
        return logits.softmax(dim=1).gather(1, classes.to(logits.device)).detach()

    def __call__(self, output: Any, rows: Tensor) -> Tensor:
        scores = self._scores(output, rows)
        if not torch.isfinite(scores.detach()).all():
            warn(
                "the model returned non-finite (inf/NaN) scores for the target: the maps of "
                "those samples are not meaningful (their non-finite entries are set to 0)",
                NonFiniteWarning,
            )
        return scores

    def _scores(self, output: Any, rows: Tensor) -> Tensor:
        n = rows.shape[0]
        if self.free:
            return torch.zeros(n, 1)
        if isinstance(self.function, PerSample):
            with _user_code("a per-sample target"):
                return self.function.scores(output, rows)
        if self.function is not None:
            return self._called(output, n)
        logits = class_logits(output, self.selector)
        if logits.shape[0] != n:
            raise TargetError(f"the model returned {logits.shape[0]} rows of logits for {n} inputs")
        if self.classes is None:
            return logits.gather(1, self.top1_of(logits, rows))
        classes = self.classes[rows.to(self.classes.device)]
        bad = (classes < 0) | (classes >= logits.shape[1])
        if bad.any():
            batch = self.classes.shape[0]
            split = ""
            if n < batch and logits.shape[1] == n:
                split = (
                    f". This forward holds {n} of the batch's {batch} samples and the model gave "
                    f"{n} outputs: if they index another input's rows (CLIP's logits_per_image, "
                    "one column per text), the per-sample additional_forward_args were split "
                    f"with their images; pass batch_size=None (or at least {batch}) so every "
                    "forward sees all of them"
                )
            raise TargetError(
                f"target class {classes[bad][0].item()} is out of range: the model has "
                f"{logits.shape[1]} outputs, so classes must be in 0..{logits.shape[1] - 1}" + split
            )
        if self.probability:
            logits = logits.softmax(dim=1)
        return logits.gather(1, classes.to(logits.device))

    def _called(self, output: Any, n: int) -> Tensor:
        with _user_code("a callable target"):
            scores = self.function(output)
        if not isinstance(scores, Tensor) or scores.ndim not in (1, 2) or scores.shape[0] != n:
            got = tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
            raise TargetError(
                f"a callable target must return scores of shape ({n},) or ({n}, K), got {got}; "
                f"it receives the model's whole output (all {n} rows), e.g. "
                "lambda out: out[:, 281] (for a class, pass target=281)"
            )
        self.learned.several = scores.ndim == 2
        return scores.reshape(n, -1)


@contextmanager
def _user_code(what: str) -> Iterator[None]:
    """An error inside the user's callable as a TargetError saying what the callable gets."""
    try:
        yield
    except (IndexError, KeyError, TypeError, AttributeError) as err:
        raise TargetError(
            f"{what} failed on the model's output: {type(err).__name__}: {err}. A callable "
            "target receives the model's WHOLE output (every row of the batch) and returns "
            "(B,) scores, e.g. lambda out: out[:, 281]; for a class pass target=281 (or "
            "ClassTarget(281)); one callable per sample goes in a list of B callables"
        ) from err


def _has_bool(target: object) -> bool:
    nested = isinstance(target, Sequence) and not isinstance(target, str)
    return isinstance(target, bool) or (nested and any(map(_has_bool, target)))


def _class_targets(target: object) -> tuple[list, bool] | None:
    """``[ClassTarget(3), ClassTarget(5)]`` as ``([3, 5], probability)``, else None."""
    if isinstance(target, Tensor | str) or not isinstance(target, Sequence) or not target:
        return None
    if not all(isinstance(item, Target) and isinstance(item.classes(), int) for item in target):
        return None
    if len({item.probability for item in target}) != 1:
        return None
    return [item.classes() for item in target], target[0].probability


def resolve(
    target: TargetSpec, batch: int, device: torch.device, selector: OutputSelector = None
) -> RowScorer:
    """Check ``target`` for a batch of ``batch`` samples and return its :class:`RowScorer`.

    Explicit classes (and class target objects) are checked here (type, shape), and against
    the logits when scored (range); a callable is checked when called.
    """
    if isinstance(target, RowScorer):  # resolved once by the call's template
        return target
    if target is None:
        return RowScorer(selector, samples=batch)
    probability = False
    if isinstance(target, Target) and target.classes() is not None:
        target, probability = target.classes(), target.probability
    elif (listed := _class_targets(target)) is not None:  # ClassTarget(c) per sample
        target, probability = listed
    elif callable(target) and not isinstance(target, Tensor):
        return RowScorer(selector, function=target, samples=batch)
    elif (per_sample := PerSample.of(target, batch)) is not None:
        return RowScorer(selector, function=per_sample, asked_k=per_sample.several)
    classes, several = _class_tensor(target, batch, device)
    return RowScorer(selector, classes=classes, asked_k=several, probability=probability)


__all__ = ["PerSample", "RowScorer", "resolve"]
