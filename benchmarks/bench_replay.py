"""asv: the main job, ``flatradix replay``, end to end.

* ``ReplaySynthetic``: the built-in synthetic workload (3,000 multi-turn chat
  requests over shared system prompts, ~10M prompt tokens) at a 200k-token pool
  (evicting) and unbounded; ``track_hit_ratio`` records the token hit ratio so a
  semantic change shows up next to the timing.
* ``ReplayTrace``: the Mooncake conversation trace (12,031 requests, ~145M
  prompt tokens) at page size 16 and a 2M-token pool, the issue's speed target;
  skipped when ``../shared/traces/`` is absent.

The same replay through SGLang 0.5.23's Rust (and Python) tree core, side by
side with flatradix and with a per-request work check: ``benchmarks/replay_peer.py``.

The workload is built and the kernels JIT-loaded in ``setup``, so a sample
times only the replay (one replay per sample: ``number = 1``). Run outside asv
with ``python benchmarks/bench_replay.py`` for one line per case.
"""

import pathlib
import time

from flatradix.replay import load_mooncake, replay, synthetic_workload

TRACE = (pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "traces"
         / "mooncake_conversation_trace.jsonl")


def _warm():
    replay(synthetic_workload(20), capacity=2_000, max_running=2)


class ReplaySynthetic:
    params = [[200_000, None]]
    param_names = ["capacity"]
    number = 1
    repeat = 3
    timeout = 300

    def setup(self, capacity):
        self.workload = synthetic_workload(3000, seed=0)
        _warm()

    def time_replay_synthetic(self, capacity):
        replay(self.workload, capacity=capacity, page_size=16, max_running=8)

    def track_hit_ratio(self, capacity):
        return replay(self.workload, capacity=capacity, page_size=16,
                      max_running=8).token_hit_ratio

    track_hit_ratio.unit = "ratio"


class ReplayTrace:
    number = 1
    repeat = 1
    timeout = 900

    def setup(self):
        if not TRACE.exists():
            raise NotImplementedError(f"trace not found: {TRACE}")
        self.workload = load_mooncake(TRACE)
        _warm()

    def time_replay_trace_2M(self):
        replay(self.workload, capacity=2_000_000, page_size=16, max_running=1)

    def track_requests_per_s_2M(self):
        return replay(self.workload, capacity=2_000_000, page_size=16,
                      max_running=1).requests_per_s

    track_requests_per_s_2M.unit = "requests/s"


def main():
    _warm()
    cases = [("synthetic", synthetic_workload(3000, seed=0), 200_000, 8),
             ("synthetic", synthetic_workload(3000, seed=0), None, 8)]
    if TRACE.exists():
        t = time.perf_counter()
        w = load_mooncake(TRACE)
        print(f"trace loaded in {time.perf_counter() - t:.2f} s")
        cases += [("mooncake conversation", w, 2_000_000, 1),
                  ("mooncake conversation", w, None, 1)]
    for name, w, cap, mr in cases:
        c0 = time.process_time()
        r = replay(w, capacity=cap, page_size=16, max_running=mr)
        cpu = time.process_time() - c0
        cap_s = "inf" if cap is None else f"{cap:,}"
        print(f"{name:<22} capacity {cap_s:>10}  max_running {mr}: {r.requests:,} requests, "
              f"hit {100 * r.token_hit_ratio:.2f} %, evicted {r.evicted_tokens:,}; "
              f"wall {r.wall_s:.2f} s (cpu {cpu:.2f} s), {r.requests_per_s:,.0f} requests/s")


if __name__ == "__main__":
    main()
