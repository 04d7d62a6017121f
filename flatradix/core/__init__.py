"""The tree core: the entry kernels over the tree arrays (match, insert, locks,
eviction, the host tier's steps, checks, queries) and the tree's structural
operations they share (``tree.py``).

Above the array primitives (``flatradix/kernels/``: layout, slots, children,
heaps, LRU lists, actions, hashing) and the component rules
(``flatradix/components/``, reached through ``components/dispatch.py``); called
only through the engine (``flatradix.engine.Engine.k``). See
``docs/architecture.md`` ("Layers", "The core API").
"""
