"""How many tokens the engine packs into one streamed chunk (SGLang's `stream_interval`).

A streamed request may carry `SamplingParams.stream_interval` k: the engine then hands out
the first token at once and later ones in chunks of k (and whatever is left at finish). Each
chunk costs the gateway one gRPC message and one SSE write whatever its size, so k divides
the per-token part of the gateway's work by about k; the price is inter-token granularity:
the client sees tokens in bursts of k, one burst every k decode steps, and time to first
token is unchanged.

`StreamIntervalPolicy` decides k per model, from its setting:
- an int k >= 1: always k (1 is SGLang's own default: every token its own chunk);
- "auto": start at 1 and double k, up to `maximum`, only while the gateway's event loop is
  the bottleneck; halve it back toward 1 once the loop is clearly idle. The loop's state
  comes as periodic samples of its busy share (`observe`; seconds the loop thread ran or
  waited for a CPU per wall second, in [0, 1]; see `homing.obs.loop_busy`).

Auto-mode constants (defaults):
- `high` 0.85: a single-server queue's wait grows as rho / (1 - rho) times the service
  time (M/M/1), about 5.7x at 0.85 against 1x at 0.5: past it, a token's wait for the loop
  is dominated by other callbacks. Also under 1.0 because the share leaves out the time
  the loop thread waits for the GIL (grpc's poller threads hold it), so a saturated loop
  reads somewhat below 1 (0.94-1.0 measured under a saturating streamed load).
- `low` 0.4: below `high` / 2. Halving k at most doubles the loop's work (the per-chunk part
  doubles, the per-request part is unchanged), so a share under 0.4 becomes at most 0.8
  after a halving, still under `high`: at a steady load a step down never triggers a step
  up, which is the hysteresis that keeps k from flapping.
- `raise_after_s` 5 s: the share must stay at or above `high` in every sample for this long
  (five samples at the sampler's 1 s period), so a burst of arrivals, a GC pause or a
  tokenizer load does not coarsen streams. The window restarts at each change, so the
  next doubling is judged on samples taken after it.
- `lower_after_s` 30 s: the share must stay at or below `low` this long before a halving.
  Longer than the raise window because staying coarse a while costs only granularity,
  while stepping down too early puts the loop back under pressure; and because a new k
  reaches only streams started after the change (streams in flight keep theirs), the
  window should cover a typical stream (300 tokens at 50 ms per token is 15 s) so the
  samples reflect it. For the same reason a doubling may overshoot while in-flight
  streams still run at the old k; the low mark brings it back.
- `maximum` 4 (config `max_stream_interval`): measured gateway CPU per 256-token stream at
  k = 2, 4, 8 is 0.57, 0.35 and 0.29 of k = 1's (`make bench-overhead`, docs/benchmarks.md,
  "Tokens per chunk"), so 4 takes most of the saving, while 8 takes 0.06 more at twice the
  burst gap (at the seed's 50 ms per token, 4 tokens is a 200 ms gap, 8 a 400 ms one); a
  power of two, reached from 1 in two doublings.

Pure: no I/O, time only from the injected `Clock`; not thread-safe (call it from the loop).
"""

from __future__ import annotations

import math
from typing import Literal

from homing.clock import Clock

StreamIntervalSetting = int | Literal["auto"]
"""A model's setting: a fixed number of tokens per chunk (>= 1), or "auto"."""

DEFAULT_MAX_INTERVAL = 4
DEFAULT_HIGH = 0.85
DEFAULT_LOW = 0.4
DEFAULT_RAISE_AFTER_S = 5.0
DEFAULT_LOWER_AFTER_S = 30.0


class StreamIntervalPolicy:
    """The stream interval (tokens per chunk) to send with a model's next streamed request.

    `setting`: an int >= 1 (returned as is; samples are ignored) or "auto" (starts at 1,
    moves by doubling and halving within [1, `maximum`] as described in the module
    docstring). `high` and `low` are busy shares with 0 <= low < high <= 1; the windows are
    seconds on `clock`. Raises ValueError on a setting, maximum, mark or window out of range.
    """

    def __init__(
        self,
        setting: StreamIntervalSetting,
        *,
        clock: Clock,
        maximum: int = DEFAULT_MAX_INTERVAL,
        high: float = DEFAULT_HIGH,
        low: float = DEFAULT_LOW,
        raise_after_s: float = DEFAULT_RAISE_AFTER_S,
        lower_after_s: float = DEFAULT_LOWER_AFTER_S,
    ) -> None:
        auto = setting == "auto"
        if not auto and (isinstance(setting, bool) or not isinstance(setting, int)):
            raise ValueError(f'stream interval must be an int >= 1 or "auto", got {setting!r}')
        if not auto and setting < 1:
            raise ValueError(f"stream interval must be >= 1, got {setting}")
        if maximum < 1:
            raise ValueError(f"maximum stream interval must be >= 1, got {maximum}")
        if not 0.0 <= low < high <= 1.0:
            raise ValueError(f"need 0 <= low < high <= 1, got low={low}, high={high}")
        if not (raise_after_s >= 0 and lower_after_s >= 0):
            raise ValueError("the raise and lower windows must be >= 0 seconds")
        self._clock = clock
        self.auto = auto
        self.maximum = maximum
        self.high = high
        self.low = low
        self.raise_after_s = raise_after_s
        self.lower_after_s = lower_after_s
        self._level = 1 if auto else int(setting)
        self._high_since: float | None = None
        self._low_since: float | None = None

    def interval(self) -> int:
        """Tokens per chunk for the next streamed request (>= 1; <= `maximum` in auto)."""
        return self._level

    def observe(self, busy_share: float) -> None:
        """Take one sample of the event loop's busy share (in [0, 1]) and, in auto mode,
        double or halve the interval when its window is complete. Raises ValueError on a
        share outside [0, 1] or NaN."""
        if math.isnan(busy_share) or not 0.0 <= busy_share <= 1.0:
            raise ValueError(f"busy share must be in [0, 1], got {busy_share}")
        if not self.auto:
            return
        now = self._clock.now()
        if busy_share >= self.high:
            self._low_since = None
            if self._high_since is None:
                self._high_since = now
            elif now - self._high_since >= self.raise_after_s and self._level < self.maximum:
                self._level = min(self.maximum, self._level * 2)
                self._high_since = now
        elif busy_share <= self.low:
            self._high_since = None
            if self._low_since is None:
                self._low_since = now
            elif now - self._low_since >= self.lower_after_s and self._level > 1:
                self._level = max(1, self._level // 2)
                self._low_since = now
        else:
            self._high_since = None
            self._low_since = None
