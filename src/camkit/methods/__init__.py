"""The method families: ``cam`` (where, from a layer), ``pixel`` (where, in input space, LRP
included), ``attention`` (rollout, LeGrad), ``guided_gradcam`` (made of both) and ``concepts``
(what the model sees there); their one backward's rules are in :mod:`camkit.relevance`."""
