"""Text labels next to scatter points that overlap neither each other nor the data they sit beside.

Each label tries a few offsets around its point in turn (right-above, right-below, left-above, …) and
takes the first whose box, measured by the renderer, clears every label placed before it, every box
the caller asks it to avoid (other markers, error bars) and the edge of the axes. When no offset is
clear, it takes the one with the least overlap, so a label is never dropped.
"""

from __future__ import annotations

from matplotlib.transforms import Bbox

#: Offsets tried for each label, in points, with the horizontal alignment that keeps the text clear of
#: its own marker: right of it first (how a reader expects it), then left, then straight above / below.
OFFSETS = (((7, 4), "left"), ((7, -12), "left"), ((-7, 4), "right"), ((-7, -12), "right"),
           ((0, 9), "center"), ((0, -17), "center"))


def _overlap_area(a: Bbox, b: Bbox) -> float:
    width = min(a.x1, b.x1) - max(a.x0, b.x0)
    height = min(a.y1, b.y1) - max(a.y0, b.y0)
    return width * height if width > 0 and height > 0 else 0.0


def _outside_area(box: Bbox, frame: Bbox) -> float:
    inside = _overlap_area(box, frame)
    return box.width * box.height - inside


def place_labels(ax, points: list[tuple[float, float, str]], avoid: list[Bbox] = (), **text_kwargs) -> list:
    """Annotate each (x, y, text) of ``points`` (data coordinates) at the first clear offset of
    :data:`OFFSETS`; ``avoid``: display-space boxes (pixels) no label may cover. Returns the annotations."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    taken = list(avoid)
    placed = []
    text_kwargs.setdefault("parse_math", False)  # a name as written: '$' is no mathtext (figure_style.texts_as_written)
    for x, y, text in points:
        best = None
        for offset, align in OFFSETS:
            label = ax.annotate(text, (x, y), xytext=offset, textcoords="offset points", ha=align, **text_kwargs)
            box = label.get_window_extent(renderer).expanded(1.05, 1.1)
            cost = sum(_overlap_area(box, other) for other in taken) + _outside_area(box, frame)
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, label, box)
            else:
                label.remove()
            if cost == 0:
                break
        taken.append(best[2])
        placed.append(best[1])
    return placed


def marker_box(ax, x: float, y: float, size_px: float = 6.0, low: float | None = None,
               high: float | None = None) -> Bbox:
    """The display box of a marker at (x, y) of half-size ``size_px`` pixels, stretched over an error bar
    from ``low`` to ``high`` (data y) when given."""
    to_display = ax.transData.transform
    cx, cy = to_display((x, y))
    y0, y1 = cy - size_px, cy + size_px
    if low is not None and high is not None:
        y0 = min(y0, to_display((x, low))[1])
        y1 = max(y1, to_display((x, high))[1])
    return Bbox.from_extents(cx - size_px, y0, cx + size_px, y1)


def line_boxes(ax, start: tuple[float, float], end: tuple[float, float], step_px: float = 6.0) -> list[Bbox]:
    """Small display boxes along the straight (in display space) segment from ``start`` to ``end`` (data
    coordinates): a line a label should not be written across."""
    (x0, y0), (x1, y1) = ax.transData.transform([start, end])
    steps = max(1, int(((x1 - x0) ** 2 + (y1 - y0) ** 2) ** 0.5 / step_px))
    half = step_px / 2
    return [Bbox.from_extents(x - half, y - half, x + half, y + half)
            for x, y in ((x0 + (x1 - x0) * i / steps, y0 + (y1 - y0) * i / steps) for i in range(steps + 1))]
