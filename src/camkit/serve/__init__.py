"""``camkit serve``: an interactive explorer of a model's maps, live in the browser.

A gallery of images with their predictions (filters by predicted and true class, misclassified
only, low confidence first), and for each image the maps of any class, method, layer and
checkpoint computed on demand: the depth strip (one method at every stage from one pass), two
classes or two checkpoints side by side, deletion/insertion curves, downloads, and what the
model sees where the user clicks (the concepts there).

* :mod:`camkit.serve.app`: the ASGI app (Starlette): the token check, start and stop;
* :mod:`camkit.serve.routes`: its routes, by concern (the page, the gallery and images, maps,
  uploads, the run's files); :mod:`camkit.serve.http`: checked query parameters, JSON errors;
* :mod:`camkit.serve.batcher`: concurrent map requests -> one engine call per group;
* :mod:`camkit.serve.explorer`: what is computed, through camkit's public API;
* :mod:`camkit.serve.concepts`: the concept views (the top concepts where the user clicks or
  drags, their conditional heatmaps, reference patches and feature visualisations; the concepts
  of a strategies cluster), through :mod:`camkit.methods.concepts`;
* :mod:`camkit.serve.gallery`: the images (folders, ImageFolder labels, a run's manifest, read
  through :mod:`camkit.runs`);
* :mod:`camkit.serve.compare`: where two checkpoints disagree, and the difference of their maps;
* :mod:`camkit.serve.progress`: a long map's progress and cancelling, methods' time estimates;
* :mod:`camkit.serve.security`: the token, path roots, upload limits and response headers;
* :mod:`camkit.serve.logs`: one log line per request, tracebacks on the server side only;
* :mod:`camkit.serve.launch`: paths -> gallery -> app, binding before the URL is printed (the one
  module ``camkit serve`` imports, lazily: this package imports no ``camkit.cli`` module);
* :mod:`camkit.serve.notebook`: :func:`camkit.explore`, the explorer inline in a notebook;
* ``static/``: the page (plain HTML, CSS and JavaScript; nothing fetched from the internet).

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
