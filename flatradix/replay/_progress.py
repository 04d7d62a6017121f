"""The replay's progress bars: tqdm on stderr, only when stderr is a terminal and
tqdm is installed (``flatradix[replay]``); ``None`` otherwise. Without tqdm, a
terminal gets one line saying how to have them (once per process)."""

import sys

#: said once per process: how to get progress bars
TQDM_HINT = ("flatradix: no progress bars (tqdm is not installed): "
             "pip install 'flatradix[replay]' to have them")
_hinted = False


def progress_bar(total, enabled, **kwargs):
    """A ``tqdm`` bar of ``total`` steps on stderr (``leave=False``), or ``None``."""
    global _hinted
    if not enabled or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        if not _hinted:
            _hinted = True
            print(TQDM_HINT, file=sys.stderr, flush=True)
        return None
    return tqdm(total=total, file=sys.stderr, leave=False, **kwargs)
