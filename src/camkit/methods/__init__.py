"""The method families, side by side: ``cam`` (where, from a layer), ``pixel`` (where, in input
space, LRP included), ``attention`` (attention rollout, LeGrad), ``guided_gradcam`` (the one method
made of both) and ``concepts`` (what the model sees there). The rules of the one backward they
share live in :mod:`camkit.relevance`; a new CAM goes in ``cam/``, a new pixel method in
``pixel/``."""
