"""``python -m pyengine``: the same command line as the ``pyengine`` script."""

import sys

from pyengine.cli import main

sys.exit(main())
