"""``python -m capo_trl.cli ...`` is the ``capo-trl`` command."""

import sys

from .main import main

sys.exit(main())
