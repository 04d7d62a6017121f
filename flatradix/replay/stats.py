"""Trace statistics without a replay (``flatradix replay --describe``).

Prefix reuse is measured on the trie of block-id sequences: request ``i``
touches one trie node per block of its prompt (the node of that block's whole
prefix), and a touch of a node seen before is a *reuse* (an unbounded prefix
cache could serve that block). For each reuse:

* **request distance**: requests since the previous touch of that prefix;
* **time distance**: seconds since then (trace timestamps);
* **LRU distance**: ``(distinct prefixes touched since then + 1) * block_size``
  tokens: the smallest LRU cache (at block granularity, ignoring requests in
  flight) that still holds the block (Mattson et al., "Evaluation techniques
  for storage hierarchies", IBM Systems Journal 9(2), 1970: the stack
  distance). Counted with a Fenwick tree over touch positions, O(B log B) for
  B touched blocks.
"""

import numpy as np
from numba import njit

from .. import _numba_env  # noqa: F401  (flatradix's Numba cache directory)


def prefix_nodes(workload):
    """Trie node id (``1..``) of every touched block prefix, in arrival order
    (:meth:`Workload.prefix_nodes`), and the request of each touch.

    Returns ``(nodes, request_of)``: int64 ``(total blocks,)`` each.
    """
    request_of = np.repeat(np.arange(len(workload), dtype=np.int64), np.diff(workload.hash_ptr))
    return workload.prefix_nodes(), request_of


@njit(cache=True)
def _reuses(nodes, n_nodes):  # pragma: no cover (compiled)
    m = nodes.size
    last = np.full(n_nodes + 1, -1, np.int64)
    tree = np.zeros(m + 1, np.int64)       # Fenwick tree: 1 at each node's last touch
    prev = np.empty(m, np.int64)
    cur = np.empty(m, np.int64)
    dist = np.empty(m, np.int64)
    k = 0
    for t in range(m):
        x = nodes[t]
        p = last[x]
        if p >= 0:
            # marks at positions p+1 .. t-1: prefix(t - 1) - prefix(p)
            s = 0
            j = t
            while j > 0:
                s += tree[j]
                j -= j & -j
            j = p + 1
            while j > 0:
                s -= tree[j]
                j -= j & -j
            prev[k] = p
            cur[k] = t
            dist[k] = s
            k += 1
            j = p + 1
            while j <= m:
                tree[j] -= 1
                j += j & -j
        j = t + 1
        while j <= m:
            tree[j] += 1
            j += j & -j
        last[x] = t
    return prev[:k], cur[:k], dist[:k]


def _pcts(a, digits=1):
    if a.size == 0:
        return {"p50": None, "p90": None, "p99": None, "max": None}
    p = [float(x) for x in np.percentile(a, [50, 90, 99])] + [float(a.max())]
    r = [round(x) for x in p] if digits == 0 else [round(x, digits) for x in p]
    return dict(zip(("p50", "p90", "p99", "max"), r))


def describe_workload(workload):
    """Statistics of a :class:`~flatradix.replay.trace.Workload` as a JSON-ready dict.

    Keys: ``requests``, ``duration_s`` and ``arrival_rate_per_s`` (``None``
    without timestamps), ``prompt_tokens``, ``output_tokens``,
    ``prompt_length`` / ``output_length`` (tokens: mean, p50, p90, p99, max),
    ``block_size``, ``blocks``, ``distinct_block_ids``, ``distinct_prefixes``,
    ``reused_blocks`` and ``reused_block_ratio`` (block touches that repeat an
    earlier prefix: what an unbounded cache could hit, at block granularity),
    ``reuse_distance`` with ``requests``, ``seconds`` and ``lru_tokens``
    percentiles over the reuses (module docstring).
    """
    w = workload
    n = len(w)
    nodes, req_of = prefix_nodes(w)
    n_nodes = int(nodes.max()) if nodes.size else 0
    prev, cur, dist = _reuses(nodes, n_nodes)
    ts = w.timestamps
    if w.has_timestamps and n:
        duration = float(ts[-1] - ts[0]) / 1e3
        rate = (n / duration) if duration > 0 else None
        secs = (ts[req_of[cur]] - ts[req_of[prev]]) / 1e3
    else:
        duration, rate, secs = None, None, None

    def lengths(a):
        d = _pcts(a, 0)
        d["mean"] = round(float(a.mean()), 1) if a.size else None
        return d

    return {
        "workload": w.name, "format": w.source_format, "requests": n,
        "duration_s": None if duration is None else round(duration, 3),
        "arrival_rate_per_s": None if rate is None else round(rate, 3),
        "prompt_tokens": w.prompt_tokens, "output_tokens": w.output_tokens,
        "prompt_length": lengths(w.input_lengths), "output_length": lengths(w.output_lengths),
        "block_size": w.block_size, "blocks": int(nodes.size),
        "distinct_block_ids": int(np.unique(w.hash_ids).size),
        "distinct_prefixes": n_nodes, "reused_blocks": int(cur.size),
        "reused_block_ratio": (cur.size / nodes.size) if nodes.size else 0.0,
        "reuse_distance": {
            "requests": _pcts(req_of[cur] - req_of[prev], 0),
            "seconds": None if secs is None else _pcts(secs, 1),
            "lru_tokens": _pcts((dist + 1) * w.block_size, 0),
        },
    }


def format_describe(d):
    """The dict of :func:`describe_workload` as text lines."""
    def n(x):
        return "-" if x is None else f"{x:,}"

    def row(name, p, unit=""):
        return (f"  {name:<24}p50 {n(p['p50'])}{unit} | p90 {n(p['p90'])}{unit} | "
                f"p99 {n(p['p99'])}{unit} | max {n(p['max'])}{unit}")

    lines = [f"trace {d['workload']} ({d['format']})",
             f"  requests                {d['requests']:,}"]
    if d["duration_s"] is not None:
        rate = "-" if d["arrival_rate_per_s"] is None else f"{d['arrival_rate_per_s']:.2f}"
        lines.append(f"  arrivals                over {d['duration_s']:,.1f} s ({rate} requests/s)")
    else:
        lines.append("  arrivals                no timestamps (file order)")
    lines += [
        f"  prompt tokens           {d['prompt_tokens']:,} (mean {d['prompt_length']['mean']:,})",
        f"  output tokens           {d['output_tokens']:,} (mean {d['output_length']['mean']:,})",
        row("prompt length", d["prompt_length"], " tok"),
        row("output length", d["output_length"], " tok"),
        f"  blocks                  {d['blocks']:,} of {d['block_size']:,} tokens; "
        f"{d['distinct_block_ids']:,} distinct ids, {d['distinct_prefixes']:,} distinct prefixes",
        f"  reused blocks           {d['reused_blocks']:,} ({100 * d['reused_block_ratio']:.2f} %: "
        f"what an unbounded prefix cache can hit)",
        row("reuse distance", d["reuse_distance"]["requests"], " req"),
    ]
    if d["reuse_distance"]["seconds"] is not None:
        lines.append(row("  in time", d["reuse_distance"]["seconds"], " s"))
    lines.append(row("  LRU capacity to hit", d["reuse_distance"]["lru_tokens"], " tok"))
    return "\n".join(lines)
