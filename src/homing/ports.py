"""Choosing loopback ports for child processes.

Rule of the file: a port is chosen by the OS (bind to port 0) and handed to a child, which
binds it a moment later; the pair form also checks the next port, which a simulated worker
binds for its sidecar (`homing sim`: gRPC on P, HTTP on P + 1).
"""

from __future__ import annotations

import socket


def free_port_pair(host: str, attempts: int = 50) -> int:
    """A port P such that P and P + 1 are both free on `host` now (TCP). Raises RuntimeError
    when none is found in `attempts` tries."""
    for _ in range(attempts):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as first:
            first.bind((host, 0))
            port = first.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as second:
                try:
                    second.bind((host, port + 1))
                except OSError:
                    continue
        return port
    raise RuntimeError(f"no free pair of consecutive ports on {host}")
