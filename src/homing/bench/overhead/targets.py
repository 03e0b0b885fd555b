"""The targets of `make bench-overhead`: their names, which of them are HTTP gateways and
which are measured streamed only, and what the two configured homing targets run with.

Rule of this file: names and constants; it imports nothing.
"""

from __future__ import annotations

HOMING, SMG, HOMING_GRPC, DIRECT = "homing", "smg", "homing_grpc", "direct"
HOMING_BEFORE, GRPC_FLOOR = "homing_before", "grpc_aio"
HOMING_SI2, HOMING_SI4, HOMING_SI8 = "homing_si2", "homing_si4", "homing_si8"
HOMING_NOMETRICS, HOMING_P2 = "homing_nometrics", "homing_p2"
GATEWAYS = (HOMING, SMG, HOMING_BEFORE, HOMING_NOMETRICS, HOMING_P2)
"""The HTTP gateways measured in every phase, requests/s included."""
TARGETS = (
    HOMING, SMG, HOMING_BEFORE, HOMING_NOMETRICS, HOMING_P2, HOMING_GRPC, HOMING_SI2, HOMING_SI4,
    HOMING_SI8, GRPC_FLOOR,
)  # fmt: skip
"""Every target `--targets` may name, in the table's order."""
STREAM_INTERVALS = {HOMING_SI2: 2, HOMING_SI4: 4, HOMING_SI8: 8}
"""The homing targets run at a fixed `[engines] stream_interval`, and that interval."""
STREAMED_ONLY = frozenset(STREAM_INTERVALS)
"""Targets measured only streamed (CPU per streamed request and token, streamed first byte)."""
BASE_CONFIG = "[engines]\nstream_interval = 1\n"
"""The `--config` file of every homing target without one of its own: a token per chunk, as
smg streams (the default "auto" would coarsen chunks under the bench's load)."""
NOMETRICS_CONFIG = BASE_CONFIG + "[obs]\nrequest_metrics = false\n"
"""HOMING_NOMETRICS's `--config` file: homing without its per-request series."""
P2_PROCESSES = 2
"""HOMING_P2's `--processes`: its CPU is that of all its gateway processes together."""
