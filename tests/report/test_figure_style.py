"""The report figures' shared style: a legend never over the axes, handles long enough for a dash,
plain tick labels on log axes, integer step ticks (issue 13, item 7)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fwbench.report.figure_style import HANDLE_LENGTH, integer_ticks, legend_below, legend_beside, plain_ticks  # noqa: E402


def _overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def test_legends_sit_outside_the_axes_with_long_handles():
    for place in (legend_beside, legend_below):
        fig, ax = plt.subplots()
        for i in range(8):
            ax.plot([1, 2, 3], [i, i + 1, i + 2], "--", label=f"a long label for variant {i}")
        ax.set_xlabel("S")
        place(ax)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        legend = ax.get_legend()
        assert not _overlaps(legend.get_window_extent(renderer), ax.get_window_extent(renderer)), place.__name__
        assert not _overlaps(legend.get_window_extent(renderer), ax.xaxis.label.get_window_extent(renderer))
        assert legend.handlelength == HANDLE_LENGTH >= 3.5 and legend.get_texts()[0].get_fontsize() >= 8
        plt.close(fig)


def test_log_axes_read_as_plain_numbers_and_steps_as_integers():
    fig, ax = plt.subplots()
    ax.plot([0, 700, 1500], [1.1, 1.2, 1.3])
    ax.set_yscale("log")
    plain_ticks(ax)
    integer_ticks(ax)
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels(minor=True) + ax.get_yticklabels() if t.get_text()]
    assert labels and not any("×" in t or "$" in t or "10^" in t for t in labels)
    assert "1.2" in labels  # a narrow log axis labels its minor ticks
    assert all(float(t.get_text().replace("−", "-")).is_integer() for t in ax.get_xticklabels() if t.get_text())
    plt.close(fig)
