"""``flatradix replay`` as a new user meets it (issue 15): the command run as a
subprocess. A user's mistake is one line on stderr naming the option, file or
line, exit status 2, never a traceback, and nothing on stdout; output paths are
checked before anything runs; the README and ``--help`` say what the command does.
"""

import json
import os
import pathlib
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from flatradix.cli import build_parser

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "model_configs"

# one request: 40 prompt tokens in 3 blocks of 16, 4 output tokens
ONE = '{"timestamp": 0, "input_length": 40, "output_length": 4, "hash_ids": [1, 2, 3]}\n'


def run_cli(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "flatradix", "replay", *map(str, args)],
                          cwd=cwd or ROOT, env=env, capture_output=True, text=True, timeout=300)


def assert_clean_error(p, *needles):
    assert "Traceback" not in p.stderr, p.stderr
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert len(lines) == 1 and lines[0].startswith("flatradix replay: error: "), p.stderr
    for s in needles:
        assert s in lines[0], (s, lines[0])
    assert p.stdout == ""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    f = {"dir": d}
    (d / "one.jsonl").write_text(ONE)
    (d / "empty.jsonl").write_text("")
    (d / "blank.jsonl").write_text("\n  \n")
    (d / "bad.jsonl").write_text(ONE + '{"timestamp": 1}\n')
    (d / "utf16.jsonl").write_bytes(ONE.encode("utf-16"))          # with a byte-order mark
    (d / "utf16le.jsonl").write_bytes(ONE.encode("utf-16-le"))     # without one
    (d / "latin1.jsonl").write_bytes(ONE.encode() + '{"ü": 1}\n'.encode("latin-1"))
    (d / "blocks.jsonl").write_text(
        '{"timestamp": 0, "input_length": 40, "output_length": 4, "hash_ids": [1]}\n')
    (d / "nots.jsonl").write_text('{"token_ids": [1, 2, 3], "output_length": 1}\n')
    (d / "sliding.json").write_text(json.dumps({
        "model_type": "mistral", "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "hidden_size": 4096, "sliding_window": 4096}))
    (d / "existing_dir").mkdir()
    import gzip

    packed = gzip.compress("".join(ONE.replace('"timestamp": 0', f'"timestamp": {i}')
                                   for i in range(2000)).encode(), mtime=0)
    (d / "cut.jsonl.gz").write_bytes(packed[:len(packed) // 2])
    f["cut"] = d / "cut.jsonl.gz"
    for k in ("one", "empty", "blank", "bad", "utf16", "utf16le", "latin1", "blocks", "nots"):
        f[k] = d / f"{k}.jsonl"
    f["sliding"] = d / "sliding.json"
    return f


ERRORS = {
    # finding: a capacity beyond any pool was a ValueError traceback
    "huge_capacity": (["--capacity", "99999999999999999999999"], ["--capacity", "largest pool"]),
    # findings: --out / --plot in a missing directory failed after the whole sweep; the
    # malformed trace proves the outputs are checked before the trace is even read
    "out_dir_missing": (["--trace", "{bad}", "--sweep", "1k", "--out", "/nonexistent/dir/x.json"],
                        ["--out", "/nonexistent/dir does not exist"]),
    "plot_dir_missing": (["--trace", "{bad}", "--sweep", "1k", "--plot", "/nonexistent/d/x.png"],
                         ["--plot", "/nonexistent/d does not exist"]),
    "plot_format": (["--trace", "{bad}", "--sweep", "1k", "--plot", "{dir}/x.txt"],
                    ["--plot", ".txt", ".png"]),
    "csv_is_a_directory": (["--csv", "{dir}/existing_dir"], ["--csv", "is a directory"]),
    "same_output_twice": (["--sweep", "1k", "--out", "{dir}/a", "--csv", "{dir}/a"],
                          ["--out and --csv name the same file"]),
    # findings: an empty trace or /dev/null ran and printed "requests 0"
    "empty_trace": (["--trace", "{empty}"], ["--trace", "empty.jsonl: no requests"]),
    "blank_trace": (["--trace", "{blank}"], ["no requests"]),
    "dev_null": (["--trace", "/dev/null"], ["/dev/null: no requests"]),
    # finding: a UTF-16 file was reported as "invalid JSON"
    "utf16_with_bom": (["--trace", "{utf16}"], ["utf16.jsonl:1:", "UTF-16", "UTF-8"]),
    "utf16_without_bom": (["--trace", "{utf16le}"], ["utf16le.jsonl:1:", "UTF-16", "UTF-8"]),
    "latin1": (["--trace", "{latin1}", "--block-size", "16"], ["latin1.jsonl:2: not UTF-8 (byte 0xfc"]),
    # finding: --page-size 4096 --capacity 1000 rejected every request silently
    "capacity_below_a_page": (["--page-size", "4096", "--capacity", "1000"],
                              ["--capacity 1,000 tokens is less than one page",
                               "--page-size 4,096"]),
    "sweep_below_a_page": (["--page-size", "64", "--sweep", "32"],
                           ["--sweep: capacity 32 tokens is less than one page"]),
    # finding: "has 1 entries"
    "one_block_grammar": (["--trace", "{blocks}", "--block-size", "16"],
                          ["blocks.jsonl:1: input_length 40 needs 3 blocks of 16 tokens but "
                           "hash_ids has 1 id (wrong --block-size?)"]),
    "malformed_line": (["--trace", "{bad}", "--block-size", "16"], ["bad.jsonl:2: missing field(s)"]),
    "missing_trace": (["--trace", "/nonexistent/t.jsonl"],
                      ["--trace: /nonexistent/t.jsonl: No such file or directory"]),
    # a compressed trace is read directly; a truncated one says so (issue 30)
    "truncated_gzip": (["--trace", "{cut}", "--block-size", "16"], ["cut.jsonl.gz: the gzip data ends early "
                                             "(truncated download?) after line "]),
    "unknown_trace_name": (["--trace", "mooncake:nope"],
                           ["--trace: mooncake:nope: No such file or directory, nor a trace "
                            "name (known: mooncake:sample, mooncake:conversation)"]),
    "trace_is_a_directory": (["--trace", "{dir}"], ["is a directory"]),
    "unknown_policy": (["--policy", "lru,banana"], ["--policy", "'banana'"]),
    "seed_with_trace": (["--trace", "{one}", "--seed", "3"], ["--seed", "synthetic"]),
    # issue 30: argparse took -1GiB for an option ("expected one argument"), and --cap
    # for --capacity
    "negative_kv_memory": (["--kv-memory", "-1GiB", "--kv-bytes-per-token", "100"],
                           ["argument --kv-memory", "'-1GiB'", "never negative"]),
    "abbreviation": (["--cap", "5"], ["unrecognized arguments: --cap 5"]),
    # the cache takes mamba_cache_chunk_size below 2**62: a traceback from it before
    "mamba_chunk_2_to_the_62": (["--mamba-states", "4", "--mamba-chunk", "4611686018427387904"],
                                ["argument --mamba-chunk", "<= 4,611,686,018,427,387,903",
                                 "'4611686018427387904'"]),
}

# The planners' options: the same contract, checked in-process (main() with stderr
# captured) to keep the test time down.
OPTION_ERRORS = {
    "kv_memory_without_bytes": (["--kv-memory", "40GiB"], ["--kv-memory", "--model-config"]),
    "kv_memory_ambiguous_unit": (["--kv-memory", "40G", "--kv-bytes-per-token", "1"],
                                 ["--kv-memory", "40GiB or 40GB"]),
    "kv_memory_beyond_any_pool": (["--kv-memory", "2048TiB", "--kv-bytes-per-token", "1"],
                                  ["--kv-memory", "largest pool"]),
    "kv_memory_below_a_page": (["--kv-memory", "1MiB", "--kv-bytes-per-token", "131072"],
                               ["--kv-memory", "less than one page of 16"]),
    "capacity_and_kv_memory": (["--capacity", "1M", "--kv-memory", "1GiB",
                                "--kv-bytes-per-token", "2"], ["give one"]),
    "memory_sweep_without_bytes": (["--sweep", "1GiB,2M"], ["--sweep", "--kv-bytes-per-token"]),
    "model_config_missing": (["--model-config", "/nonexistent/config.json"],
                             ["--model-config", "No such file"]),
    "model_config_not_json": (["--model-config", "{bad}"], ["--model-config", "invalid JSON"]),
    "model_config_all_sliding": (["--model-config", "{sliding}", "--kv-memory", "1GiB"],
                                 ["--model-config", "no full-attention layer",
                                  "--kv-bytes-per-token"]),
    "kv_dtype_unknown": (["--model-config", str(EXAMPLES / "llama-3-8b-like.json"),
                          "--kv-dtype", "int3"], ["--model-config", "unknown KV dtype 'int3'"]),
    "arrival_without_timestamps": (["--trace", "{nots}", "--arrival"],
                                   ["--arrival", "no timestamps"]),
    "arrival_option_alone": (["--decode-tps", "20"], ["--decode-tps needs --arrival"]),
    "decode_tps_zero": (["--arrival", "--decode-tps", "0"], ["--decode-tps", "> 0"]),
    "jobs_without_sweep": (["--jobs", "2"], ["--jobs", "--sweep"]),
    "per_request_with_sweep": (["--sweep", "1k", "--per-request", "{dir}/r.csv"],
                               ["--per-request", "--sweep"]),
    "describe_with_sweep": (["--describe", "--sweep", "1k"], ["--describe", "--sweep"]),
    "format_without_trace": (["--format", "generic"], ["--format needs --trace"]),
    # the SWA mode (issue 11)
    "swa_window_zero": (["--swa-window", "0"], ["--swa-window", "an integer >= 1", "'0'"]),
    "swa_window_negative": (["--swa-window", "512,-4"], ["--swa-window", "'-4'"]),
    "swa_window_not_a_number": (["--swa-window", "4k"], ["--swa-window", "'4k'"]),
    "swa_ratio_zero": (["--swa-window", "512", "--swa-ratio", "0"], ["--swa-ratio", "(0, 1]"]),
    "swa_ratio_negative": (["--swa-window", "512", "--swa-ratio", "-0.5"],
                           ["--swa-ratio", "(0, 1]"]),
    "swa_ratio_above_one": (["--swa-window", "512", "--swa-ratio", "1.5"],
                            ["--swa-ratio", "(0, 1]"]),
    "swa_ratio_without_window": (["--swa-ratio", "0.5"], ["--swa-ratio needs --swa-window"]),
    "swa_window_model_without_config": (["--swa-window", "model"],
                                        ["--swa-window model", "--model-config"]),
    "swa_with_kv_bytes_per_token": (["--swa-window", "512", "--kv-bytes-per-token", "1000"],
                                    ["--kv-bytes-per-token", "SWA replay sizes two"]),
    "swa_config_without_sliding_layers": (
        ["--swa-window", "512", "--model-config", str(EXAMPLES / "llama-3-8b-like.json")],
        ["--swa-window", "no sliding-window layer"]),
    "swa_pool_below_a_page": (["--swa-window", "64", "--capacity", "32", "--swa-ratio", "0.1"],
                              ["--swa-ratio", "SWA pool", "less than one page of 16"]),
    "empty_out_name": (["--out", ""], ["--out", "empty file name"]),
    "mamba_page_size": (["--mamba-states", "8", "--page-size", "16"],
                        ["--mamba-states needs --page-size 1", "got --page-size 16"]),
    "mamba_extra_buffer_without_states": (["--mamba-extra-buffer"],
                                          ["--mamba-extra-buffer needs --mamba-states (the "
                                           "Mamba mode)"]),
    "mamba_extra_buffer_with_swa": (["--mamba-states", "256", "--mamba-extra-buffer",
                                     "--swa-window", "4096"],
                                    ["--mamba-extra-buffer with --swa-window",
                                     "without the extra buffer only (page 1)"]),
    "mamba_extra_buffer_few_states": (["--mamba-states", "3", "--mamba-extra-buffer"],
                                      ["--mamba-extra-buffer needs --mamba-states of at least "
                                       "4", "got 3"]),
    "mamba_and_swa_both_several": (["--mamba-states", "64,256", "--swa-window", "512,4096"],
                                   ["--swa-window (2 windows) and --mamba-states (2 state "
                                    "counts) both list several values",
                                    "give one window or one state count"]),
    "mamba_states_zero": (["--mamba-states", "0"],
                          ["argument --mamba-states", "an integer >= 1", "'0'"]),
    "mamba_states_negative": (["--mamba-states", "-1"], ["argument --mamba-states", "'-1'"]),
    "mamba_states_not_a_number": (["--mamba-states", "x"], ["argument --mamba-states", "'x'"]),
    "mamba_chunk_without_states": (["--mamba-chunk", "32"],
                                   ["--mamba-chunk needs --mamba-states"]),
    "mamba_chunk_zero": (["--mamba-states", "8", "--mamba-chunk", "0"],
                         ["argument --mamba-chunk", ">= 1"]),
    "mamba_chunk_beyond_int64": (["--mamba-states", "4", "--mamba-chunk",
                                  "99999999999999999999999"],
                                 ["argument --mamba-chunk", "<= 4,611,686,018,427,387,903"]),
    "mamba_states_beyond_the_largest_pool": (["--mamba-states", "1099511627777"],
                                             ["argument --mamba-states",
                                              "<= 1,099,511,627,776", "'1099511627777'"]),
    "mamba_ssm_dtype_without_config": (["--mamba-ssm-dtype", "float16"],
                                       ["--mamba-ssm-dtype needs --model-config"]),
    "mamba_ssm_dtype_unknown": (["--mamba-ssm-dtype", "fp8"],
                                ["argument --mamba-ssm-dtype", "invalid choice: 'fp8'"]),
    "mamba_ssm_dtype_config_without_linear_layers": (
        ["--mamba-ssm-dtype", "float16", "--model-config",
         str(EXAMPLES / "llama-3-8b-like.json")],
        ["--mamba-ssm-dtype", "no linear-attention / Mamba layer"]),
    "mamba_config_without_linear_layers": (
        ["--mamba-states", "8", "--model-config", str(EXAMPLES / "llama-3-8b-like.json")],
        ["--mamba-states", "no linear-attention / Mamba layer"]),
    # the host tier (issue 13)
    "host_with_swa_windows": (["--host-capacity", "1M", "--swa-window", "512,1024"],
                              ["--host-capacity with --swa-window (2 windows): a host tier "
                               "replay varies the host pool; give one value"]),
    "host_with_mamba_extra_buffer": (["--host-capacity", "1M", "--mamba-states", "8",
                                      "--mamba-extra-buffer"],
                                     ["--host-capacity with --mamba-extra-buffer"]),
    "swa_host_capacity_without_swa": (["--host-capacity", "1M", "--swa-host-capacity", "4k"],
                                      ["--swa-host-capacity needs --swa-window"]),
    "mamba_host_states_without_host": (["--mamba-states", "8", "--mamba-host-states", "4"],
                                       ["--mamba-host-states needs --host-capacity"]),
    "write_policy_without_host": (["--write-policy", "write_through"],
                                  ["--write-policy needs --host-capacity (the host tier)"]),
    "load_back_threshold_without_host": (["--load-back-threshold", "5"],
                                         ["--load-back-threshold needs --host-capacity"]),
    "window_thousands": (["--swa-window", "4,096"],
                         ["'4,096': commas separate windows here (512,1024,4096); write a "
                          "number without its thousands commas (4096, not 4,096)"]),
    "capacity_list": (["--capacity", "5,6"],
                      ["argument --capacity: capacity takes one value (a comma only groups "
                       "thousands, as in 2,000,000), got '5,6'"]),
    "host_capacity_negative": (["--host-capacity", "-1"],
                               ["argument --host-capacity: host capacity must be a whole "
                                "number of tokens >= 0 or 'inf'", "'-1'"]),
}


def _fill(args, files):
    return [a.format(**{k: str(v) for k, v in files.items()}) for a in args]


@pytest.fixture(scope="module")
def error_runs(files):
    """Every ERRORS case run once as a subprocess, four at a time; every OPTION_ERRORS
    case through main() in this process (same stderr / exit status contract)."""
    import contextlib
    import io

    from flatradix.cli import main

    with ThreadPoolExecutor(4) as ex:
        futs = {k: ex.submit(run_cli, *_fill(args, files), cwd=files["dir"])
                for k, (args, _) in ERRORS.items()}
        runs = {k: f.result() for k, f in futs.items()}
    cwd = os.getcwd()
    os.chdir(files["dir"])
    try:
        for k, (args, _) in OPTION_ERRORS.items():
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    rc = main(["replay", *_fill(args, files)])
                except SystemExit as e:   # argparse's own errors
                    rc = e.code
            runs[k] = subprocess.CompletedProcess(args, rc, out.getvalue(), err.getvalue())
    finally:
        os.chdir(cwd)
    return runs


@pytest.mark.parametrize("case", sorted(ERRORS) + sorted(OPTION_ERRORS))
def test_user_mistake_is_one_clean_line(error_runs, case):
    assert_clean_error(error_runs[case], *{**ERRORS, **OPTION_ERRORS}[case][1])


def test_big_capacity_sizes_the_pool_from_the_trace(files):
    """--capacity 2G on a one-request trace asked for a 2e9-slot pool. The pool gets
    what the trace can use: 3 blocks of 16 in the tree + 44 tokens in flight."""
    p = run_cli("--trace", files["one"], "--block-size", "16", "--capacity", "2G", "--json")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    d = json.loads(p.stdout)
    assert d["capacity"] == 2_000_000_000 and d["pool_slots"] == 3 * 16 + 44
    assert d["served_requests"] == 1 and d["kv_conserved"]
    assert "pool sized to 92 tokens" in d["notes"][0]


def test_policy_any_case_and_rejections_explained(files):
    """--policy LRU was refused; a rejection said nothing about why."""
    p = run_cli("--trace", files["one"], "--block-size", "16", "--policy", "LRU",
                "--capacity", "32")
    assert p.returncode == 0, p.stderr
    assert "policy lru" in p.stdout
    assert ("note: 1 request rejected: it needs more KV than the whole pool (prompt + output "
            "tokens > 32; the largest request needs 44)") in p.stdout


def test_sweep_stdout_is_what_help_says(files):
    """--help said --sweep prints JSON, but with --out stdout got a table: now stdout is
    a table unless --json, and --out writes the JSON either way."""
    help_text = " ".join(build_parser()._subparsers._group_actions[0]
                         .choices["replay"].format_help().split())
    assert "with --sweep, a table; --json prints JSON instead" in help_text
    assert "stdout gets a table" in help_text
    out = files["dir"] / "curve.json"
    p = run_cli("--limit", "60", "--sweep", "2k", "--out", out)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split()[:2] == ["policy", "capacity"]
    assert json.loads(out.read_text())["points"][0]["capacity"] == 2000


def test_kv_memory_from_a_model_config():
    """40 GiB at Llama-3-8B's 2 x 32 x 8 x 128 x 2 = 131,072 bytes/token: 327,680 tokens."""
    p = run_cli("--limit", "50", "--model-config", EXAMPLES / "llama-3-8b-like.json",
                "--kv-memory", "40GiB")
    assert p.returncode == 0, p.stderr
    assert "capacity 327,680 tokens" in p.stdout
    assert "full-attention KV 131,072 bytes/token (32 layers x 2 x 8 KV heads x 128 x 2 B)" \
        in p.stdout


def test_swa_replay_from_a_hybrid_model_config(files):
    """gpt-oss-20b-like, window from the config (128), 40 GiB at R = 0.5: a full token
    costs 24,576 + 0.5 x 24,576 bytes: 1,165,072 full and 582,528 sliding-window tokens."""
    p = run_cli("--limit", "40", "--model-config", EXAMPLES / "gpt-oss-20b-like.json",
                "--swa-window", "model", "--swa-ratio", "0.5", "--kv-memory", "40GiB")
    assert p.returncode == 0, p.stderr
    for s in ("capacity 1,165,072 tokens", "sliding window 128 tokens",
              "sliding-window pool 582,528 tokens", "lost to window", "evict_sliding_windows",
              "(own pool; replayed)"):
        assert s in p.stdout, s
    p = run_cli("--limit", "40", "--capacity", "8k", "--swa-window", "256,1024", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert [r["swa_window"] for r in d] == [256, 1024]
    assert d[0]["swa_ratio"] == 0.8 and d[0]["swa_pool_slots"] == 6_400


def test_swa_sweep_table_and_csv(files):
    csv_path = files["dir"] / "swa.csv"
    p = run_cli("--limit", "60", "--sweep", "4k", "--swa-window", "256,2048", "--swa-ratio",
                "0.5", "--csv", csv_path)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "sliding-window replay: SWA pool = 0.5 x capacity"
    assert lines[1].split()[:4] == ["policy", "window", "capacity", "SWA"]
    assert len(lines) == 2 + 2 + 2   # header, 2 windows x 1 capacity, 2 unbounded rows
    rows = csv_path.read_text().splitlines()
    assert len(rows) == 1 + 4 and "window_lost_hit_tokens" in rows[0]


def test_describe_prints_statistics_without_replaying(files):
    p = run_cli("--trace", files["one"], "--block-size", "16", "--describe", "--json",
                "--kv-bytes-per-token", "1000", "--kv-memory", "1MB")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["requests"] == 1 and d["prompt_tokens"] == 40 and d["blocks"] == 3
    assert d["kv"]["capacity_tokens"] == 992   # 1e6 / 1000 = 1000, whole pages of 16
    assert "hit_tokens" not in d


# ---------------------------------------------------------------- docs are true
def _replay_options():
    sub = build_parser()._subparsers._group_actions[0].choices["replay"]
    return sorted(o for a in sub._actions for o in a.option_strings
                  if o.startswith("--") and o != "--help")


def test_replay_manual_lists_every_option():
    manual = (ROOT / "docs" / "replay.md").read_text()
    missing = [o for o in _replay_options() if f"`{o}" not in manual]
    assert not missing, f"docs/replay.md does not mention {missing}"


def test_replay_manual_error_table_messages_are_real(error_runs):
    """Each row of docs/replay.md's CLI error table quotes a message a case above printed."""
    readme = (ROOT / "docs" / "replay.md").read_text()
    table = readme[readme.index("| you wrote"):]
    table = table[:table.index("\n\n")]
    quoted = re.findall(r"\| `[^`]*` \| (?:`)?([^|`]+?)(?:`)? \|", table)
    assert len(quoted) >= 10
    printed = " ".join(p.stderr for p in error_runs.values())
    for q in quoted:
        assert q.strip().split("…")[0] in printed, q


def test_license_is_the_apache_text_setup_cfg_declares():
    assert "license = Apache-2.0" in (ROOT / "setup.cfg").read_text()
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "END OF TERMS AND CONDITIONS" in text


def test_changelog_names_this_version():
    import flatradix

    assert f"## {flatradix.__version__}" in (ROOT / "CHANGELOG.md").read_text()


def test_version():
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "flatradix", "--version"], env=env,
                       capture_output=True, text=True, timeout=120)
    import flatradix

    assert p.returncode == 0 and p.stdout.strip() == f"flatradix {flatradix.__version__}"
