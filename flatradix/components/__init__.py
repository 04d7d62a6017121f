"""Component rules: Full, SWA and Mamba as data plus ``@njit`` helpers.

Each component's rules live in one module, under SGLang 0.5.23's hook names
(``unified_cache/components/*.py``) so the two can be read side by side:

============================  ==============================================================
hook                          where the tree kernels call it
============================  ==============================================================
create_match_validator        ``kernels/match.py``: per walked node (a stateful predicate;
                              here a ``validate(..., state) -> (ok, state)`` helper)
redistribute_on_node_split    ``kernels/tree.py: split_node``
update_component_on_insert_   ``kernels/insert.py``: per walked node; returns ``consumed_from``
overlap
commit_insert_component_data  ``kernels/insert.py``: after the new leaf (or the node the key
                              ended on)
eviction_priority             ``PRIORITY_INTERNAL`` below (leaf: 0 for all): cascade eviction
evict_component               ``kernels/evict.py`` and ``kernels/tree.py``
acquire_component_lock /      ``kernels/lock.py``: in component order / in reverse
release_component_lock
============================  ==============================================================

The tree kernels dispatch on the configured set, ``meta[M_COMPONENTS]`` (``C_*``
bits): Numba has no cheap virtual dispatch, and a branch on a bit set costs
nothing measurable. Never a Python hook per node.
"""

from ..kernels.layout import FULL, MAMBA, SWA

#: Cascade priority of each component on an *internal* node (SGLang
#: ``eviction_priority(is_leaf=False)``): evicting component T also evicts every
#: other component with priority <= T's. On an evictable leaf all are 0 (the node
#: is deleted whole).
PRIORITY_INTERNAL = {FULL: 2, SWA: 1, MAMBA: 0}
