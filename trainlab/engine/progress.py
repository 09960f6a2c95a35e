"""Progress reporting: a tqdm bar with loss and samples/s on a terminal, plain periodic lines otherwise."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from tqdm import tqdm


class Progress:
    """Shows training progress; `loss_fn` is only called when something is printed (it may sync the device)."""

    def __init__(self, total_steps: int, desc: str, initial: int = 0, stream=None, every_s: float = 30.0,
                 enabled: bool = True):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.desc, self.total, self.every_s = desc, total_steps, every_s
        self.last_print = time.perf_counter()
        self.bar = tqdm(total=total_steps, initial=initial, desc=desc, file=self.stream, dynamic_ncols=True,
                        leave=True, mininterval=0.5) if self.tty and enabled else None

    def step(self, step: int, samples_per_s: float, loss_fn: Callable[[], float]) -> None:
        now = time.perf_counter()
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            if now - self.last_print > 1.0:
                self.bar.set_postfix(loss=f"{loss_fn():.4f}", samples_s=f"{samples_per_s:,.0f}", refresh=False)
                self.last_print = now
        elif self.enabled and now - self.last_print > self.every_s:
            self.write(f"{self.desc}: step {step}/{self.total} loss {loss_fn():.4f} {samples_per_s:,.0f} samples/s")
            self.last_print = now

    def set_total(self, total_steps: int) -> None:
        """Where training now ends (the plateau schedule's cooldown moves it)."""
        self.total = total_steps
        if self.bar is not None:
            self.bar.total = total_steps
            self.bar.refresh()

    def write(self, line: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
