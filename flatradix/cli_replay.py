"""``flatradix replay``: its argument parser, the option checks, the KV sizing
(tokens from memory sizes and a model's config.json) and the runs (one replay
per policy and series value, or a sweep), with their outputs.

A user's mistake raises :class:`~flatradix.cli_options.UsageError` (one line,
exit status 2, reported by :func:`flatradix.cli.main`); output paths are
checked before anything runs.
"""

import os

from . import cli_options as options
from .cli_fleet import check_fleet, fleet_options
from .cli_options import UsageError
from .cli_output import Outputs, emit_runs, keep_partial


def add_parser(sub):
    """Add the ``replay`` subcommand to ``sub`` (argparse subparsers); returns its parser."""
    r = sub.add_parser(
        "replay", help="replay a request trace through the prefix cache",
        description=(
            "Replay requests through flatradix.UnifiedRadixCache as a scheduler drives it: "
            "match_prefix, inc_lock_ref, allocate the uncached tail and the outputs "
            "(evicting when short; a request that cannot fit even then is rejected), "
            "cache_finished_req on completion (the prompt is cached; outputs are not). "
            "Without --trace, a built-in deterministic synthetic workload is used "
            "(multi-turn chats over shared system prompts). Errors are one line on stderr "
            "with exit status 2."),
        epilog=("stdout gets a text report (one per policy) or, with --sweep, a table; "
                "--json prints JSON instead. --out/--csv/--per-request/--plot write files, "
                "checked before anything runs."))
    for add in (_workload_options, _cache_options, _swa_options, _mamba_options, _host_options,
                _scheduling_options, fleet_options, _sweep_options, _output_options):
        add(r)
    r.set_defaults(subparser=r)
    return r


def _workload_options(r):
    """The trace (or the synthetic workload) and what to do with it."""
    g = r.add_argument_group("workload")
    g.add_argument("--trace", metavar="FILE|NAME",
                   help="JSONL trace, plain or .gz/.bz2/.xz: Mooncake (timestamp, "
                        "input_length, output_length, hash_ids) or generic (token_ids, or "
                        "hash_ids + block size; docs/replay.md); or a named trace: "
                        "mooncake:sample (500 requests, packaged), mooncake:conversation "
                        "(12,031 requests, downloaded once); default: the synthetic workload")
    g.add_argument("--format", choices=("auto", "mooncake", "generic"), default=None,
                   help="trace format (default: auto, from the first line)")
    g.add_argument("--block-size", type=options.positive_int, default=None, metavar="B",
                   help="tokens per hash id (default: 512 for a Mooncake trace, 16 for the "
                        "synthetic workload)")
    g.add_argument("--limit", type=options.positive_int, default=None, metavar="N",
                   help="replay only the first N requests (synthetic: generate N; default 3000)")
    g.add_argument("--seed", type=options.nonnegative_int, default=None,
                   help="synthetic workload seed (default: 0)")
    g.add_argument("--describe", action="store_true",
                   help="print the trace's statistics (requests, prompt-length percentiles, "
                        "prefix reuse distance) and the KV sizing; no replay")


def _cache_options(r):
    """The cache and the size of its KV pool."""
    g = r.add_argument_group("cache and KV memory")
    g.add_argument("--page-size", type=options.positive_int, default=None, metavar="P",
                   help="cache page size (default: 16; with --mamba-states 1, the only one "
                        "it takes without --mamba-extra-buffer)")
    g.add_argument("--capacity", type=options.capacity, default=None, metavar="TOKENS|inf",
                   help="KV pool size in tokens (2000000, 2M, 500k) or inf (default: inf)")
    g.add_argument("--kv-memory", type=options.memory, default=None, metavar="SIZE",
                   help="KV pool size in memory (40GiB, 80GB): tokens = SIZE / KV bytes per "
                        "token, whole pages; needs --model-config or --kv-bytes-per-token")
    g.add_argument("--model-config", metavar="PATH",
                   help="a local Hugging Face config.json (or its directory): KV bytes per "
                        "token of the full-attention layers = 2 x layers x KV heads x head "
                        "dim x dtype bytes; sliding-window and Mamba layers are reported")
    g.add_argument("--kv-bytes-per-token", type=options.positive_int, default=None, metavar="N",
                   help="KV bytes per token, given directly")
    g.add_argument("--kv-dtype", default=None, metavar="DTYPE",
                   help="attention KV cache dtype for --model-config: bfloat16, float16, "
                        "float32, fp8_e4m3... (default: the config's torch_dtype); not the "
                        "Mamba state's (--mamba-ssm-dtype)")
    g.add_argument("--policy", type=options.policies, action="append", default=None,
                   metavar="P[,P...]",
                   help=f"eviction policy, any case; several (comma-separated or repeated) run "
                        f"once each: {', '.join(options.POLICIES)} (default: lru). opt: Belady's "
                        f"offline optimum (evict the page used farthest ahead; proven optimal "
                        f"one request at a time, docs/replay.md; Full attention only); with "
                        f"--sweep, the gap to the unbounded ceiling is split into capacity "
                        f"and policy")
    g.add_argument("--cache-outputs", action="store_true",
                   help="also insert output tokens (fresh ids that never match)")
    g.add_argument("--check", action="store_true",
                   help="after each run, also check the tree's invariants (the cache's "
                        "sanity_check; its kernels add ~10 s to a first run's compile). KV "
                        "conservation is always checked and reported")


def _swa_options(r):
    """The SWA mode (a hybrid sliding-window model)."""
    g = r.add_argument_group(
        "sliding-window attention (SWA)",
        "Replay as a hybrid sliding-window model (Gemma-3, gpt-oss) is served: a full-attention "
        "pool (--capacity / --kv-memory) and an SWA pool of R x its tokens, the cache's SWA "
        "component, each request's window sliding as it decodes. Reports the evictions of both "
        "pools and the hit tokens lost to the window (Full KV cached, its SWA KV dropped). "
        "With --mamba-states: the SWA + Mamba mode (below).")
    g.add_argument("--swa-window", type=options.swa_windows, default=None, metavar="W[,W...]|model",
                   help="sliding window in tokens; several run once each (a sweep over W); "
                        "'model': the sliding_window of --model-config")
    g.add_argument("--swa-ratio", type=options.swa_ratio, default=None, metavar="R",
                   help="SWA pool = R x full pool tokens, 0 < R <= 1 (SGLang's "
                        "--swa-full-tokens-ratio; default 0.8, its default). With "
                        "--model-config, --kv-memory buys full tokens = SIZE / (full bytes + R x "
                        "SWA bytes per token)")


def _mamba_options(r):
    """The Mamba modes (a hybrid SSM model)."""
    g = r.add_argument_group(
        "Mamba / SSM hybrid models",
        "Replay as a hybrid SSM model (Qwen3-Next, Nemotron-H) is served by SGLang without the "
        "Mamba extra buffer: page size 1, the cache's Mamba component, a state pool of N slots; "
        "each request matches its prompt less the last token, as SGLang's scheduler does (so a "
        "repeated prompt never reaches the state its twin left at the prompt's end), takes a "
        "state slot (evicting a cached state, or waiting for a running request when none is "
        "left) and donates it to the tree when it finishes. Reports the hit tokens lost to "
        "checkpoint granularity (Full KV of that match cached, no state at its end), the "
        "states evicted and the peak states in the tree. --capacity / --kv-memory size the "
        "full-attention pool only; the state pool is N states on top (its bytes are reported "
        "when --model-config gives them). With --swa-window too: a model with both kinds of "
        "layers, the (FULL, SWA, MAMBA) cache at page 1, both modes' pools, steps and figures "
        "(the hits lost split between the window and checkpoint granularity); several windows "
        "or several state counts, not both. With --mamba-extra-buffer: served with SGLang's "
        "Mamba extra buffer instead, at any page size (default 16): each running request "
        "holds 3 state slots, its prefill and decode track states every lcm(chunk, page) "
        "tokens, and a checkpoint after each prefill caches the prompt up to its tracked "
        "state (not with --swa-window).")
    g.add_argument("--mamba-states", type=options.mamba_states, default=None, metavar="N[,N...]",
                   help="Mamba state pool in states (SGLang's mamba pool size); several run "
                        "once each")
    g.add_argument("--mamba-extra-buffer", action="store_true",
                   help="with --mamba-states (at least 4): serve with SGLang's Mamba extra "
                        "buffer (ping-pong track slots), at any --page-size; not with "
                        "--swa-window")
    g.add_argument("--mamba-chunk", type=options.mamba_chunk, default=None, metavar="C",
                   help="SGLang's mamba_cache_chunk_size, 1 to 2**62 - 1 (default 64); without "
                        "the extra buffer it only moves MatchResult.mamba_branching_seqlen, "
                        "which the replay does not use, so the figures do not depend on it; "
                        "with it, states are tracked every lcm(C, page size) tokens")
    g.add_argument("--mamba-ssm-dtype", choices=("float32", "bfloat16", "float16"),
                   default=None,
                   help="with --model-config: the SSM state's dtype in the reported state "
                        "bytes, as SGLang's --mamba-ssm-dtype (default: the config's "
                        "mamba_ssm_dtype, else float32, as SGLang); the conv state is bfloat16 "
                        "(SGLang's SGLANG_MAMBA_CONV_DTYPE default); --kv-dtype applies to "
                        "neither")


def _host_options(r):
    """The host tier (SGLang's HiCache)."""
    g = r.add_argument_group(
        "host tier (HiCache)",
        "Replay with SGLang's HiCache: a host KV pool behind the device pool. Finished "
        "prompts are backed up to the host (write_through: at a node's first hit, "
        "write_through_selective: at its second), device eviction keeps a backed-up prefix on "
        "the host, and a request whose match continues on the host loads it back "
        "(init_load_back) instead of recomputing it; each scheduler step polls "
        "check_hicache_events. Reports device hits, host hits (tokens loaded back) and "
        "misses; hit ratio = (device + host hits) / prompt tokens. With --sweep: a device x "
        "host grid (--plot draws it as a heatmap). With --swa-window / --mamba-states the "
        "host tier keeps SWA KV and Mamba states too (one window and one state count): "
        "their host pools are sized as SGLang's, from the ratio host / device "
        "(--swa-host-capacity / --mamba-host-states set them).")
    g.add_argument("--host-capacity", type=options.host_capacities, default=None,
                   metavar="TOKENS[,TOKENS...]",
                   help="host pool in tokens (0, 2M, 8M, inf); several run once each (with "
                        "--sweep: crossed with its device capacities)")
    g.add_argument("--write-policy", default=None,
                   choices=("write_through", "write_through_selective", "write_back"),
                   help="with --host-capacity: SGLang's --hicache-write-policy (default "
                        "write_through)")
    g.add_argument("--load-back-threshold", type=options.nonnegative_int, default=None, metavar="N",
                   help="with --host-capacity: host hits of fewer tokens are recomputed, not "
                        "loaded back (default: 10, SGLang's)")
    g.add_argument("--swa-host-capacity", type=options.count_of("tokens"), default=None, metavar="TOKENS",
                   help="with --host-capacity and --swa-window: the SWA host pool in tokens "
                        "(default: --swa-ratio x the host capacity, in whole pages: SGLang "
                        "sizes both host pools with one ratio of their device pools)")
    g.add_argument("--mamba-host-states", type=options.count_of("states"), default=None, metavar="N",
                   help="with --host-capacity and --mamba-states: the host state pool "
                        "(default: states x host capacity / device capacity, at least 1: "
                        "SGLang sizes it with the host tier's ratio)")


def _scheduling_options(r):
    """Running requests and the arrival mode."""
    g = r.add_argument_group("scheduling")
    g.add_argument("--max-running", type=options.positive_int, default=None, metavar="N",
                   help="requests in flight at once (default: 1; with --arrival 1024)")
    g.add_argument("--arrival", action="store_true",
                   help="honour the trace's timestamps: each request holds its KV for "
                        "uncached/prefill-tps + output/decode-tps seconds; reports "
                        "concurrency over time, waits and rejections")
    g.add_argument("--prefill-tps", type=options.positive_float, default=None, metavar="T",
                   help="with --arrival: prefill tokens/s over a request's uncached prompt "
                        "(default: 10000)")
    g.add_argument("--decode-tps", type=options.positive_float, default=None, metavar="T",
                   help="with --arrival: output tokens/s of one request (default: 50)")
    g.add_argument("--rate-scale", type=options.positive_float, default=None, metavar="F",
                   help="with --arrival: arrivals F times as fast (timestamps / F; default: 1)")
    g.add_argument("--interval", type=options.positive_float, default=None, metavar="SECONDS",
                   help="with --arrival: timeline bucket width (default: about 20 buckets)")


def _sweep_options(r):
    """The capacity sweep."""
    g = r.add_argument_group("sweep")
    g.add_argument("--sweep", type=options.sweep_items, default=None, metavar="C1,C2,...",
                   help="replay once per capacity and policy (and once unbounded); capacities "
                        "in tokens (2M) or memory (64GiB, with --model-config or "
                        "--kv-bytes-per-token); a capacity listed twice (also as tokens and "
                        "as memory) runs once; stdout gets a table")
    g.add_argument("--jobs", type=options.positive_int, default=1, metavar="N",
                   help="with --sweep: run N replays at once, in processes (same results; "
                        "default: 1). Ctrl-C stops at once, keeping the runs that finished "
                        "(printed and written, marked partial; exit status 130)")
    g.add_argument("--backend", type=options.backend, default=None,
                   metavar="loky|dask[:ADDRESS]|ray[:ADDRESS]",
                   help="with --sweep: run the points through joblib on this backend instead of "
                        "the local process pool (needs flatradix[cluster]: joblib; dask: "
                        "dask.distributed and a running scheduler, ADDRESS tcp://host:8786, else "
                        "$DASK_SCHEDULER_ADDRESS; ray: a running Ray cluster, ray.init(ADDRESS), "
                        "default 'auto'); --jobs: the tasks in flight at once. Same results as "
                        "the process pool")


def _output_options(r):
    """What is printed and written."""
    g = r.add_argument_group("output")
    g.add_argument("--json", action="store_true",
                   help="print JSON instead of text: one object (a list with several "
                        "policies), the sweep's curve, or the --describe statistics")
    g.add_argument("--out", metavar="FILE.json", help="also write that JSON to FILE")
    g.add_argument("--csv", metavar="FILE.csv",
                   help="write the results as CSV: one row per sweep point, or per policy")
    g.add_argument("--per-request", metavar="FILE.csv",
                   help="write one CSV row per request (arrival_ms, prompt/hit/evicted tokens, "
                        "waited, wait_ms...); not with --sweep")
    g.add_argument("--plot", metavar="FILE.png",
                   help="with --sweep: plot hit ratio vs capacity, one line per policy "
                        "(with --host-capacity: a device x host heatmap; any matplotlib "
                        "format; needs flatradix[plot])")
    g.add_argument("--no-progress", action="store_true",
                   help="no progress bars (they are shown only on a terminal anyway)")



def _check_output(path, option):
    """Fail now, not after an hour of replay, if ``path`` cannot be written."""
    if not path.strip():
        raise UsageError(f"{option}: empty file name")
    if os.path.isdir(path):
        raise UsageError(f"{option}: {path} is a directory")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(f"{option}: directory {os.path.dirname(path) or parent} does not exist")
    if not os.access(parent, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise UsageError(f"{option}: cannot write {path} (permission denied)")


def _check_options(args):
    """Option combinations and output paths, before any work."""
    def need(cond, msg):
        if not cond:
            raise UsageError(msg)

    check_fleet(args, need)
    if args.backend is not None:
        import importlib.util

        name = args.backend[0]
        for module, extra in (("joblib", "cluster"),) + (
                (("distributed", "dask"),) if name == "dask" else
                (("ray", "ray"),) if name == "ray" else ()):
            need(importlib.util.find_spec(module) is not None,
                 f"--backend {name} needs {module}: pip install 'flatradix[{extra}]'")
        if name == "dask" and args.sweep:
            from .replay.parallel import DASK_ADDRESS

            need(args.backend[1] or os.environ.get("DASK_SCHEDULER_ADDRESS"),
                 f"--backend dask: {DASK_ADDRESS.replace('the dask backend ', '', 1)}")

    if args.mamba_extra_buffer:
        from .replay.config import EXTRA_BUFFER_MIN_STATES

        need(args.mamba_states, "--mamba-extra-buffer needs --mamba-states (the Mamba mode)")
        need(not args.swa_window,
             "--mamba-extra-buffer with --swa-window: the SWA + Mamba replay runs without the "
             "extra buffer only (page 1); drop one of the two")
        small = [n for n in args.mamba_states if n < EXTRA_BUFFER_MIN_STATES]
        need(not small,
             f"--mamba-extra-buffer needs --mamba-states of at least {EXTRA_BUFFER_MIN_STATES} "
             f"(a running request holds 3 state slots and its checkpoint swaps a fresh one "
             f"in), got {small[0] if small else ''}")
    if args.host_capacity is not None:
        need(not args.mamba_extra_buffer,
             "--host-capacity with --mamba-extra-buffer: the replay drives the host tier of "
             "the Mamba mode without the extra buffer only (page 1); drop one of the two")
        for opt, v, what in (("--swa-window", args.swa_window, "windows"),
                             ("--mamba-states", args.mamba_states, "state counts")):
            need(not v or len(v) == 1,
                 f"--host-capacity with {opt} ({len(v or ())} {what}): a host tier replay "
                 f"varies the host pool; give one value")
        for opt, v, mode, mopt in (
                ("--swa-host-capacity", args.swa_host_capacity, args.swa_window,
                 "--swa-window (the SWA mode)"),
                ("--mamba-host-states", args.mamba_host_states, args.mamba_states,
                 "--mamba-states (the Mamba mode)")):
            need(v is None or mode, f"{opt} needs {mopt}")
    else:
        for opt, v in (("--write-policy", args.write_policy),
                       ("--load-back-threshold", args.load_back_threshold),
                       ("--swa-host-capacity", args.swa_host_capacity),
                       ("--mamba-host-states", args.mamba_host_states)):
            need(v is None, f"{opt} needs --host-capacity (the host tier)")
    if args.mamba_states and not args.mamba_extra_buffer:
        need(args.page_size in (None, 1),
             f"--mamba-states needs --page-size 1 (SGLang serves a Mamba hybrid without the "
             f"extra buffer at page size 1; --mamba-extra-buffer takes any), got --page-size "
             f"{args.page_size}")
        need(not args.swa_window or len(args.swa_window) == 1 or len(args.mamba_states) == 1,
             f"--swa-window ({len(args.swa_window or ())} windows) and --mamba-states "
             f"({len(args.mamba_states)} state counts) both list several values: an SWA + Mamba "
             f"replay varies one of them at a time; give one window or one state count")
        args.page_size = 1
    elif not args.mamba_states:
        need(args.mamba_chunk is None, "--mamba-chunk needs --mamba-states (the Mamba mode)")
    if args.page_size is None:
        args.page_size = 16

    arrival_opts = [o for o, v in (("--prefill-tps", args.prefill_tps),
                                   ("--decode-tps", args.decode_tps),
                                   ("--rate-scale", args.rate_scale),
                                   ("--interval", args.interval)) if v is not None]
    need(args.arrival or not arrival_opts, f"{arrival_opts[0] if arrival_opts else ''} needs "
                                           f"--arrival")
    need(args.trace or args.format is None, "--format needs --trace")
    need(args.trace is None or args.seed is None,
         "--seed applies to the synthetic workload, not to --trace")
    need(args.capacity is None or args.kv_memory is None,
         "--capacity and --kv-memory both size the pool: give one")
    need(args.model_config is None or args.kv_bytes_per_token is None,
         "--model-config and --kv-bytes-per-token both give the KV bytes per token: give one")
    need(args.kv_dtype is None or args.model_config,
         "--kv-dtype needs --model-config")
    need(args.mamba_ssm_dtype is None or args.model_config,
         "--mamba-ssm-dtype needs --model-config (it sizes the Mamba state in bytes)")
    need(args.swa_ratio is None or args.swa_window,
         "--swa-ratio needs --swa-window (the SWA mode)")
    if args.swa_window:
        need(args.swa_window != ["model"] or args.model_config,
             "--swa-window model takes the window from --model-config: give it, or a window "
             "in tokens")
        need(args.kv_bytes_per_token is None,
             "--kv-bytes-per-token gives one pool's bytes; an SWA replay sizes two: give "
             "--model-config (a hybrid config.json), or drop it and give --capacity in tokens")
    mem_sweep = args.sweep and any(kind == "bytes" for kind, _ in args.sweep)
    for opt, used in (("--kv-memory", args.kv_memory is not None),
                      ("--sweep in memory (GiB, GB)", mem_sweep)):
        need(not used or args.model_config or args.kv_bytes_per_token,
             f"{opt} needs --model-config or --kv-bytes-per-token (the KV bytes per token)")
    if args.sweep:
        need(args.capacity is None and args.kv_memory is None,
             "--sweep gives the capacities: drop --capacity / --kv-memory")
        need(args.per_request is None,
             "--per-request needs a single run, not --sweep")
    else:
        need(args.plot is None, "--plot needs --sweep C1,C2,...")
        need(args.jobs == 1, "--jobs runs sweep points in parallel: it needs --sweep")
        need(args.backend is None, "--backend runs sweep points: it needs --sweep")
    if args.describe:
        for opt, v in (("--sweep", args.sweep), ("--plot", args.plot), ("--csv", args.csv),
                       ("--per-request", args.per_request), ("--arrival", args.arrival)):
            need(not v, f"--describe prints statistics without replaying: drop {opt}")
    if args.capacity is not None:
        need(args.capacity >= args.page_size,
             f"--capacity {args.capacity:,} tokens is less than one page (--page-size "
             f"{args.page_size:,}): the cache could never hold a page")
    outs = [(o, v) for o, v in (("--out", args.out), ("--csv", args.csv),
                                ("--per-request", args.per_request), ("--plot", args.plot))
            if v is not None]
    seen = {}
    for opt, path in outs:
        key = os.path.abspath(path)
        need(key not in seen, f"{seen.get(key)} and {opt} name the same file {path}")
        seen[key] = opt
        _check_output(path, opt)
    if args.plot:
        from .replay.report import plot_formats

        try:
            formats = plot_formats()
        except RuntimeError as e:
            raise UsageError(str(e)) from None
        ext = os.path.splitext(args.plot)[1].lower().lstrip(".")
        what = f".{ext} files" if ext else "a file name without an extension"
        need(ext in formats, f"--plot: matplotlib cannot write {what}; end the name in one "
                             f"of .{', .'.join(formats)}")


def _kv_sizing(args):
    """(bytes per token or None, KVLayout or None); the SWA mode checks that the
    config has sliding-window layers and resolves ``--swa-window model``."""
    if args.model_config:
        from .replay.model import ModelConfigError, load_model_config

        try:
            layout = load_model_config(args.model_config, kv_dtype=args.kv_dtype or "auto",
                                       mamba_ssm_dtype=args.mamba_ssm_dtype)
        except (ModelConfigError, OSError) as e:
            raise UsageError(f"--model-config: {e}") from None
        if layout.full_kv_bytes_per_token == 0:
            raise UsageError(f"--model-config: {args.model_config} has no full-attention layer "
                             f"({layout.describe()[0]}); the replay models the full-attention "
                             f"pool only: give --kv-bytes-per-token")
        for opt, given in (("--mamba-states", args.mamba_states),
                           ("--mamba-ssm-dtype", args.mamba_ssm_dtype)):
            if given and not layout.linear_attention_layers:
                raise UsageError(f"{opt}: --model-config {args.model_config} has no "
                                 f"linear-attention / Mamba layer (give a hybrid config, or drop "
                                 f"{'--model-config' if opt == '--mamba-states' else opt})")
        if args.swa_window:
            if not layout.sliding_window_layers:
                raise UsageError(f"--swa-window: --model-config {args.model_config} has no "
                                 f"sliding-window layer, so its SWA pool has no size in bytes "
                                 f"(give a hybrid config, or drop --model-config)")
            if args.swa_window == ["model"]:
                args.swa_window = [layout.sliding_window]
        return layout.full_kv_bytes_per_token, layout
    return args.kv_bytes_per_token, None


def _tokens_for(nbytes, bpt, page, option, layout=None, swa_ratio=None):
    """Full-pool tokens ``nbytes`` buys; with ``swa_ratio`` (SWA mode) the SWA pool
    (``swa_ratio`` x those tokens, at the layout's SWA bytes) is paid from it too."""
    from .replay.model import swa_tokens_for_memory, tokens_for_memory
    from .replay.report import MAX_CAPACITY

    try:
        if swa_ratio is not None:
            t = swa_tokens_for_memory(nbytes, bpt, layout.swa_kv_bytes_per_token, swa_ratio,
                                      page)[0]
        else:
            t = tokens_for_memory(nbytes, bpt, page)
    except ValueError as e:
        raise UsageError(f"{option}: {e}") from None
    if t > MAX_CAPACITY:
        raise UsageError(f"{option}: {t:,} tokens is more than the largest pool "
                         f"({MAX_CAPACITY:,} tokens)")
    return t


def _load(args, progress):
    from .replay.trace import TraceFormatError, load_trace, synthetic_workload

    if not args.trace:
        return synthetic_workload(num_requests=args.limit or 3000,
                                  block_size=args.block_size or 16, seed=args.seed or 0)
    try:
        return load_trace(args.trace, format=args.format or "auto", block_size=args.block_size,
                          limit=args.limit, progress=progress)
    except (OSError, TraceFormatError) as e:
        msg = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        if isinstance(e, OSError):
            msg = f"{args.trace}: {msg}"
        raise UsageError(f"--trace: {msg}") from None


class Plan:
    """What the options resolve to before the trace is read: the policies, the KV
    bytes per token and model layout, the hybrid mode's series, the capacities in
    tokens (``--kv-memory`` and memory sweep points converted) and the ``kv``
    block of the JSON output."""

    def __init__(self, args):
        self.policies = list(dict.fromkeys(p for group in (args.policy or [["lru"]])
                                           for p in group))
        self.progress = not args.no_progress
        self.bpt, self.layout = _kv_sizing(args)
        self.windows = windows = args.swa_window   # None, or ints (after _kv_sizing)
        self.states = states = args.mamba_states   # None, or a list of ints
        self.hosts = args.host_capacity            # None, or a list of ints / math.inf
        # the hybrid mode's series: replay() argument and its values, one run each (the
        # SWA + Mamba mode: the one of the two that lists several; the other is fixed)
        self.series = (None, [None])
        if windows and states:
            self.series = (("swa_window", windows) if len(windows) > 1
                           else ("mamba_states", states))
        elif windows:
            self.series = ("swa_window", windows)
        elif states:
            self.series = ("mamba_states", states)
        if self.hosts:
            self.series = ("host_capacity", self.hosts)
        self.ratio = None
        if windows:
            from .replay.config import DEFAULT_SWA_RATIO

            self.ratio = args.swa_ratio if args.swa_ratio is not None else DEFAULT_SWA_RATIO
        self._capacities(args)
        self.kv = None
        if self.bpt:
            self.kv = {"bytes_per_token": self.bpt, "kv_memory": args.kv_memory,
                       "capacity_tokens": self.capacity,
                       "model": self.layout.to_dict() if self.layout is not None else None}
            if windows:
                self.kv.update(swa_bytes_per_token=self.swa_bpt, swa_ratio=self.ratio,
                               swa_capacity_tokens=self.swa_tokens)

    def _capacities(self, args):
        # the pool (--capacity / --kv-memory) and the sweep's pools, in tokens
        bpt, layout, ratio, page = self.bpt, self.layout, self.ratio, args.page_size
        self.capacity = args.capacity
        if args.kv_memory is not None:
            self.capacity = _tokens_for(args.kv_memory, bpt, page, "--kv-memory", layout, ratio)
        self.sweep_caps = None
        if args.sweep:
            self.sweep_caps = []
            for kind, v in args.sweep:
                if kind == "bytes":
                    v = _tokens_for(v, bpt, page, "--sweep", layout, ratio)
                elif v is not None and v < page:
                    raise UsageError(f"--sweep: capacity {v:,} tokens is less than one page "
                                     f"(--page-size {page:,})")
                self.sweep_caps.append(v)
            # a capacity given twice (2M,1M,2M, or 2M and its bytes) runs once
            self.sweep_caps = list(dict.fromkeys(self.sweep_caps))
        self.swa_tokens = self.swa_bpt = None
        if self.windows:
            from .replay.config import swa_pool_slots

            self.swa_bpt = layout.swa_kv_bytes_per_token if layout is not None else None
            for v in [self.capacity] + list(self.sweep_caps or ()):
                if v is not None:
                    try:
                        swa_pool_slots(v, ratio, page, v)
                    except ValueError as e:
                        raise UsageError(f"--swa-ratio: {e}") from None
            if self.capacity is not None:
                self.swa_tokens = swa_pool_slots(self.capacity, ratio, page, self.capacity)

    def kv_lines(self, r=None):
        """The KV sizing lines of the text report (of run ``r``, or of the options)."""
        from .replay.report import kv_lines

        if not self.bpt:
            return None
        if r is None:
            return kv_lines(self.capacity, self.bpt, self.layout, self.swa_tokens, self.states)
        return kv_lines(self.capacity, self.bpt, self.layout, self.swa_tokens,
                        [r.mamba_states] if self.states else None,
                        host_tokens=r.host_capacity, host_swa_tokens=r.swa_host_pool_slots,
                        host_states=r.mamba_host_pool_slots)


def _replay_kwargs(args, plan, workload):
    """The ``replay`` keywords every run shares (the series value and the policy
    apart)."""
    from .replay.config import ArrivalModel

    arrival = None
    if args.arrival:
        if not workload.has_timestamps:
            raise UsageError(f"--arrival: {workload.name} has no timestamps")
        arrival = ArrivalModel(prefill_tokens_per_s=args.prefill_tps or 10_000.0,
                               decode_tokens_per_s=args.decode_tps or 50.0,
                               rate_scale=args.rate_scale or 1.0, interval_s=args.interval)
    windows, states = plan.windows, plan.states
    kw = dict(page_size=args.page_size, max_running=args.max_running,
              cache_outputs=args.cache_outputs, arrival=arrival, check=args.check)
    if windows:
        kw["swa_ratio"] = plan.ratio
    if states:
        kw["mamba_chunk"] = args.mamba_chunk
    if args.mamba_extra_buffer:
        kw["mamba_extra_buffer"] = True
    if plan.hosts:
        kw.update(write_policy=args.write_policy, load_back_threshold=args.load_back_threshold)
        if windows:
            kw.update(swa_window=windows[0], swa_host_capacity=args.swa_host_capacity)
        if states:
            kw.update(mamba_states=states[0], mamba_host_states=args.mamba_host_states)
    elif windows and states:
        fixed = "mamba_states" if plan.series[0] == "swa_window" else "swa_window"
        kw[fixed] = (states if fixed == "mamba_states" else windows)[0]
    return kw


def _sweep_title(args, plan, workload, curve):
    """The plot's title: the trace, the model's bytes per token and the mode."""
    bpt, layout = plan.bpt, plan.layout
    if layout is None:
        return None
    name = f"{os.path.basename(workload.name)}: {len(workload):,} requests"
    mode = "arrival times" if args.arrival else "one pass"
    per_token = f"{bpt:,} B/token"
    if plan.windows:
        per_token = f"{bpt:,} + {plan.ratio:g} x {plan.swa_bpt:,} B/token"
    title = (f"{name}\n{os.path.basename(layout.source)} ({per_token}), page "
             f"{curve['page_size']}, max running {curve['max_running']:,}, {mode}")
    if plan.states:
        chunk = (curve.get("swa_mamba") or curve["mamba"])["chunk"]
        title += f", Mamba chunk {chunk}"
        if args.mamba_extra_buffer:
            title += " (extra buffer)"
    if plan.hosts:
        h = curve["host"]
        title += (f", host tier {h['write_policy']}, load-back threshold "
                  f"{h['load_back_threshold']}\ncells: total % (device + host); unbounded "
                  f"device pool {100 * curve['unbounded_hit_ratio']:.2f} %")
    return title


def _run_sweep(args, plan, workload, kw):
    """``--sweep``: the curve, its CSV and plot, and the table (or JSON)."""
    from .replay import report as rep

    swa_kw = dict(swa_windows=plan.windows, swa_bytes_per_token=plan.swa_bpt) \
        if plan.windows else {}
    if plan.states:
        swa_kw["mamba_states"] = plan.states
    if plan.hosts:
        swa_kw["host_capacities"] = plan.hosts
    skw = {k: v for k, v in kw.items() if k not in ("swa_window", "mamba_states")}
    curve, interrupted = keep_partial(lambda: rep.sweep(
        workload, plan.sweep_caps, policies=plan.policies, jobs=args.jobs,
        progress=plan.progress, bytes_per_token=plan.bpt, backend=args.backend, **swa_kw,
        **skw))
    if plan.kv:
        curve["kv"] = plan.kv
    out = Outputs(args)
    out.write("--csv", args.csv, lambda: rep.write_sweep_csv(curve, args.csv))
    out.write("--plot", args.plot, lambda: rep.plot_sweep(
        curve, args.plot, title=_sweep_title(args, plan, workload, curve)))
    out.emit(curve, lambda: rep.format_sweep(curve))
    return out.finish(interrupted)


def _run_single(args, plan, workload, kw):
    """One run per series value and policy: the report (or JSON), its CSV files.
    Interrupted, the runs that finished are reported and written (marked partial)."""
    from .replay import report as rep
    from .replay.sim import replay

    param, values = plan.series
    runs = [(v, pol) for v in values for pol in plan.policies]
    results, interrupted = [], None
    try:
        for v, pol in runs:
            results.append(replay(workload, capacity=plan.capacity, policy=pol,
                                  progress=plan.progress, record_requests=bool(args.per_request),
                                  **(dict(kw, **{param: v}) if v is not None else kw)))
    except KeyboardInterrupt:
        if not results:
            raise
        interrupted = (len(results), len(runs))
    out = Outputs(args)
    out.write("--csv", args.csv,
              lambda: rep.write_runs_csv(results, args.csv, plan.bpt, plan.swa_bpt))
    out.write("--per-request", args.per_request,
              lambda: rep.write_per_request_csv(results, args.per_request))
    return emit_runs(out, plan, results, len(runs), interrupted,
                     lambda r: rep.format_report(r, kv=plan.kv_lines(r)))


def run(args):
    """The ``replay`` command on parsed ``args``: returns the exit status;
    :class:`UsageError` for a user's mistake."""
    from .replay.stats import describe_workload, format_describe
    from . import UnifiedRadixCache

    _check_options(args)
    plan = Plan(args)
    workload = _load(args, plan.progress)
    try:
        # a cache the options cannot build (e.g. a page size beyond the pool) is a
        # usage error, reported like one
        for pol in plan.policies:
            if pol != "opt":
                UnifiedRadixCache(page_size=args.page_size, eviction_policy=pol)
    except (ValueError, TypeError) as e:
        raise UsageError(str(e)) from None
    if args.describe:
        d = describe_workload(workload)
        if plan.kv:
            d["kv"] = plan.kv
        kv_text = [f"  {line}" for line in plan.kv_lines() or ()]
        out = Outputs(args)
        out.emit(d, lambda: "\n".join([format_describe(d)] + kv_text))
        return out.finish()
    kw = _replay_kwargs(args, plan, workload)
    try:
        if args.instances:
            from .cli_fleet import run_fleet

            return run_fleet(args, plan, workload, kw)
        if args.sweep:
            return _run_sweep(args, plan, workload, kw)
        return _run_single(args, plan, workload, kw)
    except MemoryError as e:
        raise UsageError(f"out of memory ({e}): lower --capacity / --kv-memory / "
                         f"--max-running, or --limit the trace") from None
