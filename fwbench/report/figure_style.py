"""What every report figure shares so a reader can read it: the legend beside the axes (never over the
data), legend handles long enough to show a dashed line, plain tick labels ("1.2", not "1.2 × 10⁰"),
integer ticks for step counts, and a tight save that keeps the legend in the PNG."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402

#: Legend text size (points) of every report figure: readable at the PNG's 110 dpi.
LEGEND_FONTSIZE = 8
#: Legend handle length (in font sizes): long enough to show a dash pattern twice.
HANDLE_LENGTH = 4.0


def legend_beside(ax, fontsize: float = LEGEND_FONTSIZE, **kwargs) -> None:
    """The legend to the right of the axes, outside them: it can cover no curve."""
    if not ax.get_legend_handles_labels()[0]:
        return
    ax.legend(fontsize=fontsize, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
              handlelength=HANDLE_LENGTH, **kwargs)


def legend_below(ax, fontsize: float = LEGEND_FONTSIZE, ncol: int = 1) -> None:
    """The legend under the axes and their x label (for side-by-side panels, where the right is the next panel)."""
    if not ax.get_legend_handles_labels()[0]:
        return
    ax.legend(fontsize=fontsize, loc="upper center", bbox_to_anchor=(0.5, -0.16), borderaxespad=0.0,
              handlelength=HANDLE_LENGTH, ncol=ncol)


def _plain(value: float, _position=None) -> str:
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else ""
    return f"{value:g}"


def plain_ticks(ax, axis: str = "y") -> None:
    """Tick labels as plain numbers on a log axis ("0.001", "1.2"): no "× 10^k" forms. On an axis that
    spans less than a decade the minor ticks are labelled too (else it would show one label or none)."""
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_formatter(ticker.FuncFormatter(_plain))
    low, high = ax.get_ylim() if axis == "y" else ax.get_xlim()
    narrow = low > 0 and high / low < 10
    target.set_minor_formatter(ticker.FuncFormatter(_plain) if narrow else ticker.NullFormatter())


def integer_ticks(ax, axis: str = "x") -> None:
    """Only whole numbers on the axis (training steps, layers)."""
    (ax.xaxis if axis == "x" else ax.yaxis).set_major_locator(ticker.MaxNLocator(integer=True))


def texts_as_written(fig) -> None:
    """Draw every text of ``fig`` that may hold a name from the store or the command line (legend entries
    and titles, axes titles and labels, annotations, figure titles and texts) as written, never as
    mathtext: a registered variant or a grid may be named with ``$`` (``my$map$``), which matplotlib read
    as math, drawing "my" and an italic "map", and ``a$\\frac$`` raised a ValueError from the mathtext
    parser, so ``fwbench report`` ended in a traceback. Tick labels are left alone: matplotlib's own
    formatters write them in mathtext (``$\\mathdefault{2^{5}}$`` on a log axis). No other text of
    fwbench's figures is mathtext. Call it before anything measures or draws the texts (:func:`save`
    does; a figure drawn earlier, to place labels in pixels, calls it before that)."""
    texts = [*fig.texts, getattr(fig, "_suptitle", None)]
    legends = list(fig.legends)
    for ax in fig.axes:
        texts += [ax.title, getattr(ax, "_left_title", None), getattr(ax, "_right_title", None),
                  ax.xaxis.label, ax.yaxis.label, *ax.texts]
        legends.append(ax.get_legend())
    for legend in legends:
        if legend is not None:
            texts += [legend.get_title(), *legend.get_texts()]
    for text in texts:
        if text is not None:
            text.set_parse_math(False)


def save(fig, path: Path, rect: tuple[float, float, float, float] | None = None) -> Path:
    """Write ``fig`` as PNG with a tight bounding box (keeps a legend placed outside the axes), close it.
    ``rect``: the part of the figure the axes are laid out in (room for a figure-level legend). Every text
    but the tick labels is drawn as written (:func:`texts_as_written`)."""
    texts_as_written(fig)
    fig.tight_layout(rect=rect)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
