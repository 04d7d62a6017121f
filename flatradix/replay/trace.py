"""Request workloads for the replay: the trace reader (Mooncake and generic
JSONL, :func:`load_trace`), a built-in synthetic workload, and trace statistics
(:func:`describe_workload`).

A :class:`Workload` is a struct of arrays, one entry per request, in arrival
order. Prompts are given as *blocks*: request ``i`` owns the block ids
``hash_ids[hash_ptr[i]:hash_ptr[i + 1]]``; equal ids mean equal prefix content
(Mooncake's remapped prefix-block ids). Block ``h`` expands into the tokens
``h * block_size + j`` for ``j in range(block_size)``: an injective map, so two
different blocks never share a token and hit counts are exact. The last block
of a prompt is truncated to ``input_length``. A ``token_ids`` trace is held
with ``block_size`` 1: each token id is its own block, so matching is exact
token by token.
"""

import json
import math
import os
from dataclasses import dataclass

import numpy as np

from ._progress import progress_bar

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
        Block ids, >= 0 (token ids when ``block_size`` is 1: a ``token_ids`` trace).
    has_timestamps : bool
        False for a generic trace without timestamps (all 0; file order).
    source_format : str
        ``"mooncake"``, ``"generic"`` (hash ids), ``"generic/token_ids"`` or
        ``"synthetic"``.
    """

    name: str
    block_size: int
    timestamps: np.ndarray
    input_lengths: np.ndarray
    output_lengths: np.ndarray
    hash_ptr: np.ndarray
    hash_ids: np.ndarray
    has_timestamps: bool = True
    source_format: str = "mooncake"

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
                        self.hash_ptr[:limit + 1], self.hash_ids[:end], self.has_timestamps,
                        self.source_format)

    def prefix_nodes(self):
        """The node of the hash-id trie each block of each prompt reaches: int64
        ``(hash_ptr[-1],)``, node ids ``1..`` numbered in first-touch order (equal
        ids: equal block prefixes). O(total blocks)."""
        trie = {}
        ptr = self.hash_ptr.tolist()
        ids = self.hash_ids.tolist()
        nodes = np.empty(len(ids), dtype=np.int64)
        t = 0
        for i in range(len(self)):
            node = 0
            for h in ids[ptr[i]:ptr[i + 1]]:
                k = (node, h)
                nxt = trie.get(k)
                if nxt is None:
                    nxt = trie[k] = len(trie) + 1
                nodes[t] = node = nxt
                t += 1
        return nodes

    def distinct_prefix_blocks(self):
        """Distinct block *prefixes* (nodes of the hash-id trie) over all prompts.

        ``distinct_prefix_blocks() * block_size`` bounds the tokens an unbounded
        prefix cache can ever hold for these prompts. O(total blocks).
        """
        nodes = self.prefix_nodes()
        return int(nodes.max()) if nodes.size else 0


def _line_error(path, lineno, msg):
    return TraceFormatError(f"{path}:{lineno}: {msg}")


def _plural(n, word):
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def _check_int(v, name, path, lineno):
    if isinstance(v, bool) or not isinstance(v, int):
        raise _line_error(path, lineno, f"{name} must be an integer, got {v!r}")
    if v < 0:
        raise _line_error(path, lineno, f"{name} must be >= 0, got {v}")
    return v


def _check_ids(h, name, bound, path, lineno, what, block_size):
    if not isinstance(h, list):
        raise _line_error(path, lineno, f"{name} must be a list, got {type(h).__name__}")
    if not all(type(v) is int for v in h):  # bool is not int here
        bad = next(v for v in h if type(v) is not int)
        raise _line_error(path, lineno, f"{name} must hold integers >= 0, got {bad!r}")
    if h and min(h) < 0:
        raise _line_error(path, lineno, f"{name} must hold integers >= 0, got {min(h)}")
    if h and max(h) >= bound:
        raise _line_error(path, lineno, f"{what} {max(h)} too large to expand into int64 tokens"
                                        + (f" at block size {block_size}"
                                           if name == "hash_ids" else ""))


_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"),
         (b"\xff\xfe", "UTF-16"), (b"\xfe\xff", "UTF-16"))


#: compressed traces, read directly: (magic bytes, module, what)
_COMPRESSED = ((b"\x1f\x8b", "gzip", "gzip"), (b"BZh", "bz2", "bzip2"),
               (b"\xfd7zXZ\x00", "lzma", "xz"))


def _open_lines(raw):
    """A binary line iterator over ``raw`` (an open file), decompressing a gzip,
    bzip2 or xz file (told by its magic bytes, not its name); returns it and the
    compression's name (None for a plain file)."""
    head = raw.peek(8)[:8] if hasattr(raw, "peek") else b""
    for magic, module, what in _COMPRESSED:
        if head.startswith(magic):
            mod = __import__(module)
            opener = {"gzip": lambda f: mod.GzipFile(fileobj=f, mode="rb"),
                      "bz2": lambda f: mod.BZ2File(f, mode="rb"),
                      "lzma": lambda f: mod.LZMAFile(f, mode="rb")}[module]
            return opener(raw), what
    return raw, None


def _records(path, progress):
    """Yield ``(line number, JSON value)`` for each non-blank line of a UTF-8 JSONL
    file, plain or compressed (gzip, bzip2, xz: see :func:`_open_lines`)."""
    try:
        size = os.path.getsize(path)
    except OSError:
        size = None   # open() below says why
    bar = progress_bar(size, progress and size is not None, unit="B", unit_scale=True,
                       desc="loading trace")
    done = 0
    lineno = 0
    try:
        with open(path, "rb") as raw:
            f, packed = _open_lines(raw)
            try:
                for lineno, line in enumerate(f, 1):
                    if bar is not None and lineno % 4096 == 0:
                        pos = raw.tell()   # compressed bytes read so far
                        bar.update(pos - done)
                        done = pos
                    if lineno == 1:
                        for bom, enc in _BOMS:
                            if line.startswith(bom):
                                raise _line_error(path, 1, f"the file is {enc}-encoded (byte-"
                                                           f"order mark); traces must be UTF-8: "
                                                           f"convert it with iconv -f {enc} -t "
                                                           f"UTF-8")
                        if line.startswith(b"\xef\xbb\xbf"):
                            line = line[3:]
                    if b"\x00" in line:
                        raise _line_error(path, lineno, "NUL bytes: the file looks UTF-16- or "
                                                        "UTF-32-encoded, or is binary; traces "
                                                        "must be UTF-8 (iconv -t UTF-8)")
                    if not line.strip():
                        continue
                    try:
                        text = line.decode("utf-8")
                    except UnicodeDecodeError as e:
                        raise _line_error(path, lineno, f"not UTF-8 (byte 0x{line[e.start]:02x}"
                                                        f" at column {e.start + 1}); traces must"
                                                        f" be UTF-8") from None
                    try:
                        rec = json.loads(text)
                    except ValueError as e:
                        raise _line_error(path, lineno, f"invalid JSON ({e})") from None
                    if not isinstance(rec, dict):
                        raise _line_error(path, lineno, "expected a JSON object")
                    yield lineno, rec
            except Exception as e:   # zlib.error, lzma.LZMAError, OSError, EOFError ...
                if packed is None or isinstance(e, TraceFormatError):
                    raise
                # a truncated or corrupt compressed file: say so, with the line reached
                what = ("ends early (truncated download?)" if isinstance(e, EOFError)
                        else f"is corrupt ({e})")
                raise TraceFormatError(f"{path}: the {packed} data {what} after line "
                                       f"{lineno:,}") from None
            finally:
                if f is not raw:
                    f.close()
    finally:
        if bar is not None:
            bar.close()


def _detect(rec):
    if "token_ids" in rec or "block_size" in rec:
        return "generic"
    return "mooncake" if all(k in rec for k in _FIELDS) else "generic"


def load_trace(path, format="auto", block_size=None, limit=None, progress=False):
    """Read a JSONL request trace into a :class:`Workload`.

    ``path``: a file (plain, or gzip / bzip2 / xz compressed: read directly, told
    by its magic bytes) or a trace name of :mod:`flatradix.replay.datasets`
    (``"mooncake:sample"``, packaged; ``"mooncake:conversation"``, downloaded
    once into the user cache).

    Two formats, one JSON object a line (blank lines are skipped; UTF-8):

    **mooncake** -- ``timestamp`` (ms), ``input_length``, ``output_length`` and
    ``hash_ids``: one id per ``block_size``-token block of the prompt (default
    512, Mooncake's), so ``len(hash_ids) == ceil(input_length / block_size)``.

    **generic** -- ``output_length`` and the prompt as either

    * ``token_ids``: the prompt's token ids (integers >= 0); matched exactly,
      token by token (``input_length``, if given, must equal their count); or
    * ``hash_ids``: block ids as in Mooncake, with ``block_size`` from the line
      (the same on every line) or ``block_size=`` (``--block-size``), and
      ``input_length`` optional (default ``len(hash_ids) * block_size``).

    ``timestamp`` (ms) is optional in the generic format, but on every line or
    on none (then the file order is the arrival order and there are no arrival
    times: :attr:`Workload.has_timestamps` is False). Every line of a file uses
    the same prompt field.

    ``format="auto"`` reads a file as generic when its first line has
    ``token_ids`` or ``block_size``, or lacks one of Mooncake's four fields.
    Requests are ordered by timestamp (stable: equal timestamps keep file
    order); ``limit`` keeps the first ``limit`` of that order. ``progress``: a
    tqdm bar over the bytes read, on a terminal only.

    Raises
    ------
    TraceFormatError
        (a ``ValueError``) naming the file and line number of the first bad
        line: not UTF-8 (a UTF-16/32 file is named as such), invalid JSON, a
        missing field, a non-integer or negative value, an id too large to
        expand into int64 tokens, a length that does not match the ids, a
        mixed file; and naming the file when it holds no request.
    OSError
        The file cannot be read; a named trace could not be downloaded
        (:class:`~flatradix.replay.datasets.TraceDownloadError`).
    """
    if format not in ("auto", "mooncake", "generic"):
        raise ValueError(f"format must be 'auto', 'mooncake' or 'generic', got {format!r}")
    if block_size is not None:
        block_size = int(block_size)
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
    from . import datasets

    name = os.fspath(path)
    path = datasets.resolve(name, progress=progress)
    if os.path.isdir(path):
        raise TraceFormatError(f"{path}: is a directory, not a trace file")
    fmt = None if format == "auto" else format
    prompt_field = None          # generic: "token_ids" or "hash_ids"
    has_ts = None
    B = block_size
    max_hash = None
    ts, nin, nout, nblk, flat = [], [], [], [], []
    for lineno, rec in _records(path, progress):
        if fmt is None:
            fmt = _detect(rec)
        if fmt == "mooncake":
            if B is None:
                B = MOONCAKE_BLOCK_SIZE
            missing = [k for k in _FIELDS if k not in rec]
            if missing:
                raise _line_error(path, lineno, f"missing field(s) {', '.join(missing)}")
            t = rec["timestamp"]
            n = _check_int(rec["input_length"], "input_length", path, lineno)
            o = _check_int(rec["output_length"], "output_length", path, lineno)
            h = rec["hash_ids"]
            prompt_field = "hash_ids"
        else:
            has_tok, has_hash = "token_ids" in rec, "hash_ids" in rec
            missing = [k for k in ("output_length",) if k not in rec]
            if not (has_tok or has_hash):
                missing.append("token_ids or hash_ids")
            if missing:
                raise _line_error(path, lineno, f"missing field(s) {', '.join(missing)}")
            if has_tok and has_hash:
                raise _line_error(path, lineno, "has both token_ids and hash_ids; give one")
            field_ = "token_ids" if has_tok else "hash_ids"
            if prompt_field is None:
                prompt_field = field_
            elif field_ != prompt_field:
                raise _line_error(path, lineno, f"has {field_} but the lines before have "
                                                f"{prompt_field}; a trace uses one of them")
            o = _check_int(rec["output_length"], "output_length", path, lineno)
            h = rec[field_]
            if has_tok:
                if block_size is not None and block_size != 1:
                    raise TraceFormatError(f"{path}:{lineno}: token_ids traces take no block "
                                           f"size (got {block_size}); drop --block-size")
                B = 1
                n = len(h) if isinstance(h, list) else 0
                if "input_length" in rec and rec["input_length"] != n:
                    raise _line_error(path, lineno, f"input_length {rec['input_length']!r} but "
                                                    f"token_ids has {_plural(n, 'token')}")
            else:
                lb = rec.get("block_size")
                if lb is not None:
                    lb = _check_int(lb, "block_size", path, lineno)
                    if lb < 1:
                        raise _line_error(path, lineno, "block_size must be >= 1, got 0")
                    if B is not None and lb != B:
                        raise _line_error(path, lineno, f"block_size {lb} but "
                                          + (f"--block-size is {block_size}" if block_size
                                             else f"earlier lines have {B}"))
                    B = lb
                if B is None:
                    raise _line_error(path, lineno, "hash_ids without a block size: give "
                                                    "block_size on the line or --block-size")
                if "input_length" in rec:
                    n = _check_int(rec["input_length"], "input_length", path, lineno)
                else:
                    n = len(h) * B if isinstance(h, list) else 0
            t = rec.get("timestamp")
            if has_ts is None:
                has_ts = t is not None
            elif has_ts != (t is not None):
                raise _line_error(path, lineno, "timestamp on some lines but not others: give "
                                                "it on every line or on none"
                                  if has_ts else "has a timestamp but the lines before have none: "
                                                 "give it on every line or on none")
            if t is None:
                t = 0
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
            raise _line_error(path, lineno, f"timestamp must be a number, got {t!r}")
        if max_hash is None:
            max_hash = (1 << 62) // B  # larger ids overflow int64 tokens once expanded
        if prompt_field == "token_ids":
            _check_ids(h, "token_ids", max_hash, path, lineno, "token id", B)
        else:
            _check_ids(h, "hash_ids", max_hash, path, lineno, "hash id", B)
            need = -(-n // B)
            if len(h) != need:
                raise _line_error(path, lineno,
                                  f"input_length {n:,} needs {_plural(need, 'block')} of {B} "
                                  f"tokens but hash_ids has {_plural(len(h), 'id')}"
                                  + (" (wrong --block-size?)" if fmt == "mooncake" else ""))
        ts.append(t)
        nin.append(n)
        nout.append(o)
        nblk.append(len(h))
        flat.extend(h)
    if not nin:
        raise TraceFormatError(f"{path}: no requests (the file is empty or blank)")
    timestamps = np.asarray(ts, dtype=np.float64)
    input_lengths = np.asarray(nin, dtype=np.int64)
    output_lengths = np.asarray(nout, dtype=np.int64)
    nblk = np.asarray(nblk, dtype=np.int64)
    hash_ids = np.asarray(flat, dtype=np.int64)
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
    w = Workload(name, B, timestamps, input_lengths, output_lengths, ptr, hash_ids,
                 has_timestamps=bool(has_ts) if fmt == "generic" else True,
                 source_format=fmt if prompt_field != "token_ids" else "generic/token_ids")
    return w.head(limit)


def load_mooncake(path, block_size=MOONCAKE_BLOCK_SIZE, limit=None, progress=False):
    """Read a Mooncake JSONL trace: :func:`load_trace` with ``format="mooncake"``
    (``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids``: one id
    per ``block_size``-token block). Raises :class:`TraceFormatError` naming the
    file and line of the first malformed line, or the file when it is empty."""
    return load_trace(path, format="mooncake", block_size=block_size, limit=limit,
                      progress=progress)


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
                    np.array([r[3] for r in reqs], dtype=np.int64), ptr, flat,
                    source_format="synthetic")
