"""``camkit serve``: an interactive explorer of a model's maps, live in the browser: a gallery of
images with their predictions, and each image's maps of any class, method, layer and checkpoint
on demand: the depth strip, two classes or checkpoints side by side, deletion/insertion curves,
downloads, the concepts where the user clicks. The app (:mod:`~camkit.serve.app`) calls
:mod:`~camkit.serve.explorer` (camkit's public API only); ``camkit serve`` imports
:mod:`~camkit.serve.launch` only, lazily. The web stack is an optional extra:
``pip install 'camkit[serve]'``."""

from __future__ import annotations

MISSING_STACK = (
    "camkit serve needs the web stack, which is an optional extra: "
    "pip install 'camkit[serve]' (starlette and uvicorn)"
)


def web_stack_missing() -> str | None:
    """None when starlette and uvicorn import; else the message saying how to install them."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        return MISSING_STACK
    return None
