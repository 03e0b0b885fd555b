"""`python -m homing.bench.overhead` (`make bench-overhead`): see `homing.bench.overhead`."""

import sys

from homing.bench.overhead.cli import main

sys.exit(main())
