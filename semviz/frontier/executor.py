"""Run independent shards of model work in this process, or on Ray workers.

A sweep is many shards that do not talk to each other: a frontier point × a chunk of its
prompts, or a kv-eval text × a cache budget. A :class:`ShardTask` says how a worker gets
ready (``setup``, once, from the loaded model) and how it runs one shard (``run``). The
:class:`Executor` runs the shards and hands each finished result to the caller, who writes
it down at once, so a stop keeps every finished shard.

- ``Executor(task, lm=lm)`` runs them here, one after another, on the model already loaded.
- ``Executor(task, model=ModelSpec(...), workers=N)`` starts a local Ray inside this process
  (``ray.init(num_cpus=N)``) with one actor per worker; ``address=...`` joins an existing
  Ray cluster instead. Each actor loads the model once (one torch thread, or one GPU when the
  cluster has them) and then runs shard after shard. Shards go to whichever actor is free.

Ray is imported only by the second form: without workers nothing of Ray is loaded and no
Ray process starts.

Progress is one number for the whole run: the finished shards' sizes plus, for each shard
in flight, its size times the share its worker reports done. Stop asks every busy worker to
stop at its next check (``should_stop`` of ``run``), cancels the calls still queued, and
drops only the shards in flight.

Examples
--------
>>> class Square(ShardTask):
...     def run(self, state, payload, tick, should_stop):
...         return payload * payload
>>> got = []
>>> Executor(Square(), lm=None).run([Shard(0, 3), Shard(1, 4)], on_result=lambda s, r: got.append(r))
False
>>> got
[9, 16]
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Executor", "ModelSpec", "Shard", "ShardTask", "WorkerInfo"]

POLL_SECONDS = 0.25


@dataclass(frozen=True)
class ModelSpec:
    """How a worker loads the model: the CLI's ``--model``, ``--device`` and ``--dtype``.

    ``threads`` is torch's intra-op thread count in each worker: workers on one machine share
    its cores, and a thread pool per worker that spans every core makes them spin against
    each other.
    """

    name: str | None = None
    device: str | None = None
    dtype: str = "auto"
    threads: int = 1

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ValueError(f"threads must be at least 1, got {self.threads}")

    def load(self):
        import torch

        from semviz.model.load import load_model

        torch.set_num_threads(self.threads)
        return load_model(self.name, dtype=self.dtype, device=self.device)


@dataclass(frozen=True)
class Shard:
    """One independent piece of work: ``payload`` goes to :meth:`ShardTask.run`."""

    key: Any
    payload: Any
    size: float = 1.0  # in the caller's units (rows, tokens): progress adds these up
    label: str = ""


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker's model is, for result keys computed before any shard runs."""

    model: str
    is_chat: bool
    device: str


class ShardTask:
    """What every worker does. Subclass it; instances are pickled to Ray workers."""

    def setup(self, lm) -> Any:
        """Per-worker state, made once from the loaded model (default: the model)."""
        return lm

    def run(
        self,
        state: Any,
        payload: Any,
        tick: Callable[[float], None],
        should_stop: Callable[[], bool],
    ) -> Any | None:
        """Run one shard: call ``tick(share done)`` now and then, return None when stopped."""
        raise NotImplementedError


class Executor:
    """Runs a :class:`ShardTask` over shards, here (``lm``) or on Ray (``workers``/``address``).

    Parameters
    ----------
    task : the work.
    lm : the loaded model, for running here (``workers=None`` and no ``address``).
    model : how Ray workers load the model.
    workers : Ray workers (actors); with no ``address`` a local Ray with that many CPUs starts.
    address : an existing Ray cluster to join (``"auto"`` or ``"host:port"``).
    gpus_per_worker : GPUs each worker asks for; default one GPU each when the cluster (or
        this machine, for a local Ray) has as many, an equal share when workers outnumber
        them, none without GPUs.
    """

    def __init__(
        self,
        task: ShardTask,
        *,
        lm=None,
        model: ModelSpec | None = None,
        workers: int | None = None,
        address: str | None = None,
        gpus_per_worker: float | None = None,
    ) -> None:
        if workers is not None and workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.task = task
        self.lm = lm
        self.model = model or ModelSpec()
        self.remote = workers is not None or address is not None
        self.workers = workers
        self.address = address
        self.gpus = gpus_per_worker
        self._state = None
        self._pool: _RayPool | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers, and the local Ray this executor started (none when in-process)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def _ensure(self) -> None:
        if self.remote:
            if self._pool is None:
                self._pool = _RayPool(self)
        elif self._state is None:
            if self.lm is None and type(self.task).setup is not ShardTask.setup:
                self.lm = self.model.load()
            self._state = self.task.setup(self.lm)

    def info(self) -> WorkerInfo:
        """The workers' model (one worker asked; every worker loads the same spec)."""
        self._ensure()
        if self._pool is not None:
            return self._pool.info()
        return _info(self.lm)

    # -- running ---------------------------------------------------------------------------

    def run(
        self,
        shards: Sequence[Shard],
        *,
        on_result: Callable[[Shard, Any], None],
        on_progress: Callable[[float, float, str], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> bool:
        """Run every shard; ``on_result(shard, result)`` as each finishes (in any order on Ray).

        ``on_progress(done, total, label)`` reports the sizes done, in-flight shares
        included. Returns True when stopped (the shards in flight then give no result).
        """
        shards = list(shards)
        stop = should_stop or (lambda: False)
        total = float(sum(s.size for s in shards))
        if not shards:
            return False
        self._ensure()
        if self._pool is not None:
            return self._pool.run(shards, total, on_result, on_progress, stop)
        done = 0.0
        for s in shards:

            def tick(share: float, _s=s, _base=done) -> None:
                if on_progress is not None:
                    on_progress(_base + _s.size * min(max(share, 0.0), 1.0), total, _s.label)

            res = self.task.run(self._state, s.payload, tick, stop)
            if res is None:
                return True
            on_result(s, res)
            done += s.size
            if on_progress is not None:
                on_progress(done, total, s.label)
        return False


def _info(lm) -> WorkerInfo:
    return WorkerInfo(model=lm.name, is_chat=bool(lm.is_chat), device=str(lm.device))


# -- Ray --------------------------------------------------------------------------------------


class _Worker:
    """A Ray actor's body: the model loaded once, then one shard at a time.

    Created with ``max_concurrency=2`` so :meth:`progress` and :meth:`stop` are answered
    while :meth:`run` works in the other thread.
    """

    def __init__(self, task: ShardTask, model: ModelSpec) -> None:
        os.environ.setdefault("OMP_NUM_THREADS", str(model.threads))
        self.lm = model.load()
        self.task = task
        self.state = task.setup(self.lm)
        self.share = 0.0
        self.stopping = False
        self.lock = threading.Lock()

    def info(self) -> WorkerInfo:
        return _info(self.lm)

    def run(self, payload: Any) -> Any | None:
        with self.lock:  # one shard at a time, whatever the actor's concurrency
            self.share, self.stopping = 0.0, False

            def tick(share: float) -> None:
                self.share = share

            return self.task.run(self.state, payload, tick, lambda: self.stopping)

    def progress(self) -> float:
        return self.share

    def stop(self) -> None:
        self.stopping = True


def _package_dir() -> str:
    return str(Path(__file__).resolve().parents[1])


class _RayPool:
    """Actors on a local or joined Ray cluster, each running one shard at a time."""

    def __init__(self, ex: Executor) -> None:
        import ray  # only here: a run without workers never imports Ray

        self.ray = ray
        self.started = False
        if not ray.is_initialized():
            kw: dict = {"include_dashboard": False, "log_to_driver": False}
            if ex.address is not None:
                # the cluster's nodes may not have this copy of semviz: ship the package
                ray.init(address=ex.address, runtime_env={"py_modules": [_package_dir()]}, **kw)
            else:
                ray.init(num_cpus=ex.workers, **kw)
            self.started = True
        res = ray.cluster_resources()
        n_gpu = float(res.get("GPU", 0))
        # default: a worker per GPU, or per CPU on a cluster without GPUs
        n = ex.workers or max(int(n_gpu if n_gpu >= 1 else res.get("CPU", 1)), 1)
        gpus = ex.gpus
        if gpus is None:  # the cluster's GPUs decide, not this (maybe GPU-less) driver's
            gpus = min(1.0, n_gpu / n) if n_gpu >= 1 else 0.0  # more workers than GPUs share
        cls = ray.remote(_Worker).options(num_cpus=1, num_gpus=gpus, max_concurrency=2)
        self.actors = [cls.remote(ex.task, ex.model) for _ in range(n)]

    def info(self) -> WorkerInfo:
        return self.ray.get(self.actors[0].info.remote())

    def run(self, shards, total, on_result, on_progress, stop) -> bool:
        ray = self.ray
        queue = list(shards)
        free = list(self.actors)
        busy: dict = {}  # ObjectRef -> (actor, shard)
        done = 0.0
        stopped = False
        last = 0.0
        while queue or busy:
            if not stopped and stop():
                stopped = True
                queue.clear()
                for actor, _ in busy.values():
                    actor.stop.remote()
            while queue and free:
                actor, shard = free.pop(), queue.pop(0)
                busy[actor.run.remote(shard.payload)] = (actor, shard)
            ready, _ = ray.wait(list(busy), num_returns=1, timeout=POLL_SECONDS)
            for ref in ready:
                actor, shard = busy.pop(ref)
                free.append(actor)
                res = ray.get(ref)
                if res is None:  # this worker was stopped mid-shard
                    stopped = True
                    continue
                on_result(shard, res)
                done += shard.size
            if on_progress is not None and busy and time.monotonic() - last >= POLL_SECONDS:
                last = time.monotonic()
                shares = ray.get([a.progress.remote() for a, _ in busy.values()])
                running = sum(
                    s.size * min(max(p, 0.0), 1.0)
                    for (_, s), p in zip(busy.values(), shares, strict=True)
                )
                label = f"{len(busy)} shards running on {len(self.actors)} workers"
                on_progress(done + running, total, label)
            elif on_progress is not None and ready:
                on_progress(done, total, f"{len(busy)} shards running")
        return stopped

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)
        self.actors = []
        if self.started:
            self.ray.shutdown()
