"""Request workloads for the replay: the Mooncake trace reader and a built-in
synthetic workload.

A :class:`Workload` is a struct of arrays, one entry per request, in arrival
order. Prompts are given as *blocks*: request ``i`` owns the block ids
``hash_ids[hash_ptr[i]:hash_ptr[i + 1]]``; equal ids mean equal prefix content
(Mooncake's remapped prefix-block ids). Block ``h`` expands into the tokens
``h * block_size + j`` for ``j in range(block_size)``: an injective map, so two
different blocks never share a token and hit counts are exact. The last block
of a prompt is truncated to ``input_length``.
"""

import json
import math
import os
from dataclasses import dataclass

import numpy as np

MOONCAKE_BLOCK_SIZE = 512
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


class TraceFormatError(ValueError):
    """A malformed trace line; the message names the file and the line number."""


@dataclass
class Workload:
    """Requests as parallel arrays (all int64 numpy, length ``n`` unless noted).

    Attributes
    ----------
    name : str
        Where it came from (a path, or ``"synthetic(...)"``).
    block_size : int
        Tokens per hash block.
    timestamps : float64 ``(n,)``
        Arrival times (ms), non-decreasing.
    input_lengths, output_lengths : int64 ``(n,)``
        Prompt and output tokens.
    hash_ptr : int64 ``(n + 1,)``
        CSR offsets into ``hash_ids``.
    hash_ids : int64 ``(hash_ptr[-1],)``
        Block ids, >= 0.
    """

    name: str
    block_size: int
    timestamps: np.ndarray
    input_lengths: np.ndarray
    output_lengths: np.ndarray
    hash_ptr: np.ndarray
    hash_ids: np.ndarray

    def __len__(self):
        return int(self.input_lengths.shape[0])

    @property
    def prompt_tokens(self):
        return int(self.input_lengths.sum())

    @property
    def output_tokens(self):
        return int(self.output_lengths.sum())

    @property
    def token_base(self):
        """First token id past every block token: fresh ids start here."""
        top = int(self.hash_ids.max()) + 1 if self.hash_ids.size else 0
        return top * self.block_size

    def blocks(self, i):
        """Block ids of request ``i`` (int64 view)."""
        return self.hash_ids[self.hash_ptr[i]:self.hash_ptr[i + 1]]

    def tokens(self, i):
        """Prompt token ids of request ``i``: int64, C-contiguous, length ``input_lengths[i]``.

        One vectorised expression: ``(h[:, None] * B + arange(B)).ravel()[:n]``.
        """
        h = self.hash_ids[self.hash_ptr[i]:self.hash_ptr[i + 1]]
        B = self.block_size
        n = int(self.input_lengths[i])
        return (h[:, None] * B + np.arange(B, dtype=np.int64)).reshape(-1)[:n]

    def head(self, limit):
        """The first ``limit`` requests (all when ``limit`` is None)."""
        if limit is None or limit >= len(self):
            return self
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        end = int(self.hash_ptr[limit])
        return Workload(self.name, self.block_size, self.timestamps[:limit],
                        self.input_lengths[:limit], self.output_lengths[:limit],
                        self.hash_ptr[:limit + 1], self.hash_ids[:end])

    def distinct_prefix_blocks(self):
        """Distinct block *prefixes* (nodes of the hash-id trie) over all prompts.

        ``distinct_prefix_blocks() * block_size`` bounds the tokens an unbounded
        prefix cache can ever hold for these prompts. O(total blocks).
        """
        trie = {}
        ptr = self.hash_ptr.tolist()
        ids = self.hash_ids.tolist()
        for i in range(len(self)):
            node = 0
            for h in ids[ptr[i]:ptr[i + 1]]:
                k = (node, h)
                nxt = trie.get(k)
                if nxt is None:
                    nxt = len(trie) + 1
                    trie[k] = nxt
                node = nxt
        return len(trie)


def _line_error(path, lineno, msg):
    return TraceFormatError(f"{path}:{lineno}: {msg}")


def _check_int(v, name, path, lineno):
    if isinstance(v, bool) or not isinstance(v, int):
        raise _line_error(path, lineno, f"{name} must be an integer, got {v!r}")
    if v < 0:
        raise _line_error(path, lineno, f"{name} must be >= 0, got {v}")
    return v


def load_mooncake(path, block_size=MOONCAKE_BLOCK_SIZE, limit=None):
    """Read a Mooncake JSONL trace into a :class:`Workload`.

    One JSON object a line with ``timestamp`` (ms), ``input_length``,
    ``output_length`` and ``hash_ids`` (one id per ``block_size``-token block of
    the prompt, so ``len(hash_ids) == ceil(input_length / block_size)``). Blank
    lines are skipped. Requests are ordered by timestamp (stable, so equal
    timestamps keep file order). ``limit`` keeps the first ``limit`` requests of
    that order.

    Raises
    ------
    TraceFormatError
        (a ``ValueError``) naming the file and line number of the first
        malformed line: invalid JSON, a missing field, a non-integer or negative
        value, or a ``hash_ids`` length that does not match ``input_length``.
    """
    block_size = int(block_size)
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    max_hash = (1 << 62) // block_size  # larger ids overflow int64 tokens once expanded
    ts, nin, nout, nblk, flat = [], [], [], [], []
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as e:
                raise _line_error(path, lineno, f"invalid JSON ({e})") from None
            if not isinstance(rec, dict):
                raise _line_error(path, lineno, "expected a JSON object")
            missing = [k for k in _FIELDS if k not in rec]
            if missing:
                raise _line_error(path, lineno, f"missing field(s) {', '.join(missing)}")
            t = rec["timestamp"]
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
                raise _line_error(path, lineno, f"timestamp must be a number, got {t!r}")
            n = _check_int(rec["input_length"], "input_length", path, lineno)
            o = _check_int(rec["output_length"], "output_length", path, lineno)
            h = rec["hash_ids"]
            if not isinstance(h, list):
                raise _line_error(path, lineno, f"hash_ids must be a list, got {type(h).__name__}")
            need = -(-n // block_size)
            if len(h) != need:
                raise _line_error(path, lineno,
                                  f"input_length {n} needs {need} block(s) of {block_size} "
                                  f"tokens but hash_ids has {len(h)} (wrong --block-size?)")
            for v in h:
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise _line_error(path, lineno, f"hash_ids must hold integers >= 0, got {v!r}")
                if v >= max_hash:
                    raise _line_error(path, lineno, f"hash id {v} too large to expand into "
                                                    f"int64 tokens at block size {block_size}")
            ts.append(t)
            nin.append(n)
            nout.append(o)
            nblk.append(len(h))
            flat.extend(h)
    timestamps = np.asarray(ts, dtype=np.float64)
    input_lengths = np.asarray(nin, dtype=np.int64)
    output_lengths = np.asarray(nout, dtype=np.int64)
    nblk = np.asarray(nblk, dtype=np.int64)
    hash_ids = np.asarray(flat, dtype=np.int64)
    if hash_ids.size and int(hash_ids.max()) >= (1 << 62) // block_size:
        raise TraceFormatError(f"{path}: hash id {int(hash_ids.max())} too large to expand "
                               f"into int64 tokens at block size {block_size}")
    ptr = np.zeros(len(nin) + 1, dtype=np.int64)
    np.cumsum(nblk, out=ptr[1:])
    order = np.argsort(timestamps, kind="stable")
    if not np.array_equal(order, np.arange(order.size)):
        # reorder the CSR blocks (vectorised gather of each request's block range)
        starts = ptr[:-1][order]
        lens = nblk[order]
        ptr = np.zeros_like(ptr)
        np.cumsum(lens, out=ptr[1:])
        gather = np.repeat(starts - ptr[:-1], lens) + np.arange(int(ptr[-1]), dtype=np.int64)
        hash_ids = hash_ids[gather]
        timestamps, input_lengths, output_lengths = (
            timestamps[order], input_lengths[order], output_lengths[order])
    w = Workload(os.fspath(path), block_size, timestamps, input_lengths, output_lengths,
                 ptr, hash_ids)
    return w.head(limit)


def synthetic_workload(num_requests=3000, block_size=16, seed=0, num_system_prompts=8,
                       mean_turns=5.0):
    """A deterministic multi-turn chat workload with shared system prompts.

    The model (all draws from ``numpy.random.default_rng(seed)``):

    * ``num_system_prompts`` system prompts, 200-3000 tokens each; popularity is
      Zipf-like (prompt ``k`` is chosen with weight ``1 / (k + 1)``).
    * Conversations start as a Poisson process (mean gap 200 ms). Each has
      ``1 + Poisson(mean_turns - 1)`` turns, 2-20 s apart.
    * Turn ``t``'s prompt is the conversation so far: the system prompt, then
      every earlier user message and answer, then the new user message
      (20-600 tokens). The answer (``output_length``) is 10-800 tokens and
      becomes part of the next turn's prompt.
    * Block ids follow the trace's convention: a block lying wholly inside the
      system prompt has an id shared by every conversation using that prompt;
      every other *full* block has one id per (conversation, block index), the
      same in every turn; a prompt's last, partial block gets a fresh id (its
      content changes when the conversation grows).
    * Requests are ordered by arrival time and the first ``num_requests`` kept.

    So a turn hits the previous turn's prompt (not its answer: answers are
    output tokens, which the replay never matches) and the system prompt.
    Changing this generator changes every figure computed from it: add new
    generators rather than editing this one.
    """
    rng = np.random.default_rng(seed)
    B = int(block_size)
    sys_len = rng.integers(200, 3001, size=num_system_prompts)
    weights = 1.0 / np.arange(1, num_system_prompts + 1)
    weights /= weights.sum()
    ids = {}

    def bid(key):
        v = ids.get(key)
        if v is None:
            v = ids[key] = len(ids)
        return v

    reqs = []  # (timestamp, seq, input_length, output_length, blocks)
    t0 = 0.0
    conv = 0
    # Generate conversations until enough requests start before the next conversation
    # could add an earlier one; requests are then sorted by time and truncated.
    while True:
        t0 += rng.exponential(200.0)
        turns = 1 + int(rng.poisson(mean_turns - 1))
        s = int(rng.choice(num_system_prompts, p=weights))
        length = int(sys_len[s])
        t = t0
        for _ in range(turns):
            length += int(rng.integers(20, 601))       # the new user message
            out = int(rng.integers(10, 801))
            nfull = length // B
            blocks = []
            for k in range(nfull):
                if (k + 1) * B <= sys_len[s]:
                    blocks.append(bid(("sys", s, k)))
                else:
                    blocks.append(bid(("conv", conv, k)))
            if length % B:
                blocks.append(bid(("tail", conv, length)))
            reqs.append((t, len(reqs), length, out, blocks))
            length += out                              # the answer joins the history
            t += float(rng.uniform(2000.0, 20000.0))
        conv += 1
        if len(reqs) >= num_requests and sum(1 for r in reqs if r[0] <= t0) >= num_requests:
            break
    reqs.sort(key=lambda r: (r[0], r[1]))
    reqs = reqs[:num_requests]
    nblk = np.array([len(r[4]) for r in reqs], dtype=np.int64)
    ptr = np.zeros(len(reqs) + 1, dtype=np.int64)
    np.cumsum(nblk, out=ptr[1:])
    flat = np.fromiter((h for r in reqs for h in r[4]), dtype=np.int64, count=int(ptr[-1]))
    return Workload(f"synthetic(num_requests={num_requests}, seed={seed})", B,
                    np.array([r[0] for r in reqs], dtype=np.float64),
                    np.array([r[2] for r in reqs], dtype=np.int64),
                    np.array([r[3] for r in reqs], dtype=np.int64), ptr, flat)
