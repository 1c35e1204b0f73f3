"""`python -m kernel_hub.cli`: the `kernel-hub` command."""

import sys

from . import main

sys.exit(main())
