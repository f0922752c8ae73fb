"""The engine every family shares, from the :class:`~camkit.core.explainer.Explainer` base to
finishing maps; each module's docstring says what it owns."""
