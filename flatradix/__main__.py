"""``python -m flatradix ...`` is the ``flatradix`` command."""

import sys

from .cli import main

sys.exit(main())
