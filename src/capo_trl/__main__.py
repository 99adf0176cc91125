"""``python -m capo_trl ...`` is the ``capo-trl`` command."""

import sys

from .cli.main import main

sys.exit(main())
