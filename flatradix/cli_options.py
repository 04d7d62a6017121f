"""The command line's option types: argparse ``type=`` callables that turn one
option's text into its value or raise ``argparse.ArgumentTypeError`` with a
one-line reason (argparse prefixes the option's name).

Counts (``2M``, ``500k``, ``2,000,000``), memory sizes (``40GiB``), lists
(``512,1024``: a three-digit group after a comma is refused as thousands
grouping), windows, state and host pools, ratios, policies.
"""

import argparse
import math
import re
import sys

#: Eviction policies the replay takes (the cache's ``eviction_policy`` names).
POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru", "tlru", "opt")
#: Fleet routers (``--router``).
ROUTERS = ("kv", "prefix-hash", "least-loaded", "round-robin", "random")


def int_at_least(lo):
    """An integer >= ``lo``."""
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"expected an integer >= {lo}, got {v}")
        return v
    return parse


positive_int = int_at_least(1)
nonnegative_int = int_at_least(0)


def mamba_chunk(text):
    """``--mamba-chunk``: an integer in [1, MAX_MAMBA_CHUNK] (the cache takes
    ``mamba_cache_chunk_size`` below 2**62)."""
    from .replay.config import MAX_MAMBA_CHUNK

    try:
        v = int(text.strip().replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not 1 <= v <= MAX_MAMBA_CHUNK:
        raise argparse.ArgumentTypeError(f"expected a chunk in tokens, an integer >= 1 and "
                                         f"<= {MAX_MAMBA_CHUNK:,} (2**62 - 1), got {text!r}")
    return v


def positive_float(text):
    """A finite number > 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (0 < v < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return v


def nonnegative_float(text):
    """A finite number >= 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (0 <= v < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return v


def capacity(text):
    """A token count (``2M``, ``2,000,000``) or ``inf`` (``None``)."""
    from .replay.report import parse_capacity

    try:
        return parse_capacity(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def memory(text):
    """A memory size (``40GiB``, ``80GB``) in bytes."""
    from .replay.model import parse_memory

    try:
        return parse_memory(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def list_items(text, nouns, example):
    """``text.split(",")``, refusing a list whose item after a comma is a group of three
    digits with a leading zero (``1,024``, ``1,000,000``): thousands grouping, which
    would otherwise be read as several values (1 and 24)."""
    items = text.split(",")
    for t in items[1:]:
        t = t.strip()
        if len(t) == 3 and t.isdigit() and t[0] == "0":
            raise argparse.ArgumentTypeError(
                f"{text!r}: commas separate {nouns} here ({example}); write a number "
                f"without its thousands commas (4096, not 4,096)")
    return items


def sweep_items(text):
    """``2M,64GiB,inf`` -> [("tokens", 2000000), ("bytes", 68719476736), ("tokens", None)]."""
    from .replay.model import is_memory_size

    items = []
    for t in list_items(text, "capacities", "1M,2M,64GiB"):
        if not t.strip():
            continue
        items.append(("bytes", memory(t)) if is_memory_size(t) else ("tokens", capacity(t)))
    if not items:
        raise argparse.ArgumentTypeError("needs at least one capacity")
    return items


def int_list(text, noun, what, example, largest, alternative=""):
    """``512,1024`` -> [512, 1024]: integers in [1, largest], duplicates dropped;
    ``noun`` / ``what`` name one in the errors ("window", "a window in tokens")."""
    out = []
    for t in list_items(text, noun + "s", example):
        if not t.strip():
            continue
        try:
            v = int(t.strip().replace("_", ""))
        except ValueError:
            v = -1
        if not 1 <= v <= largest:
            limit = "" if v < 1 else f" and <= {largest:,}"
            raise argparse.ArgumentTypeError(
                f"expected {what}, an integer >= 1{limit} (several comma-separated: {example})"
                f"{alternative}, got {t.strip()!r}")
        out.append(v)
    if not out:
        raise argparse.ArgumentTypeError(f"needs at least one {noun}")
    return list(dict.fromkeys(out))


def swa_windows(text):
    """``512,1024,4096`` -> [512, 1024, 4096]; ``model`` -> ["model"] (the window of
    --model-config). Integers >= 1."""
    if text.strip().lower() == "model":
        return ["model"]
    from .replay.config import MAX_SWA_WINDOW

    return int_list(text, "window", "a window in tokens", "512,1024,4096", MAX_SWA_WINDOW,
                    alternative=", or 'model'")


def mamba_states(text):
    """``256,1024`` -> [256, 1024]: state pools, integers in [1, MAX_CAPACITY]."""
    from .replay.report import MAX_CAPACITY

    return int_list(text, "state count", "a number of states", "256,1024", MAX_CAPACITY)


def host_capacities(text):
    """``0,2M,8M,inf`` -> [0, 2000000, 8000000, math.inf]: host pools in tokens,
    0 (no host slot) and ``inf`` (as large as the workload can use) allowed;
    duplicates dropped."""
    from .replay.report import parse_capacity

    out = []
    for t in list_items(text, "host capacities", "0,2M,8M"):
        if not t.strip():
            continue
        core = t.strip().lower().replace("_", "")
        core = core[:-1] if core[-1:] in ("k", "m", "g", "t") else core
        try:
            zero = float(core) == 0
        except ValueError:
            zero = False
        if zero:
            out.append(0)
            continue
        try:
            v = parse_capacity(t)
        except ValueError as e:
            raise argparse.ArgumentTypeError(
                str(e).replace("capacity", "host capacity", 1).replace(">= 1", ">= 0")) from None
        out.append(math.inf if v is None else v)
    if not out:
        raise argparse.ArgumentTypeError("needs at least one host capacity")
    return list(dict.fromkeys(out))


def count_of(unit):
    """An argparse type for ``--swa-host-capacity`` (tokens) / ``--mamba-host-states``
    (states): one whole count >= 1 (``4096``, ``2M``, ``500k``, ``2,000,000``), not
    ``inf``; errors name ``unit``."""
    from .replay.report import MAX_CAPACITY, CapacityTooLarge, parse_capacity

    def parse(text):
        try:
            v = parse_capacity(text)
        except CapacityTooLarge:
            raise argparse.ArgumentTypeError(
                f"{text!r} is more than the largest pool ({MAX_CAPACITY:,} {unit})") from None
        except ValueError:
            v = None
        if v is None:
            raise argparse.ArgumentTypeError(
                f"expected one whole number of {unit} >= 1 (e.g. 4096, 2M, 500k), got {text!r}")
        return v

    parse.__name__ = f"count of {unit}"  # argparse names the type in some messages
    return parse


def swa_ratio(text):
    """A number in (0, 1]: the SWA pool / the full pool."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from None
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1] (SWA pool / full pool, "
                                         f"as SGLang's --swa-full-tokens-ratio), got {text!r}")
    return v


def _choices(text, allowed):
    """``text`` split at commas, each lowered and one of ``allowed``."""
    out = []
    for t in text.split(","):
        v = t.strip().lower()
        if v not in allowed:
            raise argparse.ArgumentTypeError(f"invalid choice {t.strip()!r} (choose from "
                                             f"{', '.join(allowed)}; any case)")
        out.append(v)
    return out


def routers(text):
    """``kv,round-robin`` -> ["kv", "round-robin"]: fleet routers, any case."""
    return list(dict.fromkeys(_choices(text, ROUTERS)))


def instance_counts(text):
    """``2,4,8`` -> [2, 4, 8]: fleet sizes, integers in [1, 4096]."""
    return int_list(text, "instance count", "a number of instances", "2,4,8", 4096)


#: ``--backend`` names: joblib's process backend, Dask's distributed scheduler, Ray.
BACKENDS = ("loky", "dask", "ray")


def backend(text):
    """``dask:tcp://10.0.0.5:8786`` -> ("dask", "tcp://10.0.0.5:8786"); ``loky`` ->
    ("loky", None)."""
    name, _, address = text.strip().partition(":")
    name = name.lower()
    if name not in BACKENDS or (name == "loky" and address):
        raise argparse.ArgumentTypeError(f"expected one of loky, dask[:ADDRESS], ray[:ADDRESS], "
                                         f"got {text!r}")
    return name, address or None


def policies(text):
    """``lru,LFU`` -> ["lru", "lfu"]: eviction policies, any case."""
    return _choices(text, POLICIES)


class UsageError(Exception):
    """A user's mistake: reported as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block), exit status 2, no
    abbreviated options (``--cap`` is not ``--capacity``: an abbreviation would
    silently change meaning when an option is added), and a negative value
    (``--kv-memory -1GiB``) refused by the option's own type, not as "expected
    one argument" (argparse takes ``-1GiB`` for an option)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._argv = []

    def parse_known_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {self._negative_value(message) or message}\n")

    def _negative_value(self, message):
        """The option type's error for a value that looks like a negative number,
        when argparse's ``message`` says the option got no value; else None."""
        m = re.fullmatch(r"argument (\S+): expected one argument", message)
        if not m:
            return None
        names = m.group(1).split("/")
        action = next((a for a in self._actions if set(names) & set(a.option_strings)), None)
        if action is None:
            return None
        argv = self._argv
        at = [i for i, t in enumerate(argv) if t in action.option_strings]
        if not at or at[-1] + 1 >= len(argv):
            return None
        value = argv[at[-1] + 1]
        if not re.match(r"-[0-9.]", value):
            return None
        try:
            if action.type is not None:
                action.type(value)
        except argparse.ArgumentTypeError as e:
            return f"argument {m.group(1)}: {e}"
        return (f"argument {m.group(1)}: a value starting with '-' must be written "
                f"{action.option_strings[-1]}={value}")
