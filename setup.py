"""Native parts of the router's core (the affinity index's hot paths), built by `pip install`.

The extensions are optional: where one cannot be built (no C compiler, no xxHash >= 0.8
header) the install still succeeds and the router uses its pure-Python code, which
computes the same results (`homing.router.hashing` / `index` for `_walk`,
`homing.router.policies.cache_aware` for `_cost`, `homing.router.events` for `_kvwire`). `make` installs Debian's `libxxhash-dev` when the
header is missing and apt-get is there, and warns when the extensions were not built.
"""

from setuptools import Extension, setup

# -ffp-contract=off: no fused multiply-adds, so the C cost pass rounds as Python does.
FLAGS = ["-O3", "-std=c11", "-ffp-contract=off", "-Wall", "-Wextra", "-Wno-unused-parameter"]

setup(
    ext_modules=[
        # Prefix walk over the index's block-key chain (xxHash's XXH3 from libxxhash).
        Extension(
            "homing.router._walk",
            sources=["src/homing/router/_native/walk.c"],
            libraries=["xxhash"],
            extra_compile_args=FLAGS,
            optional=True,
        ),
        # cache_aware's cost pass over the candidate snapshots.
        Extension(
            "homing.router._cost",
            sources=["src/homing/router/_native/cost.c"],
            extra_compile_args=FLAGS,
            optional=True,
        ),
        # Reader of the fast-path events of a serialized KvEventBatch.
        Extension(
            "homing.router._kvwire",
            sources=["src/homing/router/_native/kvwire.c"],
            extra_compile_args=FLAGS,
            optional=True,
        ),
    ],
)
