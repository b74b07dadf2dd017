"""A circuit breaker: after a failure, skip the remote tier for a cool-down, then probe.

The classic three-state breaker (Nygard, "Release It!", 2007): *closed* (calls go through),
*open* after a failure (calls are refused at once, so no request waits on a dead or stalled
server), *half-open* once ``cooldown_s`` has passed (one call probes; success closes, failure
opens again). Thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class CircuitBreaker:
    """Args:
        cooldown_s: seconds to stay open after a failure (> 0).
        clock: monotonic clock (tests may pass a fake one).

    Raises:
        ValueError: ``cooldown_s`` <= 0.
    """

    def __init__(
        self, cooldown_s: float = 2.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not cooldown_s > 0:
            raise ValueError(f"cooldown_s: expected > 0, got {cooldown_s}")
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._open_until: float | None = None
        self._probing = False
        self.num_opened = 0

    @property
    def is_closed(self) -> bool:
        """True while calls go through (the remote is believed up)."""
        with self._lock:
            return self._open_until is None

    def allow(self) -> bool:
        """Whether a call may go out now (closed, or the one probe of a half-open breaker)."""
        with self._lock:
            if self._open_until is None:
                return True
            if self._probing or self._clock() < self._open_until:
                return False
            self._probing = True
            return True

    def success(self) -> None:
        """A call succeeded: close."""
        with self._lock:
            self._open_until, self._probing = None, False

    def failure(self) -> None:
        """A call failed: open for ``cooldown_s``."""
        with self._lock:
            if self._open_until is None:
                self.num_opened += 1
            self._open_until = self._clock() + self.cooldown_s
            self._probing = False
