"""Long-lived worker processes that run the measurements, so no number includes process start-up.

`WorkerPool(size, redis_url)` spawns `size` processes. Each one sets up Django with the bench
settings (bench/httpapp/settings.py, pointed at the benchmark's own Redis), builds one redis-py
client, and then runs tasks: `pool.run({worker: ("module:function", kwargs), ...})` calls
`function(state, **kwargs)` in each named worker and returns their results in worker order. A task
that raises makes `run` raise `WorkerError` with the worker's traceback.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import traceback
from dataclasses import dataclass, field
from multiprocessing.queues import Queue
from typing import Any

from bench.limiters import Context, Limiter, Rate
from bench.peers import build

SETTINGS_MODULE = "bench.httpapp.settings"
_spawn = multiprocessing.get_context("spawn")


class WorkerError(RuntimeError):
    """A task failed in a worker process; the message carries the worker's traceback."""


@dataclass
class WorkerState:
    """What a task sees in its worker: its index, the Redis context and the limiters built so far."""

    index: int
    ctx: Context
    limiters: dict[tuple[str, Rate], Limiter] = field(default_factory=dict)

    def limiter(self, key: str, rate: Rate) -> Limiter:
        """The limiter of variant `key` at `rate`, built on first use and kept for later tasks."""
        found = self.limiters.get((key, rate))
        if found is None:
            found = self.limiters[(key, rate)] = build(key, rate, self.ctx)
        return found


def _worker_main(index: int, redis_url: str, tasks: Queue[Any], results: Queue[Any]) -> None:
    os.environ["BENCH_REDIS_URL"] = redis_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", SETTINGS_MODULE)
    import django
    import redis

    django.setup()
    client = redis.Redis.from_url(redis_url, socket_timeout=10, socket_connect_timeout=5)
    state = WorkerState(index, Context(redis_url, client))
    results.put((index, True, "ready"))
    while True:
        task = tasks.get()
        if task is None:
            break
        target, kwargs = task
        try:
            module_name, function_name = target.split(":")
            function = getattr(importlib.import_module(module_name), function_name)
            results.put((index, True, function(state, **kwargs)))
        except Exception:  # report every failure to the coordinator instead of dying silently
            results.put((index, False, traceback.format_exc()))
    client.close()


class WorkerPool:
    """`size` spawned worker processes talking to the Redis at `redis_url` (see the module docstring)."""

    def __init__(self, size: int, redis_url: str, timeout: float = 120.0) -> None:
        self.size = size
        self.timeout = timeout
        self._results: Queue[Any] = _spawn.Queue()
        self._tasks: list[Queue[Any]] = [_spawn.Queue() for _ in range(size)]
        self._processes = [
            _spawn.Process(target=_worker_main, args=(i, redis_url, self._tasks[i], self._results), daemon=True)
            for i in range(size)
        ]
        for process in self._processes:
            process.start()
        self._collect(set(range(size)))

    def run(self, assignments: dict[int, tuple[str, dict[str, Any]]]) -> list[Any]:
        """Run one task per named worker at once; their results, ordered by worker index."""
        for index, task in assignments.items():
            self._tasks[index].put(task)
        results = self._collect(set(assignments))
        return [results[index] for index in sorted(results)]

    def run_all(self, target: str, kwargs: dict[str, Any], workers: int | None = None) -> list[Any]:
        """Run the same task on the first `workers` workers (all by default)."""
        count = self.size if workers is None else workers
        return self.run({i: (target, {**kwargs, "worker": i}) for i in range(count)})

    def _collect(self, pending: set[int]) -> dict[int, Any]:
        results: dict[int, Any] = {}
        failures: list[str] = []
        while pending:
            try:
                index, ok, payload = self._results.get(timeout=self.timeout)
            except Exception as exc:
                raise WorkerError(f"workers {sorted(pending)} did not answer within {self.timeout}s") from exc
            pending.discard(index)
            if ok:
                results[index] = payload
            else:
                failures.append(f"worker {index}:\n{payload}")
        if failures:
            raise WorkerError("\n".join(failures))
        return results

    def close(self) -> None:
        """Stop every worker (they finish their current task first)."""
        for queue in self._tasks:
            queue.put(None)
        for process in self._processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
                process.join()
