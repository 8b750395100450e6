"""``python -m mxlbbsp.launcher`` is the ``mxlbbsp`` command."""
import sys

from .cli import main

sys.exit(main())
