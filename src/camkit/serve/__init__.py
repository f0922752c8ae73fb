"""``camkit serve``: an interactive explorer of a model's maps, live in the browser.

A gallery of images with their predictions (filters, misclassified only, low confidence first),
and for each image the maps of any class, method, layer and checkpoint computed on demand: the
depth strip, two classes or two checkpoints side by side, deletion/insertion curves, downloads,
and the concepts where the user clicks. Modules: :mod:`~camkit.serve.app` (the ASGI app) and
:mod:`~camkit.serve.routes`; :mod:`~camkit.serve.batcher` (concurrent map requests -> one
engine call); :mod:`~camkit.serve.explorer` (what is computed, through camkit's public API);
:mod:`~camkit.serve.concepts`, :mod:`~camkit.serve.prompts`, :mod:`~camkit.serve.compare`,
:mod:`~camkit.serve.clips` (videos); :mod:`~camkit.serve.gallery` (the images);
:mod:`~camkit.serve.progress`; :mod:`~camkit.serve.security` (every safety check);
:mod:`~camkit.serve.logs`; :mod:`~camkit.serve.launch` (the one module ``camkit serve``
imports, lazily); :mod:`~camkit.serve.notebook` (:func:`camkit.explore`); ``static/``: the page.

The web stack is an optional extra: ``pip install 'camkit[serve]'``.
"""

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
