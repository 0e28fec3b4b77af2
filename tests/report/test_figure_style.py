"""The report figures' shared style: a legend never over the axes, handles long enough for a dash,
plain tick labels on log axes, integer step ticks (issue 13, item 7)."""

from __future__ import annotations

import math

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


def test_names_with_dollar_signs_are_drawn_as_written_and_ticks_keep_their_mathtext(tmp_path):
    """A registered variant or a grid may be named with '$' (the name check allows it): matplotlib read
    'my$map$' as mathtext ("my" and an italic "map") and 'a$\\frac$' raised a ValueError at save, so
    `fwbench report` on such a store ended in a traceback. Every text a name can reach is drawn as written;
    a log axis's own tick labels ($\\mathdefault{10^{0}}$) are still mathtext."""
    from fwbench.report.figure_style import save

    names = ["my$map$", "a$\\frac$", "$$"]
    fig, (ax, other) = plt.subplots(1, 2)
    for name in names:
        ax.plot([1, 10], [1, 10], label=name)
    ax.set_yscale("log")
    ax.set_title(names[0])
    ax.set_xlabel(names[1])
    ax.annotate(names[1], (2, 2))
    legend_beside(ax)
    other.plot([1, 2], [1, 2], label=names[1])
    fig.legend(title=names[0])
    fig.suptitle(f"fwbench bench: grid {names[1]}")
    fig.text(0.1, 0.1, names[2])
    save(fig, tmp_path / "f.png")  # old code: ValueError from the mathtext parser
    texts = [ax.title, ax.xaxis.label, *ax.texts, *ax.get_legend().get_texts(), fig.legends[0].get_title(),
             *fig.legends[0].get_texts(), fig._suptitle, *fig.texts]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == names
    assert all(not t.get_parse_math() for t in texts)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()  # save closed the figure
    # drawn as written: "my$map$" is as wide as the same string in a text that never parses math
    literal = fig.text(0, 0, names[0], parse_math=False, fontsize=ax.title.get_fontsize())
    assert math.isclose(ax.title.get_window_extent(renderer).width, literal.get_window_extent(renderer).width)
    mathtext = fig.text(0, 0, names[0], fontsize=ax.title.get_fontsize())
    assert not math.isclose(mathtext.get_window_extent(renderer).width, literal.get_window_extent(renderer).width)
    ticks = [t for t in ax.get_yticklabels() if t.get_text()]
    assert ticks and all(t.get_parse_math() and "$" in t.get_text() for t in ticks)
