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


def run_all(fn, shared, tasks, jobs=1, on_result=None):
    """``[fn(shared, task) for task in tasks]``, in ``jobs`` worker processes when
    ``jobs > 1`` (``fn`` a module-level function; ``shared`` sent to each worker
    once, e.g. the workload). ``on_result(k, result)`` is called in this process as
    each finishes (in completion order). A worker's exception is raised here (the
    pool terminated). Ctrl-C / SIGINT: :class:`Interrupted` with the finished
    results."""
    tasks = list(tasks)
    results = [None] * len(tasks)
    try:
        if jobs <= 1 or len(tasks) <= 1:
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
