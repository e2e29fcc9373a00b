"""``python -m stalldoc.sidecar IN_FD OUT_FD SRC:DST,...``: the relay starts the sidecar so."""
import sys

from stalldoc.sidecar.process import main

sys.exit(main(sys.argv))
