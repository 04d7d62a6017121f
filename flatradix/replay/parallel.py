"""Independent runs (sweep points), in this process or in a pool of worker
processes, stopped cleanly by Ctrl-C / SIGINT.

:func:`run_all` calls ``fn(shared, task)`` for each task and returns the results
in task order. Interrupted, it raises :class:`Interrupted` (a
``KeyboardInterrupt``) at once, carrying the results that finished (``None``
for the others): the pool's workers ignore SIGINT (a terminal's Ctrl-C reaches
the whole process group) and are terminated, not waited for, so the process
exits within a moment whatever is still running or queued.
"""

import signal

_fn = _shared = None


class Interrupted(KeyboardInterrupt):
    """Ctrl-C / SIGINT stopped a batch of runs. ``results``: one per task, ``None``
    for those that did not finish; ``partial``: what the caller made of the
    finished ones (e.g. a sweep's curve marked partial), or ``None``."""

    def __init__(self, results, partial=None):
        super().__init__()
        self.results = results
        self.partial = partial

    @property
    def finished(self):
        """How many runs finished."""
        return sum(r is not None for r in self.results)


def _init_worker(fn, shared):
    # the parent handles Ctrl-C (and terminates the pool); a worker ignores it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    global _fn, _shared
    _fn, _shared = fn, shared


def _call(item):
    k, task = item
    return k, _fn(_shared, task)


def run_all(fn, shared, tasks, jobs=1, on_result=None, backend=None):
    """``[fn(shared, task) for task in tasks]``, in ``jobs`` worker processes when
    ``jobs > 1`` (``fn`` a module-level function; ``shared`` sent to each worker
    once, e.g. the workload). ``on_result(k, result)`` is called in this process as
    each finishes (in completion order). A worker's exception is raised here (the
    pool terminated). Ctrl-C / SIGINT: :class:`Interrupted` with the finished
    results.

    ``backend``: ``(name, address)`` to run the tasks through joblib instead
    (``flatradix[cluster]``): ``("loky", None)`` its local process pool;
    ``("dask", address)`` a running Dask distributed scheduler (``address``, else
    ``$DASK_SCHEDULER_ADDRESS``; neither: ``ValueError``); ``("ray", address)`` a
    running Ray cluster (``ray.init(address)``, default ``"auto"``; not tested
    here: ray is not installed in CI). The results are the same; ``shared`` then
    travels with each task. A cluster's workers are not in this terminal's
    process group: Ctrl-C reaches this process alone, which drops the pending
    tasks and returns at once (tasks already running may finish on the cluster).
    A local cluster is not started here: on one machine the process pool
    (``jobs``) does the same."""
    tasks = list(tasks)
    results = [None] * len(tasks)
    try:
        if backend is not None:
            _joblib(fn, shared, tasks, max(1, jobs), results, on_result, backend)
        elif jobs <= 1 or len(tasks) <= 1:
            for k, task in enumerate(tasks):
                results[k] = fn(shared, task)
                if on_result is not None:
                    on_result(k, results[k])
        else:
            _pool(fn, shared, tasks, min(jobs, len(tasks)), results, on_result)
    except KeyboardInterrupt:
        raise Interrupted(results) from None
    return results


def _pool(fn, shared, tasks, workers, results, on_result):
    import multiprocessing

    pool = multiprocessing.Pool(workers, initializer=_init_worker, initargs=(fn, shared))
    try:
        for k, r in pool.imap_unordered(_call, list(enumerate(tasks))):
            results[k] = r
            if on_result is not None:
                on_result(k, r)
        pool.close()
    except BaseException:
        pool.terminate()    # running and queued runs are dropped, not waited for
        raise
    finally:
        pool.join()


def _call_with(fn, shared, k, task):
    return k, fn(shared, task)


#: Why ``("dask", None)`` is refused.
DASK_ADDRESS = ("the dask backend runs on a running Dask scheduler: give its address "
                "(dask:tcp://host:8786) or set DASK_SCHEDULER_ADDRESS; on this machine alone, "
                "--jobs N runs the points in N processes")


def _joblib(fn, shared, tasks, jobs, results, on_result, backend):
    import contextlib
    import os

    name, address = backend
    try:
        import joblib
    except ImportError:
        raise RuntimeError(f"the {name} backend runs through joblib: pip install "
                           f"'flatradix[cluster]'") from None
    with contextlib.ExitStack() as stack:
        if name == "dask":
            try:
                from dask.distributed import Client
            except ImportError:
                raise RuntimeError("the dask backend needs dask.distributed: pip install "
                                   "'flatradix[dask]'") from None
            address = address or os.environ.get("DASK_SCHEDULER_ADDRESS")
            if not address:
                raise ValueError(DASK_ADDRESS)
            stack.callback(Client(address).close)
        elif name == "ray":
            try:
                import ray
                from ray.util.joblib import register_ray
            except ImportError:
                raise RuntimeError("the ray backend needs ray: pip install 'flatradix[ray]'") \
                    from None
            register_ray()
            if not ray.is_initialized():
                ray.init(address=address or "auto")
                stack.callback(ray.shutdown)
        stack.enter_context(joblib.parallel_config(backend=name, n_jobs=jobs))
        run = joblib.Parallel(return_as="generator_unordered")
        for k, r in run(joblib.delayed(_call_with)(fn, shared, k, t)
                        for k, t in enumerate(tasks)):
            results[k] = r
            if on_result is not None:
                on_result(k, r)
