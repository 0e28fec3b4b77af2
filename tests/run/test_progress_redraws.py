"""The progress bar's redraws: every 50 steps on a terminal, at most one per LOGGED_REFRESH_S into a log. A
redirected quick-profile log was 179 kB of carriage-returned redraws (new-user run of 7 December)."""

from __future__ import annotations

import io

from fwbench.run import runner


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def redraws(monkeypatch, stream: io.StringIO, steps: int) -> int:
    monkeypatch.setattr(runner.sys, "stderr", stream)
    bar, progress = runner._progress_bar(total=1, quiet=False)
    for step in range(1, steps + 1):
        progress(step, 0.5)
    bar.close()
    return stream.getvalue().count("step=")


def test_a_terminal_is_redrawn_every_50_steps(monkeypatch):
    assert redraws(monkeypatch, Terminal(), 1000) == 1000 // 50 + 1  # and once more on close


def test_a_log_gets_the_step_at_most_once_per_interval(monkeypatch):
    assert redraws(monkeypatch, io.StringIO(), 1000) <= 2  # the steps run in well under LOGGED_REFRESH_S
    clock = iter(range(0, 10**6, 20))  # 20 s a call: a redraw every second multiple of 50 steps
    monkeypatch.setattr(runner.time, "monotonic", lambda: float(next(clock)))
    assert redraws(monkeypatch, io.StringIO(), 1000) in (10, 11)
