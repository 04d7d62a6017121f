"""Every difference between flatradix and SGLang 0.5.23 that the oracle accepts.

The differential driver (``tests/oracle/driver.py``) compares the two engines
after every operation. Anything *not* normalised here must be identical; each
normalisation below says why it is a documented choice and not a bug.

1. **Node ids** (``NodeIdMap``). Ids are opaque handles: flatradix issues
   ``GEN << 32 | slot``, SGLang's Python core a process-global counter, its Rust
   core a per-instance counter. They are compared through a bijection built at
   first appearance: the first time an engine returns a node, the pair is bound;
   every later return must hit the same pair. Because a split keeps the *lower*
   part's id in both engines (docs/architecture.md "split"), this checks node
   identity, not just path equality. Roots are bound at construction and after
   ``reset()``.

2. **KV indices** need no normalisation: the driver hands both engines the
   *same* values from one slot counter and attaches recording allocators
   (``engines.py``) in place of SGLang's ``TokenToKVPoolAllocator`` and
   flatradix's, so freed indices are compared exactly and in order (the order
   is the eviction order; with unique values it pins the sequence of evicted
   nodes). Allocator free-list policies (SGLang appends / prepends pages,
   flatradix uses a stack) therefore never enter the comparison.

3. **KV events, ``extra_key`` namespaces** (``EventHashMap``). flatradix seeds
   an ``extra_key`` namespace's block-hash chain with the namespace
   (``flatradix/events.py``; ``known_bugs.md`` B6), SGLang 0.5.23 publishes the
   plain chain for an ``extra_key`` with no registered LoRA name. For stores in
   such a namespace the driver learns the map flatradix-hash -> SGLang-hash
   (it must stay a function: one flatradix hash never maps to two SGLang
   hashes), and translates parents and removals through it. Plain and
   ``cache_salt``-only namespaces must match bit for bit. Everything else in an
   event (order, merging, tokens, parents, block size, salt, medium) must match.

4. **BlockRemoved batching, Rust core only** (``coalesce_removed``). SGLang's
   Python core (like flatradix) merges every run of consecutive removals into
   one ``BlockRemoved``; its Rust core tags each removal with the node's
   ``extra_key`` and its adapter converts them one by one, so a run that crosses
   namespaces arrives as several events. Same hashes, same order: against the
   Rust core both sides' removal runs are coalesced before comparing; against
   the Python core merging is compared as is.

5. **Event field types**: SGLang's ``medium`` is a ``str`` enum, bigram pages
   are tuples; flatradix uses plain ``str`` and lists. Both become plain
   tuples/strings here.

6. **EAGLE token domain**: flatradix packs a bigram into one int64 unit and
   refuses bigram tokens outside ``[0, 2**31)`` with ``ValueError``
   (``flatradix/_cast.py: key_units``); SGLang accepts any int64. The generator
   keeps EAGLE tokens inside that domain (plain keys use the whole 32-bit range).

7. **A new leaf's hit count after an SWA split, Python core only**
   (``engines._align_python_core_leaf_hit``). SGLang's cores disagree: a new
   leaf counts a hit when it ends past ``inserted_len``; the Rust core (the
   production default) measures its end at the inserted key's end, the Python
   core at ``prefix_len + len(leaf)`` *after* the SWA component split the leaf
   at the request's cursor or to cap it -- short of the key's end by the
   split-off parts. flatradix follows the Rust core (the leaf's data does end at
   the key's end), and the driver runs the Python core with that one rule
   replaced by the Rust core's, so everything else is still compared with both.
   Only FULL+SWA trees split a new leaf; only hit-count policies see the
   difference (found by the campaign at seed 11: p1-swa24-lfu, p64-swa127-slru).

8. **A finished request's ``mamba_pool_idx`` after the tree adopted its state**
   (Mamba request path, ``driver.op_finish``). ``cache_finished_req`` /
   ``release_kv_cache`` of a finished request donates its own state slot to the
   tree. SGLang's ``MambaComponent.cleanup_after_caching_req`` frees it and
   clears ``req.kv.mamba_pool_idx`` only when the node already had a state
   (``mamba_exist``); when the tree took the slot it leaves the field naming it
   -- a reference to a state the request no longer owns, never read again once
   the request is released. flatradix sets the field to None then (the request
   holds nothing). The driver accepts exactly this: flatradix None always;
   SGLang None when the slot was freed in that op, else the request's own slot
   (which must then not have been freed, and the content checks find it in the
   tree). Everything else about a request's state is compared as is: the slot
   each admission draws, the fork each checkpoint allocates (and frees when the
   node already had a state), the frees in order, and that a running request
   keeps its own slot.

Mamba (FULL+MAMBA, FULL+SWA+MAMBA configurations) adds no other normalisation:
state slots are donated to both engines with the same numbers (tree inserts:
``mamba_value``; requests: the recording ``mamba_allocator`` hands both the
same armed slots) and every freed slot is compared in order, like KV indices
(point 2); ``mamba_exist``, ``mamba_branching_seqlen``, ``full_kv_hit_length``
and the Mamba ledgers as is.
SGLang's two cores agree on all of it (``driver.py --first python``). EAGLE with
Mamba is not a normalisation either: SGLang builds no bigram tree when Mamba is
configured (``is_eagle`` ignored), and flatradix must do the same; the driver
then sends plain keys.

Not compared at all (documented in docs/architecture.md "Semantics"):
logical clock values (SGLang's float global counter vs flatradix's integer
ticks; only the *orderings* they induce are observable, through eviction
order), and root recency (the root is never evicted).
"""

from typing import Any, Dict, List, Optional, Tuple


class Divergence(AssertionError):
    """The engines disagree. ``sig`` is a short stable label (used to shrink:
    a smaller op list must reproduce the same label); ``detail`` the values."""

    def __init__(self, sig: str, detail: str):
        super().__init__(f"{sig}: {detail}")
        self.sig = sig
        self.detail = detail


class NodeIdMap:
    """Bijection between flatradix and SGLang node ids, built by first appearance."""

    def __init__(self):
        self.f2s: Dict[int, int] = {}
        self.s2f: Dict[int, int] = {}

    def bind(self, what: str, fid: Any, sid: Any) -> None:
        fid = int(fid)
        sid = int(sid)
        s = self.f2s.get(fid)
        f = self.s2f.get(sid)
        if s is None and f is None:
            self.f2s[fid] = sid
            self.s2f[sid] = fid
            return
        if s != sid or f != fid:
            raise Divergence(f"{what}.node_id",
                             f"flatradix node {fid} (paired with SGLang {s}) vs SGLang node "
                             f"{sid} (paired with flatradix {f})")


def medium_str(m: Any) -> Optional[str]:
    if m is None:
        return None
    return str(getattr(m, "value", m))


def _tokens(tok_list: Any) -> Tuple:
    if len(tok_list) and isinstance(tok_list[0], (tuple, list)):  # EAGLE bigram pages
        return tuple(tuple(t) for t in tok_list)
    return tuple(tok_list)


def event_tuples(events: List[Any]) -> List[Tuple]:
    """Engine events (either implementation's msgspec structs) as plain tuples."""
    out = []
    for ev in events:
        kind = type(ev).__name__
        if kind == "BlockStored":
            out.append(("Stored", tuple(ev.block_hashes), ev.parent_block_hash,
                        _tokens(ev.token_ids), int(ev.block_size), ev.lora_id,
                        medium_str(ev.medium), ev.cache_salt, ev.session_id, ev.lora_name))
        elif kind == "BlockRemoved":
            out.append(("Removed", tuple(ev.block_hashes), medium_str(ev.medium)))
        elif kind == "AllBlocksCleared":
            out.append(("Cleared",))
        else:
            out.append(("Unknown", kind, repr(ev)))
    return out


def coalesce_removed(events: List[Tuple]) -> List[Tuple]:
    """Merge runs of consecutive ``Removed`` tuples with one medium (point 4)."""
    out: List[Tuple] = []
    for ev in events:
        if ev[0] == "Removed" and out and out[-1][0] == "Removed" and out[-1][2] == ev[2]:
            out[-1] = ("Removed", out[-1][1] + ev[1], ev[2])
        else:
            out.append(ev)
    return out


class EventHashMap:
    """Translate flatradix block hashes into SGLang's for ``extra_key`` namespaces
    (normalisation 3 above). One per engine pair."""

    def __init__(self):
        self.map: Dict[int, int] = {}

    def _tr(self, h: Optional[int]) -> Optional[int]:
        if h is None:
            return None
        return self.map.get(h, h)

    def translate(self, fr: List[Tuple], sg: List[Tuple], learn: bool) -> List[Tuple]:
        """Return ``fr`` with hashes translated. ``learn``: the stores of this op are
        in an ``extra_key`` namespace, so store hashes are paired with SGLang's
        (positionally, page by page) instead of being required equal."""
        spages = [h for ev in sg if ev[0] == "Stored" for h in ev[1]] if learn else []
        k = 0  # stored pages seen so far (pairs the k-th page of each engine)
        out = []
        for ev in fr:
            if ev[0] == "Stored":
                parent = self._tr(ev[2])  # the parent was stored (and learned) earlier
                if learn:
                    for fh in ev[1]:
                        if k < len(spages):
                            sh = spages[k]
                            old = self.map.get(fh)
                            if old is not None and old != sh:
                                raise Divergence("events.hash_map", f"flatradix block hash {fh} "
                                                 f"maps to SGLang {old} and {sh}")
                            self.map[fh] = sh
                        k += 1  # a count mismatch is reported by the caller's comparison
                out.append((ev[0], tuple(self._tr(h) for h in ev[1]), parent) + ev[3:])
            elif ev[0] == "Removed":
                hs = tuple(self._tr(h) for h in ev[1])
                for h in ev[1]:  # a removed block is gone; a re-store is learned again
                    self.map.pop(h, None)
                out.append((ev[0], hs) + ev[2:])
            else:
                out.append(ev)
        return out


def compare(sig: str, fr: Any, sg: Any) -> None:
    if fr != sg:
        raise Divergence(sig, f"flatradix={_short(fr)} SGLang={_short(sg)}")


def _short(x: Any, limit: int = 600) -> str:
    s = repr(x)
    return s if len(s) <= limit else s[:limit] + f"... ({len(s)} chars)"
