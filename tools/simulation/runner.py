"""Run seeds: one (exactly replayable), many (the soak), shrink a failing program.

``run_seed(seed, ops)`` builds the seam, draws the program, then the world, in that
fixed order, and runs the program step by step; after every step it checks the
invariants (``checks``). The first violation ends the run (its kind, step and message
are in the result), unless its kind is in ``ignore``: then it is counted and the run
goes on. ``digest`` hashes the final state (model, every metadata table, every chunk),
so two runs of one seed can be compared exactly.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from slts.errors import InvalidArgument, SltsError

from . import checks
from .checks import Violation
from .program import Step, generate
from .seam import Seam
from .world import World


@dataclass
class SeedResult:
    """What one run of one seed did."""

    seed: int
    program: list[Step]
    lines: list[str] = field(default_factory=list)  # one description per step run
    violation: Violation | None = None
    failed_step: int | None = None  # index into program
    ignored: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    counters: Counter[str] = field(default_factory=Counter)
    digest: str = ""
    steps_run: int = 0  # steps started (the failing one included)


def _digest(world: World) -> str:
    """SHA-256 of the model, every metadata table and every chunk of the tier-2 storage."""
    h = hashlib.sha256()
    for name, value in world.model.state().items():
        h.update(repr((name, value)).encode())
    for table, entries in sorted(world.store.dump().items()):
        for key, stored in sorted(entries.items()):
            h.update(repr((table, key, stored.value, stored.version)).encode())
    for chunk in sorted(world.binding.list("")):
        info = world.binding.get_info(chunk)
        h.update(chunk.encode() + world.binding.read(world.binding.open_read(chunk), 0, info.length))
    return h.hexdigest()


def _check(world: World) -> None:
    checks.check_content(world.observe(), world.model.state())
    checks.check_verify(world.s, len(world.model.segments))
    checks.check_leaks(world.s)
    world.nonces.check(world.store, world.binding)
    world.remote.check()
    world.offload.check()


def _check_count(what: str, value: object, minimum: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgument(f"{what} must be an integer >= {minimum}, got {value!r}")


def run_seed(
    seed: int, ops: int, *, program: Sequence[Step] | None = None, ignore: Iterable[str] = ()
) -> SeedResult:
    """Run seed ``seed`` (``program``: these steps instead of the ``ops`` it draws).
    Raises ``InvalidArgument`` unless ``seed`` and ``ops`` are integers >= 0."""
    _check_count("seed", seed)
    _check_count("ops", ops)
    ignored_kinds = set(ignore)
    seam = Seam(seed)
    drawn = generate(seam.derive(), ops)
    steps = list(program) if program is not None else drawn
    result = SeedResult(seed, steps)
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)  # the engine's warnings about injected faults are expected
    world: World | None = None
    try:
        with seam.names():
            try:
                world = World(seam)
            except Violation as violation:  # the container could not even start
                result.violation, result.failed_step = violation, 0
                result.lines.append(f"-> VIOLATION at start: {violation}")
                return result
            for index, step in enumerate(steps):
                result.steps_run += 1
                world.trail = []
                try:
                    try:
                        result.lines.append(
                            f"{step.kind}: " + world.step(step.kind, random.Random(step.salt))
                        )
                        _check(world)
                    except Violation:
                        raise
                    except Exception as exc:
                        kind = "unexpected_error" if isinstance(exc, SltsError) else "exception"
                        raise Violation(f"{kind}:{type(exc).__name__}", f"{step.kind} step: {exc!r}") from exc
                except Violation as violation:
                    if violation.kind in ignored_kinds:
                        result.ignored[violation.kind] += 1
                        continue
                    result.violation, result.failed_step = violation, index
                    done = f" [done: {'; '.join(world.trail)}]" if world.trail else ""
                    result.lines.append(f"-> VIOLATION in {step.kind}{done}: {violation}")
                    break
            result.digest = _digest(world)
    finally:
        if world is not None:
            result.faults = world.all_faults()
            result.counters = world.counters
            try:
                world.close()
            except Exception:  # noqa: BLE001 - a broken world may not close cleanly
                pass
        logging.disable(previous)
    return result


def shrink(seed: int, result: SeedResult, runs_max: int = 300, *, ignore: Iterable[str] = ()) -> SeedResult:
    """A shorter program of ``seed`` with a violation of the same kind (drop steps while
    it persists; at most ``runs_max`` re-runs, each with ``ignore`` as the original)."""
    assert result.violation is not None and result.failed_step is not None
    ignore = tuple(ignore)
    kind = result.violation.kind
    program = result.program[: result.failed_step + 1]
    best = run_seed(seed, 0, program=program, ignore=ignore)
    if best.violation is None or best.violation.kind != kind:
        return result  # not reproducible on its own (should not happen: runs are deterministic)
    runs = 0
    chunk = max(1, len(program) // 2)
    while chunk >= 1 and runs < runs_max:
        index = 0
        while index < len(program) and runs < runs_max:
            candidate = program[:index] + program[index + chunk :]
            runs += 1
            attempt = run_seed(seed, 0, program=candidate, ignore=ignore)
            if attempt.violation is not None and attempt.violation.kind == kind:
                assert attempt.failed_step is not None
                program = candidate[: attempt.failed_step + 1]
                best = attempt
            else:
                index += chunk
        chunk //= 2
    return best


@dataclass
class SoakSummary:
    """What a soak did, in figures."""

    seeds: int = 0
    operations: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    counters: Counter[str] = field(default_factory=Counter)
    violations: dict[str, list[int]] = field(default_factory=dict)  # kind -> seeds
    ignored: dict[str, list[int]] = field(default_factory=dict)

    def line(self) -> str:
        faults = " ".join(f"{k}={v}" for k, v in sorted(self.faults.items())) or "none"
        kinds = " ".join(f"{k}={len(v)}" for k, v in sorted(self.violations.items()))
        ignored = sum(len(v) for v in self.ignored.values())
        return (
            f"simulate: seeds {self.seeds}, operations {self.operations}, faults {sum(self.faults.values())} "
            f"({faults}), crashes {self.counters['crashes']}, takeovers {self.counters['takeovers']}, "
            f"restores {self.counters['restores']}, violations "
            f"{sum(len(v) for v in self.violations.values())}"
            + (f" ({kinds})" if kinds else "")
            + (f", ignored {ignored}" if ignored else "")
        )


def _run_one(arguments: tuple[int, int, tuple[str, ...]]) -> SeedResult:
    seed, ops, ignore = arguments
    return run_seed(seed, ops, ignore=ignore)


def soak(
    seeds: Iterable[int],
    ops: int,
    *,
    ignore: Iterable[str] = (),
    progress: Callable[[SeedResult], None] | None = None,
    jobs: int = 1,
) -> SoakSummary:
    """Run every seed of ``seeds`` for ``ops`` steps (in ``jobs`` processes; each seed's
    run is the same wherever it runs, and results are taken in seed order); the summary.
    Raises ``InvalidArgument`` for a seed or ``ops`` below 0 or ``jobs`` below 1 (before any run)."""
    _check_count("jobs", jobs, 1)
    _check_count("ops", ops)
    seeds = list(seeds)
    for seed in seeds:
        _check_count("seed", seed)
    ignore = tuple(ignore)
    summary = SoakSummary()
    work = [(seed, ops, ignore) for seed in seeds]
    if jobs == 1:
        results: Iterable[SeedResult] = map(_run_one, work)
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))
        results = pool.map(_run_one, work, chunksize=1)
    try:
        for result in results:
            summary.seeds += 1
            summary.operations += result.steps_run - (result.violation is not None)
            summary.faults.update(result.faults)
            summary.counters.update(result.counters)
            if result.violation is not None:
                summary.violations.setdefault(result.violation.kind, []).append(result.seed)
            for kind in result.ignored:
                summary.ignored.setdefault(kind, []).append(result.seed)
            if progress is not None:
                progress(result)
    finally:
        if jobs > 1:
            pool.shutdown(cancel_futures=True)
    return summary
