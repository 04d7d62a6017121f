"""A finished :class:`~flatradix.replay.scheduler.Scheduler` as a
:class:`~flatradix.replay.result.ReplayResult`: the conservation check of every
pool, the notes (rejections, running-slot waits, capped pools), the arrival
mode's waits and timeline, the per-request arrays and the mode's figures."""

import math

import numpy as np

from .result import (MAMBA_MODE, SWA_MAMBA_MODE, SWA_MODE, ReplayResult, _latency, _nice_interval,
                     _pcts_ms, timeline)


def conservation(s):
    """``(conserved, message)``: every pool of ``s`` is available + evictable +
    protected == its size with nothing protected (the host pools: available +
    held by the tree; nothing is in flight at the end); ``message`` names the
    aux pools that break it."""
    cache, sz, cfg = s.cache, s.sizes, s.cfg
    ev, prot = cache.evictable_size(), cache.protected_size()
    conserved = (s.a_avail() + ev + prot == sz.slots) and prot == 0
    msg = ""
    aux = []
    if cfg.swa:
        aux.append(("SWA", s.alloc.swa_available_size(), cache.swa_evictable_size(),
                    cache.swa_protected_size(), sz.swa_slots))
    if cfg.mamba:
        aux.append(("Mamba states", s.req_pool.mamba_allocator.available_size(),
                    cache.mamba_evictable_size(), cache.mamba_protected_size(), sz.m_slots))
    if cfg.host:
        aux.append(("host", cache.mem_pool_host.available_size(), cache.host_total_size(), 0,
                     sz.h_slots))
        if cfg.swa:
            aux.append(("SWA host", cache.swa_pool_host.available_size(),
                        cache.swa_host_total_size(), 0, sz.swa_h_slots))
        if cfg.mamba:
            aux.append(("Mamba host states", cache.mamba_pool_host.available_size(),
                        cache.mamba_host_total_size(), 0, sz.mh_slots))
    for name, x_avail, x_ev, x_prot, x_pool in aux:
        if not (x_avail + x_ev + x_prot == x_pool and x_prot == 0):
            conserved = False
            msg += (f"; {name}: available {x_avail} + evictable {x_ev} + protected {x_prot} "
                    f"!= pool {x_pool}")
    if not conserved:
        msg = (f"KV conservation broken after the replay: available {s.a_avail()} + evictable "
               f"{ev} + protected {prot} != pool {sz.slots}{msg}")
    return conserved, msg


def check(s):
    """``AssertionError`` when a pool of ``s`` is not conserved, or the cache's
    ``sanity_check()`` (when it has one) fails."""
    conserved, msg = conservation(s)
    if not conserved:
        raise AssertionError(msg)
    sanity = getattr(s.cache, "sanity_check", None)
    if sanity is not None:
        sanity()


def _rejection_note(s):
    c, w, slots = s.c, s.workload, s.sizes.slots
    rejected = c.rejected
    sizes = w.input_lengths + w.output_lengths
    too_big = int((sizes > slots).sum())
    what = "1 request" if rejected == 1 else f"{rejected:,} requests"
    if too_big == rejected:
        return (f"{what} rejected: {'it needs' if rejected == 1 else 'each needs'} "
                f"more KV than the whole pool (prompt + output tokens > {slots:,}; "
                f"the largest request needs {int(sizes.max()):,})")
    if s.cfg.swa:
        return (f"{what} rejected: short of KV with nothing running (each request "
                f"needs its uncached prompt + outputs in both pools at admission; the "
                f"SWA pool holds {s.sizes.swa_slots:,} tokens)")
    return f"{what} rejected: short of KV with nothing running"


def arrival_figures(s, served):
    """The arrival mode's ``arrival`` dict (see :func:`~flatradix.replay.sim.replay`)
    of scheduler ``s``; ``served``: bool per request."""
    model, c, n_req = s.cfg.arrival, s.c, len(s.workload)
    arrive, r_decide, r_end = s.arrive_ms, s.r_decide, s.r_end
    wait_ms = r_decide - arrive
    span = float(max(np.nanmax(r_end) if served.any() else 0.0, r_decide.max())
                 - arrive.min()) if n_req else 0.0
    interval = (model.interval_s * 1e3 if model.interval_s is not None
                else _nice_interval(span))
    buckets, peak_run, mean_run = (timeline(arrive, r_decide, r_end, served, interval)
                                   if n_req else ([], 0, 0.0))
    return {
        "prefill_tokens_per_s": model.prefill_tokens_per_s,
        "decode_tokens_per_s": model.decode_tokens_per_s,
        "rate_scale": model.rate_scale, "span_s": round(span / 1e3, 3),
        "peak_running": peak_run, "mean_running": mean_run,
        "waited_requests": int((wait_ms > 0).sum()), "wait_ms": _pcts_ms(wait_ms),
        "kv_waits": int(c.waits), "slot_waits": int(c.slot_waits),
        "interval_s": round(interval / 1e3, 3), "timeline": buckets,
    }


def per_request(s, served):
    """The ``record_requests`` arrays of scheduler ``s`` (see
    :func:`~flatradix.replay.sim.replay`); ``served``: bool per request."""
    cfg, w = s.cfg, s.workload
    r_hit = s.r_hit
    out = {
        "arrival_ms": s.arrive_ms, "prompt_tokens": w.input_lengths.copy(),
        "output_tokens": w.output_lengths.copy(),
        "hit_tokens": np.where(served, r_hit, 0), "evicted_tokens": s.r_evicted,
        "waited": s.r_waited,
        "wait_ms": (s.r_decide - s.arrive_ms) if cfg.timed else np.full(len(w), np.nan),
        "finish_ms": s.r_end, "rejected": ~served,
    }
    if cfg.hybrid:
        # the mode's HybridMode.per_request arrays
        arrays = {"swa_evicted_tokens": s.r_swa_evicted, "mamba_evicted_states": s.r_m_evicted,
                  "full_kv_hit_tokens": np.where(served, s.r_full_hit, 0),
                  "window_lost_hit_tokens": np.where(served, s.r_state_hit - s.r_base, 0),
                  "checkpoint_lost_hit_tokens": np.where(served, s.r_full_hit - s.r_state_hit,
                                                         0)}
        mode = SWA_MAMBA_MODE if cfg.triple else SWA_MODE if cfg.swa else MAMBA_MODE
        out.update((k, arrays[k]) for k in mode.per_request)
    if cfg.host:
        h = s.host
        out.update(
            device_hit_tokens=np.where(served, h.r_dev_hit, 0),
            host_hit_tokens=np.where(served, h.r_host_hit, 0),
            miss_tokens=w.input_lengths - np.where(served, r_hit, 0),
            host_match_tokens=h.r_host_match, declined_host_tokens=h.r_declined)
    return out


def latencies(s):
    """Per-operation latency summaries (µs) of scheduler ``s``, by the mode's ops."""
    cfg = s.cfg
    latency = {"match_prefix": _latency(s.lat_match), "inc_lock_ref": _latency(s.lat_lock),
               "evict": _latency(s.lat_evict), "cache_finished_req": _latency(s.lat_finish)}
    if cfg.extra:
        latency["checkpoint"] = _latency(s.lat_ckpt)
    if cfg.host:
        latency.update(init_load_back=_latency(s.lat_load),
                       loading_check=_latency(s.lat_loading),
                       check_hicache_events=_latency(s.lat_events))
    if cfg.swa:
        latency["evict_sliding_windows"] = _latency(s.lat_slide)
    return latency


def host_fields(s):
    """The host tier's ``ReplayResult`` fields (per component over a hybrid model)."""
    cfg, c, cache, sz, moved = s.cfg, s.c, s.cache, s.sizes, s.moved
    prompt = s.workload.prompt_tokens
    host_total = cache.host_total_size()
    out = dict(
        host_capacity="inf" if cfg.host_capacity == math.inf else int(cfg.host_capacity),
        host_pool_slots=sz.h_slots, write_policy=cfg.write_policy,
        load_back_threshold=cfg.load_back_threshold, device_hit_tokens=int(c.dev_hits),
        host_hit_tokens=int(c.host_hits), miss_tokens=int(prompt - c.hit_tokens),
        device_hit_ratio=c.dev_hits / prompt if prompt else 0.0,
        host_hit_ratio=c.host_hits / prompt if prompt else 0.0,
        load_backs=int(c.load_backs), loaded_tokens=int(c.loaded),
        declined_host_tokens=int(c.declined), load_evicted_tokens=int(c.load_evicted),
        peak_host_tree_tokens=int(c.peak_host), final_host_tree_tokens=int(host_total),
        backed_up_tokens=int(moved["backup"]),
        host_evicted_tokens=int(moved["backup"] - host_total))
    if cfg.swa:
        swa_total = cache.swa_host_total_size()
        out.update(
            swa_host_pool_slots=sz.swa_h_slots, swa_backed_up_tokens=int(moved["backup_swa"]),
            swa_host_loaded_tokens=int(c.swa_loaded),
            swa_host_evicted_tokens=int(moved["backup_swa"] - swa_total),
            load_swa_evicted_tokens=int(c.load_swa_evicted),
            peak_swa_host_tree_tokens=int(c.peak_swa_host),
            final_swa_host_tree_tokens=int(swa_total))
    if cfg.mamba:
        m_total = cache.mamba_host_total_size()
        out.update(
            mamba_host_pool_slots=sz.mh_slots, backed_up_states=int(moved["backup_state"]),
            host_state_loads=int(c.state_loads),
            host_evicted_states=int(moved["backup_state"] - m_total),
            load_evicted_states=int(c.load_m_evicted), peak_host_tree_states=int(c.peak_m_host),
            final_host_tree_states=int(m_total))
    return out


def hybrid_fields(s, notes):
    """The SWA and Mamba modes' ``ReplayResult`` fields (both in the SWA + Mamba
    mode); appends the note of an SWA pool capped by the workload to ``notes``."""
    cfg, c, sz = s.cfg, s.c, s.sizes
    out = {}
    if cfg.swa:
        if not cfg.unbounded and sz.swa_slots < int(int(cfg.capacity) * cfg.swa_ratio) \
                - cfg.page_size:
            notes.append(f"SWA pool sized to {sz.swa_slots:,} tokens: this workload can never "
                         f"use more")
        final_swa = s.swa_size() if cfg.triple else s.total_size()[1]
        out.update(swa_window=cfg.swa_window, swa_ratio=cfg.swa_ratio,
                   swa_pool_slots=sz.swa_slots, swa_evicted_tokens=int(c.swa_evicted),
                   window_lost_hit_tokens=int(c.lost_w), swa_slid_tokens=int(c.slid),
                   peak_swa_tree_tokens=int(c.peak_aux), final_swa_tree_tokens=int(final_swa))
    if cfg.mamba:
        final_m = s.m_size() if cfg.triple else s.total_size()[1]
        out.update(mamba_states=cfg.mamba_states, mamba_pool_slots=sz.m_slots,
                   mamba_chunk=cfg.mamba_chunk, mamba_extra_buffer=cfg.extra,
                   mamba_evicted_states=int(c.m_evicted),
                   checkpoint_lost_hit_tokens=int(c.lost_c), mamba_waits=int(c.m_waits),
                   peak_mamba_tree_states=int(c.peak_m if cfg.triple else c.peak_aux),
                   final_mamba_tree_states=int(final_m))
    return out


def build_result(s, wall, cpu, warmup_s=0.0):
    """The :class:`ReplayResult` of scheduler ``s`` after :meth:`Scheduler.drain`
    (``wall`` / ``cpu``: the loop's seconds; ``warmup_s``: the JIT warm-up's).
    With ``cfg.check``, :func:`check` first."""
    cfg, c, w = s.cfg, s.c, s.workload
    n_req = len(w)
    conserved, _ = conservation(s)
    if cfg.check:
        check(s)
    served = s.r_hit >= 0
    notes = list(s.notes)
    if c.rejected:
        notes.append(_rejection_note(s))
    arrival_d = None
    if cfg.timed:
        arrival_d = arrival_figures(s, served)
        if c.slot_waits:
            times = "once" if c.slot_waits == 1 else f"{c.slot_waits:,} times"
            notes.append(f"admissions waited {times} for a running slot (max running "
                         f"{cfg.max_running:,}): raise --max-running to model a larger batch")
    mode_kw = host_fields(s) if cfg.host else {}
    mode_kw.update(hybrid_fields(s, notes))
    prompt_tokens = w.prompt_tokens
    hit_tokens = c.hit_tokens
    return ReplayResult(
        workload=w.name, capacity="inf" if cfg.unbounded else int(cfg.capacity),
        pool_slots=s.sizes.slots, page_size=cfg.page_size, max_running=cfg.max_running,
        policy=cfg.policy, cache_outputs=bool(cfg.cache_outputs), requests=n_req,
        served_requests=n_req - c.rejected, rejected_requests=c.rejected,
        prompt_tokens=prompt_tokens, output_tokens=w.output_tokens, hit_tokens=int(hit_tokens),
        token_hit_ratio=(hit_tokens / prompt_tokens) if prompt_tokens else 0.0,
        evicted_tokens=int(c.evicted), evict_calls=c.evict_calls, waits=c.waits,
        peak_tree_tokens=int(c.peak), final_tree_tokens=int(s.total_size()[0]),
        kv_conserved=bool(conserved), wall_s=wall, cpu_s=cpu,
        requests_per_s=n_req / wall if wall > 0 else float("inf"),
        prompt_tokens_per_s=prompt_tokens / wall if wall > 0 else float("inf"),
        warmup_s=round(warmup_s, 3), latency_us=latencies(s),
        mode="arrival" if cfg.timed else "order", arrival=arrival_d, notes=notes,
        hits=s.r_hit if cfg.record_hits else None,
        per_request=per_request(s, served) if cfg.record_requests else None, **mode_kw,
    )
