"""The ``camkit`` subcommands, one module each (``add_parser`` and ``run``); the helpers they share
(options, loading, the per-rank pipeline, the report) live in :mod:`camkit.cli`."""
