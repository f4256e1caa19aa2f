"""Operator tools on top of the engine: the ``slts`` CLI, the demo, benchmarks (``slts.tools``)."""
