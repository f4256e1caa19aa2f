"""Benchmark suites for ``slts bench`` beyond the basic write/concat/defrag figures.

Each module exposes ``BENCHMARKS``: name -> ``slts.tools.benchmarks.base.Benchmark``; the
types and shared workloads live in ``base``, below the runner (``slts.tools.bench``).
"""

from __future__ import annotations

from slts.tools.benchmarks import (
    concurrency,
    flushes,
    journal,
    limiter,
    metadata,
    offload,
    reads,
    remote,
    scrape,
    spark,
    transforms,
)

SUITES = (
    concurrency.BENCHMARKS,
    flushes.BENCHMARKS,
    reads.BENCHMARKS,
    metadata.BENCHMARKS,
    scrape.BENCHMARKS,
    journal.BENCHMARKS,
    remote.BENCHMARKS,
    offload.BENCHMARKS,
    limiter.BENCHMARKS,
    spark.BENCHMARKS,
    transforms.BENCHMARKS,
)
