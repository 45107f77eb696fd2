"""``python -m cg``: the same as the ``cg`` console script."""

import sys

from .main import main

sys.exit(main())
