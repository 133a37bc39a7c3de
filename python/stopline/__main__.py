"""``python -m stopline``: the same as the ``stopline`` console script."""

import sys

from stopline.cli import main

sys.exit(main())
