"""Trace replay: the project's main job (``flatradix replay``).

Replays request workloads through ``flatradix.UnifiedRadixCache`` the way a
serving scheduler drives it (match, lock, allocate, evict, cache the finished
request), through the public API only, and reports hit ratio, evictions and
per-operation latency.

* ``trace``: :func:`load_trace` (Mooncake and generic JSONL),
  :func:`load_mooncake` and :func:`synthetic_workload`
* ``sim``: :func:`replay`, the scheduler emulation (order or arrival mode:
  :class:`ArrivalModel`; a full-attention model, a hybrid sliding-window one:
  ``swa_window``, a hybrid SSM one: ``mamba_states``, served with SGLang's Mamba
  extra buffer: ``mamba_extra_buffer=True`` too, or one with both kinds of
  layers: both; a host tier, SGLang's HiCache: ``host_capacity``); the model
  of each mode is its docstring
* ``config``: :class:`ReplayConfig` (a replay's options, checked) and the pool
  sizes; ``scheduler``: :class:`Scheduler` (one engine: admit / complete /
  evict / drain) and ``modes`` its per-mode strategies; ``outcome`` and
  ``result``: :class:`ReplayResult`
* ``sweep``: capacity :func:`sweep` (several policies, in processes; a device
  x host grid with ``host_capacities``); ``report``: text report and CSV files;
  ``plot``: the plot (a heatmap for the grid)
* ``model``: KV bytes per token from a ``config.json`` (:class:`KVLayout`)
* ``stats``: trace statistics without a replay (:func:`describe_workload`)
"""

from .model import (KVLayout, ModelConfigError, format_bytes, kv_layout_from_dict,
                    load_model_config, parse_memory, swa_tokens_for_memory, tokens_for_memory)
from .report import (format_report, format_sweep, parse_capacity, plot_sweep, sweep,
                     write_per_request_csv, write_runs_csv, write_sweep_csv)
from .config import ReplayConfig
from .scheduler import Scheduler
from .sim import (ArrivalModel, ReplayResult, default_cache_factory, replay, swa_pool_slots,
                  timeline, unbounded_pool_slots)
from .stats import describe_workload, format_describe
from .trace import (TraceFormatError, Workload, load_mooncake, load_trace,
                    synthetic_workload)

__all__ = [
    "Workload", "TraceFormatError", "load_trace", "load_mooncake", "synthetic_workload",
    "replay", "ReplayConfig", "Scheduler", "ArrivalModel", "ReplayResult",
    "default_cache_factory", "unbounded_pool_slots", "timeline", "sweep", "format_report", "format_sweep", "parse_capacity", "plot_sweep",
    "write_sweep_csv", "write_runs_csv", "write_per_request_csv", "KVLayout",
    "ModelConfigError", "load_model_config", "kv_layout_from_dict", "parse_memory",
    "format_bytes", "tokens_for_memory", "swa_tokens_for_memory", "swa_pool_slots",
    "describe_workload", "format_describe",
]
