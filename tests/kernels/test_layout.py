"""The generated node-table and meta numbering: no overlap, hot columns in lines 0-1."""

from flatradix.kernels import layout as L


def _spans(fields, index):
    return [(name, index[name], index[name] + width) for name, width in fields]


def test_node_columns_do_not_overlap_and_fit():
    spans = _spans(L.NODE_COLUMNS, L._COL)
    used = set()
    for name, lo, hi in spans:
        cols = set(range(lo, hi))
        assert not cols & used, f"column {name} overlaps"
        used |= cols
        assert hi <= L.NCOL
    assert L.NCOL % 8 == 0  # whole 64-byte lines per row
    # every constant the kernels import equals the generated index
    for name, lo, _ in spans:
        assert getattr(L, name) == lo


def test_hot_columns_stay_in_the_first_two_cache_lines():
    index = dict((n, (L._COL[n], L._COL[n] + w)) for n, w in L.NODE_COLUMNS)
    for name in L.HOT_COLUMNS:
        lo, hi = index[name]
        assert hi <= 16, f"{name} spills out of lines 0-1 (cols {lo}..{hi - 1})"


def test_meta_fields_do_not_overlap_and_fit():
    used = set()
    for name, lo, hi in _spans(L.META_FIELDS, L._META):
        cols = set(range(lo, hi))
        assert not cols & used, f"meta {name} overlaps"
        used |= cols
        assert hi <= L.META_LEN
        assert getattr(L, "M_" + name) == lo


def test_per_component_and_tier_indices_are_distinct():
    locks = {L.LOCK_COL(c, t) for c in range(L.N_COMPONENTS) for t in range(L.N_TIERS)}
    assert len(locks) == L.N_COMPONENTS * L.N_TIERS
    assert locks == set(range(L.LOCK_REF, L.LOCK_REF + L.N_COMPONENTS * L.N_TIERS))
    bits = [L.F_HAS(c, t) for c in range(L.N_COMPONENTS) for t in range(L.N_TIERS)]
    assert len(set(bits)) == len(bits) and L.F_ALIVE not in bits
    assert L.F_HAS_FULL_DEV == L.F_HAS(L.FULL) and L.F_HAS_SWA_DEV == L.F_HAS(L.SWA)
    lists = {L.LRU_ID(c) for c in (L.SWA, L.MAMBA)}
    assert lists == set(range(L.N_LRU))
    # host-tier lists are not built: their sentinel rows are reserved, no link columns
    assert L.N_SENTINELS == 2 * (L.N_COMPONENTS - 1) * L.N_TIERS >= 2 * L.N_LRU
    assert L.F_HAS_FULL_HOST == L.F_HAS(L.FULL, L.HOST)
    assert L.FULL_HOST_LOCK == L.LOCK_COL(L.FULL, L.HOST)
    assert L.FULL_LOCK == L.LOCK_COL(L.FULL) and L.SWA_LOCK == L.LOCK_COL(L.SWA)


def test_sentinel_slots_sit_between_the_root_and_the_first_node_slot():
    assert L.ROOT < L.SENTINEL0 and L.SENTINEL0 + L.N_SENTINELS == L.FIRST_SLOT
