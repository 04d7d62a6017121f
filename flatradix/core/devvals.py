"""Device values (issue 29, ``flatradix/device.py``): claiming an input's tagged rows.

With the device value arena on, the pool's ``FULL_DEV`` column holds each row's
own index (``pool[r, FULL_DEV] == r``) and the KV indices live on the caller's
device at the same rows. A call that writes input values into the pool (an
insert: a new leaf, a host-only node taken over, an SWA tombstone recovered; a
load-back's commit) is given *tags* instead of values, ``TAG + i`` for input
position ``i``; right after it, ``claim_values`` finds the tagged rows, sets them
back to themselves and reports them as runs ``(row, position, length)``, which
the caller copies from the device input into the arena.

Every node such a call writes lies on the path from its deepest written node
(the insert's target, the load-back's anchor) to the root, and is written from
its first row on (a new leaf and a restored node whole, a recovered tombstone
its first ``k`` rows), so the walk checks each path node's first row and scans
only the nodes that carry tags: O(depth + rows written).
"""

from ..kernels._jit import kernel
from ..kernels.layout import F_HAS_FULL_DEV, FLAGS, FULL_DEV, KEY_LEN, KEY_OFF, PARENT, ROOT

#: ``device.TAG`` (kept equal by ``tests/kernels/test_devvals.py``).
TAG = 1 << 48


@kernel
def claim_values(nodes, pool, slot, runs):
    """Claim the tagged rows on the path ``slot`` -> root (see the module docstring).

    ``runs``: int64 ``(cap, 3)`` scratch; rows ``[0, k)`` get ``(row, input
    position, length)``, deepest node first, adjacent pieces merged (a new leaf
    split by the SWA cap is one run). Returns ``k``, or ``-k`` when ``cap < k``:
    then nothing is changed (the caller grows ``runs`` and calls again).
    Nodes without Full device data are skipped (their rows are not read)."""
    for phase in range(2):
        k = 0
        last_row = -1
        last_pos = -1
        s = slot
        while s != ROOT:
            if nodes[s, FLAGS] & F_HAS_FULL_DEV:
                off = nodes[s, KEY_OFF]
                n = nodes[s, KEY_LEN]
                if n > 0 and pool[off, FULL_DEV] >= TAG:
                    # the node's tagged rows: a prefix of its span, in runs of
                    # consecutive positions
                    j = 0
                    while j < n and pool[off + j, FULL_DEV] >= TAG:
                        start = j
                        p0 = pool[off + j, FULL_DEV] - TAG
                        j += 1
                        while (j < n and pool[off + j, FULL_DEV] >= TAG
                               and pool[off + j, FULL_DEV] - TAG == p0 + (j - start)):
                            j += 1
                        ln = j - start
                        row = off + start
                        # runs come deepest first: merge a piece ending where the
                        # previous run (lower rows follow upper ones) begins
                        if k > 0 and row + ln == last_row and p0 + ln == last_pos:
                            if phase == 1:
                                runs[k - 1, 0] = row
                                runs[k - 1, 1] = p0
                                runs[k - 1, 2] += ln
                        else:
                            if phase == 1:
                                runs[k, 0] = row
                                runs[k, 1] = p0
                                runs[k, 2] = ln
                            k += 1
                        last_row = row
                        last_pos = p0
                        if phase == 1:
                            for r in range(row, row + ln):
                                pool[r, FULL_DEV] = r
            s = nodes[s, PARENT]
        if phase == 0 and k > runs.shape[0]:
            return -k
    return k
