"""``python -m capo_trl ...`` is the ``capo-trl`` command."""

import sys

from .cli import main

sys.exit(main())
