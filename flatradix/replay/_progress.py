"""The replay's progress bars: tqdm on stderr, only when stderr is a terminal and
tqdm is installed (``flatradix[replay]``); ``None`` otherwise."""

import sys


def progress_bar(total, enabled, **kwargs):
    """A ``tqdm`` bar of ``total`` steps on stderr (``leave=False``), or ``None``."""
    if not enabled or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, file=sys.stderr, leave=False, **kwargs)
