"""KV memory per token from a model's ``config.json``, and memory sizes.

:func:`load_model_config` reads a local Hugging Face ``config.json`` (never the
network) into a :class:`KVLayout`: the decoder's layers sorted by what they
keep per request, and the bytes each KV pool needs.

* **Full attention** keeps K and V for every token of the sequence. Bytes per
  token, summed over the full-attention layers (the standard KV-cache size of a
  transformer; e.g. vLLM's and SGLang's per-token "cell size" for MHA/GQA)::

      2 (K and V) x layers x kv_heads x head_dim x dtype bytes

  With multi-head latent attention (DeepSeek-V2/V3: ``kv_lora_rank`` in the
  config) one compressed latent plus the decoupled RoPE key is kept per token
  and layer (DeepSeek-V2 paper, arXiv:2405.04434, section 2.1)::

      layers x (kv_lora_rank + qk_rope_head_dim) x dtype bytes

* **Sliding-window attention** layers keep K and V of the last
  ``sliding_window`` tokens only: the same formula over those layers, per token
  inside the window (:attr:`KVLayout.swa_kv_bytes_per_token`).
* **Linear attention / Mamba** layers keep a fixed-size recurrent state per
  request, whatever its length (:attr:`KVLayout.mamba_state_elements`): a
  convolution state and an SSM (recurrent) state, each in its own dtype as
  SGLang 0.5.23 picks them (``sglang/srt/configs/mamba_utils.py``,
  ``mamba2_state_dtype``), never the KV dtype (``--kv-dtype`` / SGLang's
  ``--kv-cache-dtype`` apply to attention KV only): the conv state is
  :data:`MAMBA_CONV_DTYPE` (bfloat16, SGLang's ``SGLANG_MAMBA_CONV_DTYPE``
  default), the SSM state ``--mamba-ssm-dtype`` when given, else the config's
  ``mamba_ssm_dtype``, else float32 (:meth:`KVLayout.mamba_state_bytes`).

The replay models the full-attention pool: ``--kv-memory`` buys
``kv_memory // full_kv_bytes_per_token`` tokens (rounded down to whole pages).
The Mamba state pool is replayed in the Mamba mode (``--mamba-states N``) in
states; its bytes are reported beside the full-attention pool. The sliding-window pool is
replayed in the SWA mode (``--swa-window``): SGLang sizes it ``R`` times the
full pool (``swa_full_tokens_ratio``), so a token of the full pool costs
``full + R x swa`` bytes and :func:`swa_tokens_for_memory` splits a budget.

Layer layouts understood (first match wins):

=============================  =========================================================
``layer_types``                per-layer list: ``full_attention`` / ``attention``,
                               ``sliding_attention``, ``linear_attention`` / ``mamba``
                               (gemma-2/3, gpt-oss, cohere2, qwen3-next in recent
                               transformers)
``hybrid_override_pattern``    nemotron-h: ``*`` attention, ``M`` Mamba, ``-`` MLP,
                               ``E`` MoE (one character per layer)
``full_attention_interval``    qwen3-next: layer ``i`` is full attention when
                               ``(i + 1) % interval == 0``, linear attention otherwise
``attn_layer_period/offset``   jamba: layer ``i`` is attention when
                               ``i % period == offset``, Mamba otherwise
``sliding_window_pattern``     gemma-3 / cohere2 with ``sliding_window``: layer ``i`` is
                               full attention when ``(i + 1) % pattern == 0``
gemma2 + ``sliding_window``    even layers sliding, odd layers full (transformers'
                               Gemma2 layout)
``sliding_window`` alone       every layer sliding (Mistral-7B-v0.1), unless
                               ``use_sliding_window`` is false (Qwen2); with
                               ``max_window_layers`` only the layers from there on
otherwise                      every layer full attention
=============================  =========================================================

A nested ``text_config`` (gemma-3, multimodal wrappers) is read when the top
level has no layer count. Errors are :class:`ModelConfigError` (a
``ValueError``) naming the file and the key.
"""

import json
import math
import os
import re
from dataclasses import asdict, dataclass, field

#: Bytes per element of a KV dtype name (config ``torch_dtype`` / ``dtype``, ``--kv-dtype``).
DTYPE_BYTES = {
    "float32": 4, "float": 4, "fp32": 4,
    "bfloat16": 2, "float16": 2, "half": 2, "fp16": 2, "bf16": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}

#: Mamba state dtypes SGLang takes (its ``--mamba-ssm-dtype`` choices).
MAMBA_DTYPES = ("float32", "bfloat16", "float16")
#: SGLang's conv-state dtype (``SGLANG_MAMBA_CONV_DTYPE``'s default), whatever the
#: model's or the KV cache's dtype.
MAMBA_CONV_DTYPE = "bfloat16"
#: SGLang's SSM-state dtype when neither ``--mamba-ssm-dtype`` nor the config's
#: ``mamba_ssm_dtype`` names one.
DEFAULT_MAMBA_SSM_DTYPE = "float32"

_FULL, _SWA, _LINEAR, _NONE = "full", "swa", "linear", "none"
_LAYER_TYPE = {
    "full_attention": _FULL, "attention": _FULL, "global_attention": _FULL,
    "sliding_attention": _SWA, "sliding_window_attention": _SWA, "local_attention": _SWA,
    "linear_attention": _LINEAR, "mamba": _LINEAR, "mamba2": _LINEAR,
}
_NEMOTRON = {"*": _FULL, "M": _LINEAR, "-": _NONE, "E": _NONE}


class ModelConfigError(ValueError):
    """A ``config.json`` the KV layout cannot be read from; names the file and key."""


@dataclass(frozen=True)
class KVLayout:
    """What one sequence keeps in KV memory, per pool, for one model.

    Attributes
    ----------
    name : str
        ``model_type`` (or the file name).
    source : str
        The config file read (``""`` when built from ``--kv-bytes-per-token``).
    num_layers : int
        Decoder layers (``num_hidden_layers``).
    layer_kinds : tuple of str
        Per layer: ``"full"``, ``"swa"``, ``"linear"`` (Mamba / linear attention)
        or ``"none"`` (no sequence state: nemotron-h MLP / MoE layers).
    full_attention_layers, sliding_window_layers, linear_attention_layers : int
        Counts of ``layer_kinds``.
    sliding_window : int or None
        Tokens an SWA layer keeps (``None``: no SWA layer).
    num_kv_heads, head_dim : int
        Per attention layer (``num_key_value_heads``; ``head_dim`` or
        ``hidden_size // num_attention_heads``).
    kv_dtype : str
        Element type of the attention KV cache; ``dtype_bytes`` its size (not
        the Mamba state's: ``mamba_conv_dtype`` / ``mamba_ssm_dtype``).
    mla_dim : int or None
        ``kv_lora_rank + qk_rope_head_dim`` for multi-head latent attention.
    full_kv_bytes_per_token : int
        Bytes per token of the full-attention pool (module docstring formula over
        the full-attention layers). 0 when the model has none.
    swa_kv_bytes_per_token : int
        The same over the sliding-window layers, for each token inside the window.
    mamba_state_elements : dict or None
        Per request, all linear layers together: ``{"conv": n, "ssm": n}``
        elements (``None`` when the model has no linear layer or the config
        lacks the sizes). Bytes: :meth:`mamba_state_bytes`.
    notes : tuple of str
        How the layout was read (for the report).
    mamba_conv_dtype, mamba_ssm_dtype : str
        Element types of the convolution and the SSM state, as SGLang picks
        them (module docstring): bfloat16 and, by default, float32.
    """

    name: str
    source: str
    num_layers: int
    layer_kinds: tuple
    sliding_window: object
    num_kv_heads: int
    head_dim: int
    kv_dtype: str
    dtype_bytes: int
    mla_dim: object = None
    mamba_state_elements: object = None
    notes: tuple = field(default_factory=tuple)
    mamba_conv_dtype: str = MAMBA_CONV_DTYPE
    mamba_ssm_dtype: str = DEFAULT_MAMBA_SSM_DTYPE

    @property
    def full_attention_layers(self):
        return self.layer_kinds.count(_FULL)

    @property
    def sliding_window_layers(self):
        return self.layer_kinds.count(_SWA)

    @property
    def linear_attention_layers(self):
        return self.layer_kinds.count(_LINEAR)

    def _bytes_per_layer(self):
        if self.mla_dim is not None:
            return self.mla_dim * self.dtype_bytes
        return 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def full_kv_bytes_per_token(self):
        return self.full_attention_layers * self._bytes_per_layer()

    @property
    def swa_kv_bytes_per_token(self):
        return self.sliding_window_layers * self._bytes_per_layer()

    def mamba_state_bytes(self, conv_bytes=None, ssm_bytes=None):
        """Bytes of one request's Mamba / linear-attention state (``None`` if unknown).

        ``conv elements x conv dtype bytes + SSM elements x SSM dtype bytes``.
        ``conv_bytes`` / ``ssm_bytes``: element sizes of the convolution and the
        recurrent (SSM) state; default those of ``mamba_conv_dtype`` and
        ``mamba_ssm_dtype`` (SGLang's: bfloat16 and float32 unless the config or
        ``--mamba-ssm-dtype`` says otherwise), never the KV dtype.
        """
        if self.mamba_state_elements is None:
            return None
        c = DTYPE_BYTES[self.mamba_conv_dtype] if conv_bytes is None else conv_bytes
        s = DTYPE_BYTES[self.mamba_ssm_dtype] if ssm_bytes is None else ssm_bytes
        return self.mamba_state_elements["conv"] * c + self.mamba_state_elements["ssm"] * s

    def to_dict(self):
        d = asdict(self)
        d["layer_kinds"] = "".join({_FULL: "F", _SWA: "S", _LINEAR: "L", _NONE: "-"}[k]
                                   for k in self.layer_kinds)
        d["notes"] = list(self.notes)
        d.update(full_attention_layers=self.full_attention_layers,
                 sliding_window_layers=self.sliding_window_layers,
                 linear_attention_layers=self.linear_attention_layers,
                 full_kv_bytes_per_token=self.full_kv_bytes_per_token,
                 swa_kv_bytes_per_token=self.swa_kv_bytes_per_token,
                 mamba_state_bytes=self.mamba_state_bytes())
        return d

    def describe(self, swa_replayed=False, mamba_replayed=False):
        """Text lines for the report (``swa_replayed``: the replay models the SWA
        pool too, ``--swa-window``; ``mamba_replayed``: the Mamba state pool,
        ``--mamba-states``)."""
        kinds = [f"{self.full_attention_layers} full attention"]
        if self.sliding_window_layers:
            kinds.append(f"{self.sliding_window_layers} sliding window "
                         f"({self.sliding_window:,} tokens)")
        if self.linear_attention_layers:
            kinds.append(f"{self.linear_attention_layers} linear attention / Mamba")
        other = self.num_layers - (self.full_attention_layers + self.sliding_window_layers
                                   + self.linear_attention_layers)
        if other:
            kinds.append(f"{other} without sequence state")
        per_layer = (f"{self.mla_dim} latent x {self.dtype_bytes} B" if self.mla_dim is not None
                     else f"2 x {self.num_kv_heads} KV heads x {self.head_dim} x "
                          f"{self.dtype_bytes} B")
        lines = [f"model {self.name}: {self.num_layers} layers: {', '.join(kinds)}; "
                 f"KV {self.kv_dtype}",
                 f"full-attention KV {self.full_kv_bytes_per_token:,} bytes/token "
                 f"({self.full_attention_layers} layers x {per_layer})"]
        if self.sliding_window_layers:
            lines.append(f"sliding-window KV {self.swa_kv_bytes_per_token:,} bytes/token, for "
                         f"the last {self.sliding_window:,} tokens of a request (own pool; "
                         f"{'replayed' if swa_replayed else 'not replayed'})")
        if self.linear_attention_layers:
            b = self.mamba_state_bytes()
            done = "replayed" if mamba_replayed else "not replayed"
            lines.append("Mamba state " + (f"{b:,} bytes/request (conv {self.mamba_conv_dtype}, "
                                           f"SSM {self.mamba_ssm_dtype}; own pool; {done})"
                                           if b is not None else f"size unknown ({done})"))
        lines += list(self.notes)
        return lines


def _get(cfg, path, *keys, default=None, required=True):
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    if required:
        raise ModelConfigError(f"{path}: no {' / '.join(keys)} in the config")
    return default


def _pos_int(v, path, key):
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ModelConfigError(f"{path}: {key} must be an integer >= 1, got {v!r}")
    return v


def _layer_kinds(cfg, path, n, notes):
    window = cfg.get("sliding_window")
    if cfg.get("use_sliding_window") is False:
        window = None
    lt = cfg.get("layer_types")
    if lt is not None:
        if not isinstance(lt, list) or len(lt) != n:
            raise ModelConfigError(f"{path}: layer_types must list {n} layer types "
                                   f"(num_hidden_layers), got "
                                   f"{len(lt) if isinstance(lt, list) else type(lt).__name__}")
        kinds = []
        for t in lt:
            k = _LAYER_TYPE.get(str(t).lower())
            if k is None:
                raise ModelConfigError(f"{path}: unknown layer type {t!r} in layer_types "
                                       f"(known: {', '.join(sorted(_LAYER_TYPE))})")
            kinds.append(k)
        notes.append("layout from layer_types")
        return kinds
    pat = cfg.get("hybrid_override_pattern")
    if pat is not None:
        if not isinstance(pat, str) or len(pat) != n or set(pat) - set(_NEMOTRON):
            raise ModelConfigError(f"{path}: hybrid_override_pattern must be {n} characters "
                                   f"of '*', 'M', '-', 'E', got {pat!r}")
        notes.append("layout from hybrid_override_pattern")
        return [_NEMOTRON[c] for c in pat]
    if cfg.get("full_attention_interval") is not None:
        k = _pos_int(cfg["full_attention_interval"], path, "full_attention_interval")
        notes.append(f"layout from full_attention_interval {k}")
        return [_FULL if (i + 1) % k == 0 else _LINEAR for i in range(n)]
    if cfg.get("attn_layer_period") is not None:
        p = _pos_int(cfg["attn_layer_period"], path, "attn_layer_period")
        off = cfg.get("attn_layer_offset", 0)
        notes.append(f"layout from attn_layer_period {p}, offset {off}")
        return [_FULL if i % p == off else _LINEAR for i in range(n)]
    if window is None:
        return [_FULL] * n
    if cfg.get("sliding_window_pattern") is not None:
        p = _pos_int(cfg["sliding_window_pattern"], path, "sliding_window_pattern")
        notes.append(f"layout from sliding_window_pattern {p}")
        return [_FULL if (i + 1) % p == 0 else _SWA for i in range(n)]
    if str(cfg.get("model_type", "")).lower() == "gemma2":
        notes.append("layout: gemma2 alternates sliding (even) and full (odd) layers")
        return [_SWA if i % 2 == 0 else _FULL for i in range(n)]
    if cfg.get("use_sliding_window") and cfg.get("max_window_layers") is not None:
        m = int(cfg["max_window_layers"])
        notes.append(f"layout: sliding window from layer {m} on (max_window_layers)")
        return [_SWA if i >= m else _FULL for i in range(n)]
    notes.append("layout: sliding_window with no layer pattern, so every layer slides")
    return [_SWA] * n


def _mamba_elements(cfg, kinds):
    """Per-request state elements of all linear layers, or None (sizes missing)."""
    nlin = kinds.count(_LINEAR)
    if not nlin:
        return None
    try:
        if "linear_num_value_heads" in cfg:          # qwen3-next gated delta net
            nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
            dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
            kern = cfg["linear_conv_kernel_dim"]
            conv = (2 * nk * dk + nv * dv) * (kern - 1)
            ssm = nv * dk * dv
        elif "mamba_num_heads" in cfg:                # Mamba-2 (nemotron-h)
            h, d = cfg["mamba_num_heads"], cfg["mamba_head_dim"]
            st, g = cfg["ssm_state_size"], cfg.get("n_groups", 1)
            kern = cfg["conv_kernel"]
            conv = (h * d + 2 * g * st) * (kern - 1)
            ssm = h * d * st
        elif "mamba_d_state" in cfg:                  # Mamba-1 (jamba)
            inner = cfg["mamba_expand"] * cfg["hidden_size"]
            conv = inner * (cfg["mamba_d_conv"] - 1)
            ssm = inner * cfg["mamba_d_state"]
        else:
            return None
    except (KeyError, TypeError):
        return None
    return {"conv": int(conv) * nlin, "ssm": int(ssm) * nlin}


def _mamba_ssm_dtype(top, given, notes):
    """The SSM state's dtype as SGLang's ``mamba2_state_dtype`` picks it: ``given``
    (``--mamba-ssm-dtype``), else the config's ``mamba_ssm_dtype`` (a nested
    ``text_config``'s first), else float32 (also for a value SGLang does not take)."""
    if given is not None:
        if given not in MAMBA_DTYPES:
            raise ValueError(f"mamba_ssm_dtype must be one of {', '.join(MAMBA_DTYPES)}, got "
                             f"{given!r}")
        return given
    text = top.get("text_config")
    src = text if isinstance(text, dict) and "mamba_ssm_dtype" in text else top
    v = src.get("mamba_ssm_dtype")
    if v is None:
        return DEFAULT_MAMBA_SSM_DTYPE
    if v not in MAMBA_DTYPES:
        notes.append(f"mamba_ssm_dtype {v!r} is not one SGLang takes ({', '.join(MAMBA_DTYPES)}): "
                     f"{DEFAULT_MAMBA_SSM_DTYPE}, as SGLang")
        return DEFAULT_MAMBA_SSM_DTYPE
    return v


def kv_layout_from_dict(cfg, path="config.json", kv_dtype="auto", mamba_ssm_dtype=None):
    """:class:`KVLayout` of a parsed ``config.json`` dict (see :func:`load_model_config`)."""
    if not isinstance(cfg, dict):
        raise ModelConfigError(f"{path}: expected a JSON object")
    top = cfg
    if not any(k in cfg for k in ("num_hidden_layers", "n_layer", "num_layers")) \
            and isinstance(cfg.get("text_config"), dict):
        cfg = dict(cfg["text_config"])
        for k in ("torch_dtype", "dtype"):
            if k not in cfg and k in top:
                cfg[k] = top[k]
    notes = []
    name = str(top.get("model_type") or cfg.get("model_type") or os.path.basename(path))
    n = _pos_int(_get(cfg, path, "num_hidden_layers", "n_layer", "num_layers"), path,
                 "num_hidden_layers")
    heads = _pos_int(_get(cfg, path, "num_attention_heads", "n_head"), path,
                     "num_attention_heads")
    kvh = _pos_int(_get(cfg, path, "num_key_value_heads", default=heads, required=False), path,
                   "num_key_value_heads")
    hd = cfg.get("head_dim")
    if hd is None:
        hidden = _pos_int(_get(cfg, path, "hidden_size", "n_embd"), path, "hidden_size")
        if hidden % heads:
            raise ModelConfigError(f"{path}: no head_dim, and hidden_size {hidden} is not a "
                                   f"multiple of num_attention_heads {heads}")
        hd = hidden // heads
    hd = _pos_int(hd, path, "head_dim")
    if kv_dtype in (None, "auto"):
        kv_dtype = str(_get(cfg, path, "torch_dtype", "dtype", default="bfloat16",
                            required=False))
        if "torch_dtype" not in cfg and "dtype" not in cfg:
            notes.append("no torch_dtype in the config: bfloat16 assumed")
    kv_dtype = str(kv_dtype).lower().replace("torch.", "")
    if kv_dtype not in DTYPE_BYTES:
        raise ModelConfigError(f"{path}: unknown KV dtype {kv_dtype!r} "
                               f"(known: {', '.join(sorted(DTYPE_BYTES))})")
    mla = None
    if cfg.get("kv_lora_rank"):
        mla = _pos_int(cfg["kv_lora_rank"], path, "kv_lora_rank") + int(
            cfg.get("qk_rope_head_dim", 0))
        notes.append("multi-head latent attention: kv_lora_rank + qk_rope_head_dim per layer")
    kinds = _layer_kinds(cfg, path, n, notes)
    window = None
    if _SWA in kinds:
        window = _pos_int(cfg.get("sliding_window"), path, "sliding_window")
    # (a config without linear layers keeps no state: no note about its dtype)
    ssm_dtype = _mamba_ssm_dtype(top, mamba_ssm_dtype, notes if _LINEAR in kinds else [])
    return KVLayout(name=name, source=os.fspath(path), num_layers=n, layer_kinds=tuple(kinds),
                    sliding_window=window, num_kv_heads=kvh, head_dim=hd, kv_dtype=kv_dtype,
                    dtype_bytes=DTYPE_BYTES[kv_dtype], mla_dim=mla,
                    mamba_state_elements=_mamba_elements(cfg, kinds), notes=tuple(notes),
                    mamba_ssm_dtype=ssm_dtype)


def load_model_config(path, kv_dtype="auto", mamba_ssm_dtype=None):
    """:class:`KVLayout` of a local Hugging Face ``config.json`` (a file, or a
    directory holding one). ``kv_dtype``: the attention KV cache's, ``"auto"``
    (the config's ``torch_dtype``, else bfloat16) or a name of
    :data:`DTYPE_BYTES`. ``mamba_ssm_dtype``: the SSM state's (SGLang's
    ``--mamba-ssm-dtype``, one of :data:`MAMBA_DTYPES`); ``None``: the
    config's ``mamba_ssm_dtype``, else float32, as SGLang. The conv state is
    always :data:`MAMBA_CONV_DTYPE`.

    Raises :class:`ModelConfigError` (unreadable file, invalid JSON, a missing
    or invalid key), ``ValueError`` for a ``mamba_ssm_dtype`` not in
    :data:`MAMBA_DTYPES`, and ``OSError`` for a missing file.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        cfg = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ModelConfigError(f"{path}: invalid JSON ({e})") from None
    return kv_layout_from_dict(cfg, path, kv_dtype, mamba_ssm_dtype)


# ---------------------------------------------------------------- memory sizes
_MEM_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
              "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_MEM_RE = re.compile(r"^\s*([0-9][0-9_]*(?:\.[0-9]*)?(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$")


def is_memory_size(text):
    """Whether ``text`` is written as a memory size (ends in a byte unit: B, GB, GiB...)."""
    m = _MEM_RE.match(str(text).lower())
    return bool(m) and m.group(2) in _MEM_UNITS


def parse_memory(text):
    """``"40GiB"`` -> 42949672960; units B, kB/MB/GB/TB (powers of 1000) and
    KiB/MiB/GiB/TiB (powers of 1024), none for bytes; a whole number of bytes >= 1.

    Raises ``ValueError`` (also for ``"40G"``: say GiB or GB).
    """
    s = str(text).strip().lower()
    if s.startswith("-"):
        raise ValueError(f"expected a memory size >= 1 byte (such as 40GiB), got {text!r}: "
                         f"a size is never negative")
    m = _MEM_RE.match(s)
    if m and m.group(2) == "":       # a bare number is bytes
        s += "b"
        m = _MEM_RE.match(s)
    if not m or m.group(2) not in _MEM_UNITS:
        hint = ""
        if m and m.group(2) in ("k", "m", "g", "t"):
            hint = f" (write {m.group(1)}{m.group(2).upper()}iB or {m.group(1)}{m.group(2).upper()}B)"
        raise ValueError(f"expected a memory size such as 40GiB, 512MiB or 80GB, got "
                         f"{text!r}{hint}")
    v = float(m.group(1).replace("_", "")) * _MEM_UNITS[m.group(2)]
    if not math.isfinite(v) or v < 1 or v != int(v):
        raise ValueError(f"expected a whole number of bytes >= 1, got {text!r}")
    return int(v)


def format_bytes(n):
    """``42949672960`` -> ``"40 GiB"`` (binary units, 3 significant digits; 1000 to
    1023 units whole: ``"1024 MiB"``, not ``"1.02e+03 MiB"``)."""
    n = float(n)
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            v = n / size
            return f"{v:.3g} {unit}" if v < 999.5 else f"{v:.0f} {unit}"
    return f"{n:.0f} B"


def swa_tokens_for_memory(kv_bytes, full_bytes_per_token, swa_bytes_per_token, ratio,
                          page_size=1):
    """``(full_tokens, swa_tokens)`` of a hybrid SWA model's two KV pools in
    ``kv_bytes`` when the SWA pool is ``ratio`` times the full pool (SGLang's
    ``swa_full_tokens_ratio``), as SGLang's pool configurator sizes them::

        full_tokens = kv_bytes / (full_bytes_per_token + ratio * swa_bytes_per_token)
        swa_tokens  = full_tokens * ratio

    each rounded down to whole pages of ``page_size`` tokens (so
    ``full_tokens * full + swa_tokens * swa <= kv_bytes``). ``ValueError`` for
    a ratio outside ``(0, 1]``, bytes per token below 1 (full) or 0 (SWA), or
    when either pool is less than one page."""
    if not 0 < ratio <= 1:
        raise ValueError(f"swa ratio must be in (0, 1], got {ratio!r}")
    if full_bytes_per_token < 1 or swa_bytes_per_token < 0:
        raise ValueError(f"bytes per token must be >= 1 (full) and >= 0 (SWA), got "
                         f"{full_bytes_per_token} and {swa_bytes_per_token}")
    cell = full_bytes_per_token + ratio * swa_bytes_per_token
    full = int(int(kv_bytes) // cell)
    full -= full % page_size

    def swa_of(f):
        t = int(f * ratio)
        return t - t % page_size

    # float rounding: step down a page until both pools fit the budget
    while full > 0 and full * full_bytes_per_token + swa_of(full) * swa_bytes_per_token \
            > int(kv_bytes):
        full -= page_size
    swa = swa_of(full)
    if full < page_size or swa < page_size:
        raise ValueError(f"{format_bytes(kv_bytes)} at {full_bytes_per_token:,} + {ratio:g} x "
                         f"{swa_bytes_per_token:,} bytes/token holds {max(full, 0):,} full and "
                         f"{max(swa, 0):,} sliding-window tokens: less than one page of "
                         f"{page_size}")
    return full, swa


def tokens_for_memory(kv_bytes, bytes_per_token, page_size=1):
    """Tokens a KV pool of ``kv_bytes`` holds: ``kv_bytes // bytes_per_token``,
    rounded down to whole pages of ``page_size`` tokens (a paged pool holds
    whole pages). ``ValueError`` when that is not even one page."""
    if bytes_per_token < 1:
        raise ValueError(f"bytes per token must be >= 1, got {bytes_per_token}")
    t = int(kv_bytes) // int(bytes_per_token)
    t -= t % page_size
    if t < page_size:
        raise ValueError(f"{format_bytes(kv_bytes)} at {bytes_per_token:,} bytes/token holds "
                         f"{int(kv_bytes) // int(bytes_per_token):,} tokens, less than one page "
                         f"of {page_size}")
    return t
