"""Seeds: checking a ``seed=``, the seed of one call, and a generator on the input's device."""

from __future__ import annotations

import torch

from camkit.errors import ArgumentError


def seed_value(seed: object, *, optional: bool = False) -> int | None:
    """``seed`` as an int (``None`` too when ``optional``), else :class:`ArgumentError`."""
    if seed is None and optional:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int):
        allowed = "an int or None" if optional else "an int"
        raise ArgumentError(f"seed must be {allowed}, got {type(seed).__name__}")
    return seed


def call_seed(seed: int | None) -> int:
    """``seed``, or for None a new one drawn from torch's global generator (so that
    ``torch.manual_seed`` makes an unseeded call reproducible)."""
    return int(torch.randint(2**62, ())) if seed is None else seed


def generator(device: torch.device) -> torch.Generator:
    """A random generator on ``device`` where the backend has one, else on the CPU (draw with
    ``device=generator.device``, then move)."""
    try:
        return torch.Generator(device=device)
    except RuntimeError:
        return torch.Generator()


__all__ = ["call_seed", "generator", "seed_value"]
