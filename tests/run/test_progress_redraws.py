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
    bar, progress, _ = runner._progress_bar(total=1, quiet=False)
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


def test_a_new_run_does_not_show_the_step_and_loss_of_the_run_before(monkeypatch):
    """A run diverging at step 1 (never reaching step 50) was drawn as 'linear-delta-unnorm …: loss=2.1739,
    step=250', the previous run's last values (new-user run of b1a4373)."""
    stream = Terminal()
    monkeypatch.setattr(runner.sys, "stderr", stream)
    bar, progress, begin = runner._progress_bar(total=2, quiet=False)
    begin("first run")
    progress(250, 2.1739)
    bar.update(1)
    begin("diverges at step 1")
    progress(1, float("nan"))
    last = stream.getvalue().split("\r")[-1]
    assert "diverges at step 1" in last and "2.1739" not in last and "step=" not in last
    bar.close()
