"""The errors of the sizing chain: an assumption out of range, or a chain that cannot be
sized."""

from __future__ import annotations


class PlanError(ValueError):
    """An assumption out of range. `option` names it as the CLI does (`--users`); the message
    reads after it ("must be >= 0, got -1")."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"{option} {message}")
        self.option = option


class ChainOverflow(ValueError):
    """Assumptions each in range whose chain leaves what can be sized: `step` came out
    infinite or NaN (`why`), e.g. --users 1e308, or --gpu-price 1e300 with
    --hours-per-month 1e300; or above MAX_REPLICAS replicas (MAX_PROCESSES gateway
    processes)."""

    def __init__(self, step: str, why: str = "not a finite number") -> None:
        super().__init__(
            f"the chain overflows at {step} ({why}): the assumptions are too large, or a "
            "rate too small, to size"
        )
        self.step = step


def shown(value: object) -> str:
    """A number as an option would be written (0, 1.5), anything else as repr: how an error
    message quotes the value it refuses."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:g}"
    return repr(value)
