"""`python -m homing.bench.chaos`: see `homing.bench.chaos.harness`."""

import sys

from homing.bench.chaos.harness import main

sys.exit(main())
