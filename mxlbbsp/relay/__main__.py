"""``python -m mxlbbsp.relay``: this host's relay (see :mod:`mxlbbsp.relay.relay`)."""
import sys

from mxlbbsp.relay.relay import main

if __name__ == "__main__":
    sys.exit(main())
