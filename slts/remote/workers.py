"""Where ``slts.remote`` runs work beside the calling thread.

The copy task inspects the next segment while it writes this one, and the RSM writes a
segment's files side by side: each through an executor from ``executor``. With
``threads=False`` the executor runs every task at once in the calling thread, in
submission order: the same work without a thread schedule, so that a seeded simulation of
the remote tasks replays exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

_P = ParamSpec("_P")
_T = TypeVar("_T")


class InlineExecutor(Executor):
    """Runs each task when it is submitted, in the caller's thread; its future is done on
    return (with the task's result or exception)."""

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        future: Future[_T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
            future.set_exception(exc)
        return future


def executor(workers: int, name: str, *, threads: bool) -> Executor:
    """A pool of ``workers`` threads named ``name``-N, or an ``InlineExecutor``."""
    assert workers >= 1, workers
    return ThreadPoolExecutor(workers, thread_name_prefix=name) if threads else InlineExecutor()


__all__ = ["InlineExecutor", "executor"]
