"""Page hash chain for KV events: SHA-256 in nopython mode (only run when events are on).

Per page (SGLang 0.5.23 ``hash_binding.cpp``, ``rust_tree_core_notes.md`` §6):
``digest = SHA-256(prior_digest (32 bytes, if any) || page words)`` where the
words are each token as a little-endian u32 (a bigram unit contributes
``t[i], t[i+1]``). A page holding a token outside ``[0, 2**32)`` is hashed
"wide": a ``0xff`` tag byte, then every token as a little-endian u64 (SGLang
rejects negative tokens; flatradix hashes their two's complement). Each digest
is the prior of the next page; a node's first page chains from its parent's
last page, or from the namespace seed when the parent is the root.

Digests are stored in ``pool[row, HASH0:HASH0 + 4]`` at the first row of each
page, as four int64 words holding the digest's bytes big-endian, so
``pool[row, HASH0]`` *is* the event block hash (first 8 bytes, big-endian,
signed: SGLang's ``hash_str_to_int64``). Rows move only with the pool
compaction, which copies every column.
"""

import numpy as np

from ._jit import helper, kernel
from .layout import E_STALE, HASH0, KEY_LEN, KEY_OFF, M_BIGRAM, M_PAGE, OK, PARENT, ROOT, TOK
from .state import resolve

_K = np.array([
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
], dtype=np.uint64)
_H0 = np.array([0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19], dtype=np.uint64)
_M32 = np.uint64(0xFFFFFFFF)


@helper
def _rotr(x, n):
    return ((x >> np.uint64(n)) | (x << np.uint64(32 - n))) & _M32


@helper
def sha256(msg, nbytes, state, w):
    """SHA-256 of ``msg[:nbytes]`` into ``state`` (8 words). ``msg`` must have room
    for the padding (``nbytes + 72`` bytes); ``w`` is a 64-word scratch."""
    bitlen = np.uint64(nbytes) * np.uint64(8)
    msg[nbytes] = 0x80
    total = ((nbytes + 9 + 63) // 64) * 64
    for i in range(nbytes + 1, total - 8):
        msg[i] = 0
    for i in range(8):
        msg[total - 1 - i] = np.uint8((bitlen >> np.uint64(8 * i)) & np.uint64(0xFF))
    for i in range(8):
        state[i] = _H0[i]
    for blk in range(0, total, 64):
        for t in range(16):
            j = blk + 4 * t
            w[t] = ((np.uint64(msg[j]) << np.uint64(24)) | (np.uint64(msg[j + 1]) << np.uint64(16))
                    | (np.uint64(msg[j + 2]) << np.uint64(8)) | np.uint64(msg[j + 3]))
        for t in range(16, 64):
            s0 = _rotr(w[t - 15], 7) ^ _rotr(w[t - 15], 18) ^ (w[t - 15] >> np.uint64(3))
            s1 = _rotr(w[t - 2], 17) ^ _rotr(w[t - 2], 19) ^ (w[t - 2] >> np.uint64(10))
            w[t] = (w[t - 16] + s0 + w[t - 7] + s1) & _M32
        a, b, c, d = state[0], state[1], state[2], state[3]
        e, f, g, h = state[4], state[5], state[6], state[7]
        for t in range(64):
            s1 = _rotr(e, 6) ^ _rotr(e, 11) ^ _rotr(e, 25)
            ch = (e & f) ^ ((~e & _M32) & g)
            t1 = (h + s1 + ch + _K[t] + w[t]) & _M32
            s0 = _rotr(a, 2) ^ _rotr(a, 13) ^ _rotr(a, 22)
            maj = (a & b) ^ (a & c) ^ (b & c)
            t2 = (s0 + maj) & _M32
            h = g
            g = f
            f = e
            e = (d + t1) & _M32
            d = c
            c = b
            b = a
            a = (t1 + t2) & _M32
        state[0] = (state[0] + a) & _M32
        state[1] = (state[1] + b) & _M32
        state[2] = (state[2] + c) & _M32
        state[3] = (state[3] + d) & _M32
        state[4] = (state[4] + e) & _M32
        state[5] = (state[5] + f) & _M32
        state[6] = (state[6] + g) & _M32
        state[7] = (state[7] + h) & _M32


@helper
def _put_le(msg, pos, v, nbytes):
    for i in range(nbytes):
        msg[pos + i] = np.uint8((v >> np.uint64(8 * i)) & np.uint64(0xFF))
    return pos + nbytes


@helper
def _hash_page(pool, row, units, bigram, p0, p1, p2, p3, has_prior, msg, state, w):
    """Digest of the page starting at ``pool`` row ``row`` into ``state``; the prior
    digest is given as four big-endian int64 words ``p0..p3``."""
    pos = 0
    if has_prior:
        for word in (p0, p1, p2, p3):
            u = np.uint64(word)
            for b in range(8):
                msg[pos + b] = np.uint8((u >> np.uint64(56 - 8 * b)) & np.uint64(0xFF))
            pos += 8
    wide = False
    if not bigram:
        for i in range(units):
            t = pool[row + i, TOK]
            if t < 0 or t > 0xFFFFFFFF:
                wide = True
                break
    if wide:
        msg[pos] = 0xFF
        pos += 1
        for i in range(units):
            pos = _put_le(msg, pos, np.uint64(pool[row + i, TOK]), 8)
    else:
        for i in range(units):
            u = np.uint64(pool[row + i, TOK])
            if bigram:
                pos = _put_le(msg, pos, u >> np.uint64(32), 4)
                pos = _put_le(msg, pos, u & _M32, 4)
            else:
                pos = _put_le(msg, pos, u, 4)
    sha256(msg, pos, state, w)


@kernel
def hash_node(nodes, pool, meta, nid, seed, has_seed, msg, state, w):
    """Compute and store the page digests of node ``nid``. Returns ``(status, pages)``.

    ``seed``: int64[4] namespace seed digest (used when the parent is the root and
    ``has_seed``). ``msg``: uint8 scratch of ``page * 16 + 128`` bytes; ``state``,
    ``w``: uint64 scratch of 8 and 64 words.
    """
    s = resolve(nodes, meta, nid)
    if s < 0:
        return E_STALE, 0
    page = meta[M_PAGE]
    bigram = meta[M_BIGRAM] != 0
    p = nodes[s, PARENT]
    if p != ROOT:
        last = nodes[p, KEY_OFF] + nodes[p, KEY_LEN] - page
        p0, p1 = pool[last, HASH0], pool[last, HASH0 + 1]
        p2, p3 = pool[last, HASH0 + 2], pool[last, HASH0 + 3]
        has_prior = True
    else:
        p0, p1, p2, p3 = seed[0], seed[1], seed[2], seed[3]
        has_prior = has_seed
    off = nodes[s, KEY_OFF]
    n = nodes[s, KEY_LEN]
    for k in range(0, n, page):
        _hash_page(pool, off + k, min(page, n - k), bigram, p0, p1, p2, p3, has_prior, msg, state, w)
        for i in range(4):
            pool[off + k, HASH0 + i] = np.int64((state[2 * i] << np.uint64(32)) | state[2 * i + 1])
        p0, p1 = pool[off + k, HASH0], pool[off + k, HASH0 + 1]
        p2, p3 = pool[off + k, HASH0 + 2], pool[off + k, HASH0 + 3]
        has_prior = True
    return OK, n // page
