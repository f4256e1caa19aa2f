"""Benchmark suites for ``slts bench`` beyond the basic write/concat/defrag figures.

Each module exposes ``BENCHMARKS``: name -> ``slts.tools.bench.Benchmark``.
"""

from __future__ import annotations

from slts.tools.benchmarks import concurrency, journal, metadata, reads, spark

SUITES = (concurrency.BENCHMARKS, reads.BENCHMARKS, metadata.BENCHMARKS, journal.BENCHMARKS, spark.BENCHMARKS)
