"""Text shown with its tokens coloured by relevance: a picture of words, as an HTML page."""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np

from camkit.errors import ArgumentError
from camkit.viz.colour import float_array, signed_limit


def token_colour(value: float, limit: float) -> str:
    """A signed relevance as a CSS background: red for positive, blue for negative, its
    opacity ``|value| / limit`` (clipped to 1); transparent for 0 or a zero ``limit``."""
    if limit <= 0 or value == 0:
        return "transparent"
    strength = min(abs(value) / limit, 1.0)
    red, blue = (220, 40) if value > 0 else (40, 220)
    return f"rgba({red}, 40, {blue}, {strength:.3f})"


def token_colours(relevance: object, tokens: int, explained: int) -> list[list[str]]:
    """The CSS backgrounds (:func:`token_colour`) of a ``(K, T)`` token relevance (``K =
    explained``, ``T = tokens``) on one scale ``[-L, L]``, ``L`` the 99.5th percentile of
    ``|relevance|`` (:func:`~camkit.viz.colour.signed_limit`): for the token page and the
    explorer alike."""
    values = float_array(relevance, "relevance", np.float64)
    if values.ndim != 2 or values.shape != (explained, tokens):
        raise ArgumentError(
            f"relevance must be ({explained}, {tokens}): one row per explained token, "
            f"one column per token; got {values.shape}"
        )
    limit = signed_limit(values)
    return [[token_colour(float(value), limit) for value in row] for row in values]


def token_html(
    tokens: Sequence[str], answer: Sequence[int], relevance: object, title: str = ""
) -> str:
    """An HTML page: for each explained token (``answer``: their positions in ``tokens``, the
    sequence's tokens as text), a line with the tokens before it coloured by their relevance to
    it (:func:`token_colours`; red positive, blue negative; each value in its ``title``) and
    the token itself underlined. ``relevance``: ``(K, T)`` for ``K = len(answer)``, e.g.
    :attr:`camkit.methods.cam.generation.TokenExplanation.token_relevance` of one image.
    """
    colours = token_colours(relevance, len(tokens), len(answer))
    values = float_array(relevance, "relevance", np.float64)
    lines = []
    for row, shades, position in zip(values, colours, answer, strict=True):
        spans = [
            f'<span class="t" style="background:{shade}" '
            f'title="{value:.4g}">{html.escape(token)}</span>'
            for token, value, shade in zip(tokens[:position], row, shades[:position], strict=False)
        ]
        word = html.escape(tokens[position])
        lines.append(f'<p>{" ".join(spans)} <span class="word">{word}</span></p>')
    head = html.escape(title)
    return (
        '<!doctype html>\n<html><head><meta charset="utf-8"><title>'
        f"{head}</title><style>body{{font-family:sans-serif}} .t{{padding:1px 2px}} "
        ".word{text-decoration:underline;font-weight:bold}</style></head><body>"
        f"<h1>{head}</h1>{''.join(lines)}</body></html>\n"
    )


__all__ = ["token_colour", "token_colours", "token_html"]
