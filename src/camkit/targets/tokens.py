"""Tokens of a generative model's output as targets: the logit of a token at a position, the
log-probability of a span, one token against another.

A causal (vision-)language model returns ``logits (B, T, V)``: row ``t`` predicts the token at
position ``t + 1``. A target names the position of its token in the sequence the model reads
(the prompt, then the generated tokens, as ``generate()`` returns it). The logit is the score
Grad-CAM uses for a class (Selvaraju et al., ICCV 2017, eq. 1); the log-probability is the span
score of sequence attribution (the sum of the tokens' log-probabilities, of which a language
model's likelihood is made).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from camkit.errors import TargetError
from camkit.targets.base import Target
from camkit.targets.outputs import target_logits

Ints = int | Sequence[int] | Tensor


def _ints(name: str, value: Ints) -> tuple[list[int], bool]:
    """``(values, single)``: an int (single) or a sequence / 1-D tensor of ints."""
    if isinstance(value, Tensor):
        if value.is_floating_point() or value.ndim > 1:
            raise TargetError(f"{name} must be an int or a 1-D list of ints, got {value!r}")
        return value.reshape(-1).tolist(), value.ndim == 0
    if isinstance(value, int) and not isinstance(value, bool):
        return [value], True
    if (
        isinstance(value, Sequence)
        and value
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        return list(value), False
    raise TargetError(f"{name} must be an int or a non-empty list of ints, got {value!r}")


def _per_position(what: str, value: Ints, count: int) -> list[int]:
    """One token for every position, or one per position: ``count`` tokens."""
    values, _ = _ints(what, value)
    if len(values) not in (1, count):
        raise TargetError(f"give one {what} or one per position ({count}), got {len(values)}")
    return values * count if len(values) == 1 else values


def sequence_logits(output: Any, who: str) -> Tensor:
    """The ``(B, T, V)`` next-token logits of a causal (vision-)language model's output."""
    hint = "token targets read a language model's next-token logits"
    return target_logits(output, who, "(B, T, vocabulary)", hint)


def _rows(logits: Tensor, positions: list[int], tokens: list[int], who: str) -> Tensor:
    """The logit rows ``position - 1`` (negative: from the end), ``tokens`` checked too."""
    length, size = logits.shape[1:]
    rows = []
    for position in positions:
        index = position + length if position < 0 else position
        if not 1 <= index < length:
            raise TargetError(
                f"{who}: token position {position} is outside the sequence of {length} tokens; "
                f"a token at position p is predicted from the logits at p - 1, so positions "
                f"1..{length - 1} (or -{length - 1}..-1 from the end) can be explained"
            )
        rows.append(index - 1)
    bad = [token for token in tokens if not 0 <= token < size]
    if bad:
        raise TargetError(f"{who}: token {bad[0]} is outside the vocabulary 0..{size - 1}")
    return torch.tensor(rows, device=logits.device)


def _gather(picked: Tensor, tokens: list[int]) -> Tensor:
    """``(B, K, V)`` -> ``(B, K)``: entry ``tokens[k]`` of each row ``k``."""
    ids = torch.tensor(tokens, device=picked.device)
    return picked.gather(2, ids.expand(picked.shape[0], -1)[..., None])[..., 0]


class TokenTarget(Target):
    """The logit of token ``token`` at sequence position ``position``: ``(B, T, V) -> (B,)``;
    ``K`` positions (one token each, or one for all) give ``(B, K)``, ``K`` targets of one
    backward pass. ``against``: a token (or one per position) whose logit is subtracted (the
    softmax's normaliser cancels: also the log-probability ratio). ``log_prob=True`` scores
    ``log softmax`` instead of the logit.
    """

    def __init__(
        self, position: Ints, token: Ints, *, against: Ints | None = None, log_prob: bool = False
    ):
        self.positions, self.single = _ints("position", position)
        count = len(self.positions)
        self.tokens = _per_position("token", token, count)
        self.against = None if against is None else _per_position("token against", against, count)
        self.log_prob = bool(log_prob)

    @classmethod
    def generated(cls, sequence: Tensor, prompt_length: int, **options: Any) -> TokenTarget:
        """Every generated token of a ``generate()`` output ``sequence`` ``(1, T)`` or ``(T,)``
        after its ``prompt_length`` prompt tokens: ``K = T - prompt_length`` targets."""
        sequence = torch.as_tensor(sequence)
        sequence = sequence[0] if sequence.ndim == 2 and sequence.shape[0] == 1 else sequence
        if sequence.ndim != 1:
            raise TargetError(
                f"generated() takes one sequence (T,) or (1, T), got {tuple(sequence.shape)}; "
                "for a batch pass a list of targets, one per sample"
            )
        if not 1 <= prompt_length < sequence.shape[0]:
            raise TargetError(
                f"prompt_length {prompt_length} leaves no generated token in a sequence of "
                f"{sequence.shape[0]} tokens"
            )
        positions = list(range(prompt_length, sequence.shape[0]))
        return cls(positions, sequence[prompt_length:].tolist(), **options)

    def __call__(self, output: Any) -> Tensor:
        logits = sequence_logits(output, type(self).__name__)
        tokens = self.tokens + (self.against or [])
        picked = logits[:, _rows(logits, self.positions, tokens, type(self).__name__)]
        if self.log_prob:
            picked = picked.log_softmax(dim=-1)
        scores = _gather(picked, self.tokens)
        if self.against is not None:
            scores = scores - _gather(picked, self.against)
        return scores[:, 0] if self.single else scores


class SpanTarget(Target):
    """The log-probability of a span of tokens ``tokens`` starting at position ``start``:
    ``sum_i log p(tokens[i] | the tokens before start + i)``, ``(B, T, V) -> (B,)``."""

    def __init__(self, start: int, tokens: Ints):
        positions, _ = _ints("start", start)
        self.tokens, _ = _ints("tokens", tokens)
        if len(positions) != 1:
            raise TargetError(f"start must be one position, got {start!r}")
        self.start = positions[0]

    def __call__(self, output: Any) -> Tensor:
        logits = sequence_logits(output, type(self).__name__)
        first = self.start + logits.shape[1] if self.start < 0 else self.start
        positions = list(range(first, first + len(self.tokens)))
        rows = _rows(logits, positions, self.tokens, type(self).__name__)
        return _gather(logits[:, rows].log_softmax(dim=-1), self.tokens).sum(dim=1)


__all__ = ["SpanTarget", "TokenTarget", "sequence_logits"]
