"""What "target" means: one resolver turns any target into the scores of a model output.

Accepted targets, for a batch of ``B`` images:

* ``None`` -- each sample's top-1 class;
* ``int`` -- the same class for every sample;
* a list of ``B`` ints or a ``(B,)`` tensor -- one class per sample;
* a list of ``B`` lists of ``K`` ints or a ``(B, K)`` tensor -- ``K`` classes per sample,
  answered from one forward pass;
* a callable ``f(output) -> (B,)`` or ``(B, K)`` scores -- any other objective; it receives the
  model's whole output (a tensor, tuple, dict or object), row ``i`` scored from row ``i``;
* a :class:`Target` object (:mod:`camkit.targets`): class targets (``ClassTarget(3)``,
  ``SoftmaxTarget(3)``) are read as data, so ``ClassTarget(3)`` behaves exactly as ``3``
  everywhere; other kinds are callables as above;
* a list of ``B`` callables, one per sample (pytorch-grad-cam's form): callable ``i`` gets
  sample ``i``'s row of the output (``output[i]``) and returns a scalar (or ``(K,)``).

Class scores are the selected logits (before softmax), as in the Grad-CAM paper.

:func:`resolve` gives a :class:`RowScorer`, used by every family: the gradient CAMs score the
clean pass, the perturbation CAMs and pixel methods score perturbed copies whose row ``i``
belongs to sample ``rows[i]`` (top-1 classes are pinned on the clean pass first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from camkit.errors import NonFiniteWarning, OutputError, TargetError, warn

OutputSelector = str | int | Callable[[Any], Tensor] | None


class Target:
    """Base of the target objects: what score a map explains.

    A new kind of target subclasses this and implements ``__call__(output) -> scores``: it gets
    the model's whole output (a tensor, tuple, dict, list of detections...) and returns ``(B,)``
    scores, or ``(B, K)`` for ``K`` maps per sample, row ``i`` scored from sample ``i`` only
    (perturbation methods call it on batches of perturbed copies). It should check the output's
    structure and raise :class:`~camkit.errors.TargetError` saying what it expected.

    Class targets are data rather than code: they return their class indices from
    :meth:`classes` (and ``probability = True`` scores the softmax probability instead of the
    logit), so every method and metric treats them exactly as the plain class indices.
    """

    probability: bool = False

    def classes(self) -> int | Sequence[int] | Sequence[Sequence[int]] | Tensor | None:
        """The class indices this target scores, or None for a target that is not a class."""
        return None

    def __call__(self, output: Any) -> Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


TargetSpec = (
    int | Sequence[int] | Sequence[Sequence[int]] | Tensor | Callable[[Any], Tensor] | Target | None
)


def select_output(output: Any, selector: OutputSelector = None) -> Tensor:
    """Pick the logits from a model's output.

    ``selector`` is a key (dict key or attribute), an index, or a callable. Without one: a tensor
    is used as is, an object or dict with ``logits`` (HuggingFace style) gives its logits, and a
    tuple or list gives its first element.
    """
    if callable(selector):
        picked = selector(output)
    elif isinstance(selector, str):
        if isinstance(output, Mapping) and selector in output:
            picked = output[selector]
        elif hasattr(output, selector):
            picked = getattr(output, selector)
        else:
            keys = list(output) if isinstance(output, Mapping) else None
            raise OutputError(
                f"the model's output ({type(output).__name__}) has no {selector!r}"
                + (f"; its keys are {keys}" if keys is not None else "")
            )
    elif isinstance(selector, int):
        try:
            picked = output[selector]
        except (IndexError, TypeError, KeyError):
            raise OutputError(
                f"output={selector} does not index the model's output ({type(output).__name__})"
            ) from None
    elif isinstance(output, Tensor):
        picked = output
    elif isinstance(output, Mapping) and "logits" in output:
        picked = output["logits"]
    elif hasattr(output, "logits"):
        picked = output.logits
    elif isinstance(output, tuple | list) and output:
        picked = output[0]
    else:
        raise OutputError(
            f"cannot find the logits in the model's output ({type(output).__name__}); "
            "pass output= a key, an index or a callable that picks them, or a callable target"
        )
    if not isinstance(picked, Tensor):
        raise OutputError(f"the selected model output is {type(picked).__name__}, not a tensor")
    return picked


def _logits(output: Any, selector: OutputSelector) -> Tensor:
    logits = select_output(output, selector)
    if logits.ndim != 2:
        raise TargetError(
            f"class targets need (B, num_classes) logits, but the model gives shape "
            f"{tuple(logits.shape)}; pass a callable target that returns (B,) scores"
        )
    return logits


def _class_tensor(target: TargetSpec, batch: int, device: torch.device) -> tuple[Tensor, bool]:
    """An explicit class target as ``(classes (B, K), several)``; type and shape checked."""
    if isinstance(target, bool) or (
        not isinstance(target, int | Tensor | Sequence) or isinstance(target, str)
    ):
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


@dataclass(frozen=True)
class RowScorer:
    """A target resolved for a batch of ``B`` samples (see :func:`resolve`).

    ``scorer(output, rows)`` gives ``(scores (n, K), several)`` for a model output whose row
    ``i`` belongs to sample ``rows[i]``: the logits (or, with ``probability``, the softmax
    probabilities) of the fixed classes (``classes (B, K)``), the top-1 logit of each row
    (``classes is None``: see :meth:`pinned`), or the callable's scores; ``several`` says
    whether ``K`` targets per sample were asked (a 2-D target, or a callable returning
    ``(n, K)``). Methods ask it questions (:attr:`has_classes`, :attr:`top1`,
    :meth:`classes_of`, :meth:`target_of`) rather than reading its fields.
    """

    selector: OutputSelector = None
    classes: Tensor | None = None
    function: Callable[[Any], Tensor] | None = None
    several: bool = False
    probability: bool = False
    per_sample: tuple[Callable[[Any], Tensor], ...] | None = None

    @property
    def has_classes(self) -> bool:
        """Whether the target is class indices (fixed or each row's top-1), not a callable."""
        return self.function is None and self.per_sample is None

    @property
    def top1(self) -> bool:
        """Whether the classes are each row's own top-1 (not fixed yet)."""
        return self.classes is None and self.has_classes

    def pinned(self, output: Any) -> RowScorer:
        """The same target with top-1 classes fixed from a clean pass over the ``B`` samples,
        so that perturbed copies keep explaining the clean prediction."""
        if not self.top1:
            return self
        classes = _logits(output, self.selector).detach().argmax(dim=1, keepdim=True)
        return replace(self, classes=classes)

    def classes_of(self, output: Any, rows: Tensor) -> tuple[Tensor, bool]:
        """``(classes (n, K), several)``: the class indices that score the output's rows (the
        fixed classes of samples ``rows``, or each row's top-1), checked against the logits.
        For methods that use the classes themselves (a classifier's rows, the closest
        classes); a callable target has none: :class:`~camkit.errors.TargetError`."""
        if not self.has_classes:
            raise TargetError("this method needs class targets (class indices), not a callable")
        _, several = self(output, rows)  # checks the logits and the class range
        if self.classes is None:
            return self.pinned(output).classes, several
        return self.classes[rows.to(self.classes.device)], several

    def target_of(self, rows: Tensor, k: int) -> Tensor | Callable[[Any], Tensor]:
        """Target ``k`` of samples ``rows`` as a target of its own for a batch of ``n`` rows
        (e.g. patches or copies of those samples): their ``(n,)`` fixed classes, or the
        callable reduced to its ``k``-th score. Top-1 targets must be :meth:`pinned` first."""
        if self.classes is not None:
            return self.classes[rows.to(self.classes.device), k]
        if self.top1:
            raise TargetError("pin the top-1 classes on a clean pass before splitting them")
        samples = rows.tolist()

        def column(output: Any) -> Tensor:
            scores, _ = self._called(output, samples)
            return scores[:, k]

        return column

    def probabilities(self, output: Any, rows: Tensor) -> tuple[Tensor, bool]:
        """As calling the scorer, but a class target scores its softmax probability (as the
        metrics and the perturbation methods that compare images need); a callable target
        keeps its own scores. Float32, detached."""
        if not self.has_classes:
            scores, several = self(output, rows)
        else:
            classes, several = self.classes_of(output, rows)
            logits = select_output(output, self.selector).float()
            scores = logits.softmax(dim=1).gather(1, classes.to(logits.device))
        return scores.detach().float(), several

    def __call__(self, output: Any, rows: Tensor) -> tuple[Tensor, bool]:
        scores, several = self._scores(output, rows)
        if not torch.isfinite(scores.detach()).all():
            warn(
                "the model returned non-finite (inf/NaN) scores for the target: the maps of "
                "those samples are not meaningful (their non-finite entries are set to 0)",
                NonFiniteWarning,
            )
        return scores, several

    def _scores(self, output: Any, rows: Tensor) -> tuple[Tensor, bool]:
        n = rows.shape[0]
        if not self.has_classes:
            return self._called(output, rows.tolist())
        logits = _logits(output, self.selector)
        if logits.shape[0] != n:
            raise TargetError(f"the model returned {logits.shape[0]} rows of logits for {n} inputs")
        if self.classes is None:
            return logits.gather(1, logits.detach().argmax(dim=1, keepdim=True)), False
        classes = self.classes[rows.to(self.classes.device)]
        bad = (classes < 0) | (classes >= logits.shape[1])
        if bad.any():
            raise TargetError(
                f"target class {classes[bad][0].item()} is out of range: the model has "
                f"{logits.shape[1]} outputs, so classes must be in 0..{logits.shape[1] - 1}"
            )
        if self.probability:
            logits = logits.softmax(dim=1)
        return logits.gather(1, classes.to(logits.device)), self.several

    def _called(self, output: Any, samples: list[int]) -> tuple[Tensor, bool]:
        n = len(samples)
        with _user_code("a callable target"):
            if self.per_sample is None:
                scores = self.function(output)
            else:
                scores = torch.stack(
                    [self.per_sample[s](_row(output, i)) for i, s in enumerate(samples)]
                )
        if not isinstance(scores, Tensor) or scores.ndim not in (1, 2) or scores.shape[0] != n:
            got = tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
            raise TargetError(
                f"a callable target must return scores of shape ({n},) or ({n}, K), got {got}; "
                f"it receives the model's whole output (all {n} rows), e.g. "
                "lambda out: out[:, 281] (for a class, pass target=281)"
            )
        return scores.reshape(n, -1), scores.ndim == 2


@contextmanager
def _user_code(what: str) -> Iterator[None]:
    """Turn an indexing/type error raised inside the user's callable into a TargetError that
    says what the callable receives."""
    try:
        yield
    except (IndexError, KeyError, TypeError, AttributeError) as err:
        raise TargetError(
            f"{what} failed on the model's output: {type(err).__name__}: {err}. A callable "
            "target receives the model's WHOLE output (every row of the batch) and returns "
            "(B,) scores, e.g. lambda out: out[:, 281]; for a class pass target=281 (or "
            "ClassTarget(281)); one callable per sample goes in a list of B callables"
        ) from err


def _row(output: Any, i: int) -> Any:
    """Sample ``i`` of a batched output: a tensor's row or a list's (detections) item."""
    if isinstance(output, Tensor | list | tuple):
        return output[i]
    raise TargetError(
        f"a list of per-sample callables needs a tensor or list output, got "
        f"{type(output).__name__}; pass one callable on the whole output instead"
    )


def _has_bool(target: object) -> bool:
    if isinstance(target, bool):
        return True
    if isinstance(target, Sequence) and not isinstance(target, str):
        return any(_has_bool(item) for item in target)
    return False


def resolve(
    target: TargetSpec, batch: int, device: torch.device, selector: OutputSelector = None
) -> RowScorer:
    """Check ``target`` for a batch of ``batch`` samples and return its :class:`RowScorer`.

    Explicit classes (and class target objects) are checked here (type, shape), and against
    the logits when scored (range); a callable is checked when called.
    """
    if target is None:
        return RowScorer(selector)
    if isinstance(target, Target) and target.classes() is not None:
        classes, several = _class_tensor(target.classes(), batch, device)
        return RowScorer(selector, classes=classes, several=several, probability=target.probability)
    if callable(target) and not isinstance(target, Tensor):
        return RowScorer(selector, function=target)
    if (
        isinstance(target, Sequence)
        and target
        and not isinstance(target, str)
        and all(callable(item) and not isinstance(item, Tensor) for item in target)
    ):
        if len(target) != batch:
            raise TargetError(
                f"a list of callables is one per sample: expected {batch}, got {len(target)}; "
                "one callable for every sample is target=f (it gets the whole output)"
            )
        classes = [item.classes() if isinstance(item, Target) else None for item in target]
        if all(isinstance(c, int) for c in classes) and len({t.probability for t in target}) == 1:
            scorer = resolve(classes, batch, device, selector)  # ClassTarget per sample
            return replace(scorer, probability=target[0].probability)
        return RowScorer(selector, per_sample=tuple(target))
    classes, several = _class_tensor(target, batch, device)
    return RowScorer(selector, classes=classes, several=several)
