"""The engine every family shares: the :class:`~camkit.core.explainer.Explainer` base, finding
and hooking layers (:mod:`~camkit.core.layers`, always unhooking), tracing a model
(:mod:`~camkit.core.trace`), reading layer outputs as grids (:mod:`~camkit.core.layouts`),
checking inputs, the explicit per-call :class:`~camkit.core.call.Call`, the tapped forward and
its gradients (:mod:`~camkit.core.engine`), scoring copies and finishing maps. Each module's
docstring says what it owns.
"""
