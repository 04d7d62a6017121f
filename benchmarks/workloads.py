"""Seeded workload generators shared by every benchmark.

Frozen: a generator's output for given arguments must never change (results
across commits and machines are compared). Add new generators; do not edit old
ones.

* ``prefix_sharing_sequences`` - SGLang's own radix-cache benchmark shape
  (``bench_unified_radix_cache.py``: "chain growth" then "fan-out bursts"):
  5,000 sequences of ~1,300 tokens, 650k distinct tree tokens at the defaults.
* ``match_queries`` - 1/3 full hits, 1/3 partial hits, 1/3 misses.
* ``request_splits`` - prompt / output split of each sequence (request paths).
* ``SequenceStream`` - an endless numpy stream of the same shape, for trees of
  any size (asv at 100k / 1M tokens, the 100k..10M scaling curve).
"""

import random

import numpy as np

VOCAB = 32000


def prefix_sharing_sequences(num_seqs=5000, chunk_len=256, vocab=VOCAB, seed=42):
    """``num_seqs + 1`` token lists with tree-shaped prefix sharing (Python ints).

    All descend from one root prefix of ``chunk_len // 4`` random tokens. The
    first half grows chains: a random earlier sequence plus a run of one random
    token, 1..chunk_len long. The second half adds fan-out bursts: 2..10
    children of one random earlier sequence, each with its own run. Shuffled.
    """
    rng = random.Random(seed)
    root = [rng.randint(1, vocab) for _ in range(max(1, chunk_len // 4))]
    seqs = [root]
    for _ in range(num_seqs // 2):
        parent = rng.choice(seqs)
        run = rng.randint(1, chunk_len)
        seqs.append(parent + [rng.randint(1, vocab)] * run)
    left = num_seqs - num_seqs // 2
    while left > 0:
        fan = min(rng.randint(2, 10), left)
        parent = rng.choice(seqs)
        for _ in range(fan):
            run = rng.randint(1, chunk_len)
            seqs.append(parent + [rng.randint(1, vocab)] * run)
        left -= fan
    rng.shuffle(seqs)
    return seqs


def match_queries(seqs, populated, n, vocab=VOCAB, seed=123):
    """``n`` match keys against a tree holding ``seqs[:populated]``.

    Exactly one third each, interleaved: a cached sequence (full hit), a cached
    sequence plus 10..100 random tokens (partial hit), 50..300 random tokens
    (miss). Returns ``(queries, kinds)``; kinds are "hit" / "partial" / "miss".
    """
    rng = random.Random(seed)
    out, kinds = [], []
    for i in range(n):
        kind = ("hit", "partial", "miss")[i % 3]
        if kind == "hit":
            q = seqs[rng.randrange(populated)]
        elif kind == "partial":
            base = seqs[rng.randrange(populated)]
            q = base + [rng.randint(1, vocab) for _ in range(rng.randint(10, 100))]
        else:
            q = [rng.randint(1, vocab) for _ in range(rng.randint(50, 300))]
        out.append(q)
        kinds.append(kind)
    return out, kinds


def request_splits(seqs, max_output=128, seed=7):
    """``(prompt, output)`` per sequence: the last 1..max_output tokens are the
    output (at least one prompt token is kept). A finished request commits
    ``len(prompt) + len(output) - 1`` tokens (the last sampled one has no KV)."""
    rng = random.Random(seed)
    out = []
    for s in seqs:
        k = rng.randint(1, max(1, min(max_output, len(s) - 1)))
        out.append((s[:-k], s[-k:]))
    return out


class SequenceStream:
    """Endless seeded stream of prefix-sharing int64 sequences (numpy).

    Same shape as ``prefix_sharing_sequences`` (chains and fan-out bursts of
    1..chunk_len-token suffixes under one root prefix) but with random suffix
    tokens and a bounded reservoir of parents, so trees of 10M+ tokens can be
    generated without holding every sequence. Sequences longer than
    ``max_len`` restart from the root prefix (keeps lengths near ~1-2k).
    """

    def __init__(self, seed=0, chunk_len=256, vocab=VOCAB, reservoir=4096, max_len=4096):
        self.rng = np.random.default_rng(seed)
        self.chunk_len = chunk_len
        self.vocab = vocab
        self.reservoir_cap = reservoir
        self.max_len = max_len
        self.root = self.rng.integers(1, vocab + 1, size=max(1, chunk_len // 4), dtype=np.int64)
        self.reservoir = [self.root]
        self.count = 0

    def _child(self, parent):
        n = int(self.rng.integers(1, self.chunk_len + 1))
        if parent.shape[0] + n > self.max_len:
            parent = self.root
        suffix = self.rng.integers(1, self.vocab + 1, size=n, dtype=np.int64)
        return np.concatenate([parent, suffix])

    def _keep(self, seq):
        self.count += 1
        if len(self.reservoir) < self.reservoir_cap:
            self.reservoir.append(seq)
        else:
            j = int(self.rng.integers(0, self.count))
            if j < self.reservoir_cap:
                self.reservoir[j] = seq

    def batch(self):
        """A list of 1 (chain) or 2..10 (fan-out) new sequences, 50/50."""
        parent = self.reservoir[int(self.rng.integers(0, len(self.reservoir)))]
        fan = 1 if self.rng.random() < 0.5 else int(self.rng.integers(2, 11))
        out = [self._child(parent) for _ in range(fan)]
        for s in out:
            self._keep(s)
        return out

    def sample(self, n, seed=1):
        """``n`` sequences drawn from the reservoir (already generated: cached
        unless evicted since)."""
        r = np.random.default_rng(seed)
        return [self.reservoir[int(i)] for i in r.integers(0, len(self.reservoir), size=n)]

    def misses(self, n, seed=2):
        r = np.random.default_rng(seed)
        return [r.integers(self.vocab + 1, 2 * self.vocab, size=int(r.integers(50, 301)),
                           dtype=np.int64) for _ in range(n)]

    def match_keys(self, n, seed=3):
        """``n`` match keys, interleaved thirds: reservoir sequences (full hits
        unless evicted since), the same plus 10..100 tokens never generated
        (partial hits), 50..300 such tokens (misses)."""
        r = np.random.default_rng(seed)
        k = n // 3 + 1
        hits = self.sample(k, seed=seed)
        part = [np.concatenate([s, r.integers(2 * self.vocab, 3 * self.vocab, size=int(r.integers(10, 101)),
                                              dtype=np.int64)])
                for s in self.sample(k, seed=seed + 1)]
        miss = self.misses(k, seed=seed + 2)
        return [(hits, part, miss)[i % 3][i // 3] for i in range(n)]


def fill_to(cache, alloc, stream, target_tokens, insert_params, radix_key):
    """Insert stream sequences into ``cache`` until it holds ``target_tokens``.

    ``alloc`` hands out one KV slot per token (duplicates are freed by the
    cache). Returns the number of sequences inserted."""
    n = 0
    while cache.total_size()[0] < target_tokens:
        for seq in stream.batch():
            v = alloc.alloc(seq.shape[0])
            if v is None:
                raise MemoryError("KV pool exhausted while filling the tree")
            cache.insert(insert_params(key=radix_key(seq), value=v))
            n += 1
    return n
