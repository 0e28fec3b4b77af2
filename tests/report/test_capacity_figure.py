"""The capacity-vs-d_dot figure (`fwbench capacity`): the legend under the axes, not beside them (it took
~40 % of the width), and the official points' names clear of each other, of every marker and error bar,
and of the line capacity = d_dot (issue 13: favor:m=64 and favor:m=128 were written over each other)."""

from __future__ import annotations

import math

import pandas as pd

import fwbench.report.interval_figures as interval_figures
from fwbench.report.interval_figures import capacity_vs_d_dot_figure, official_capacities
from fwbench.report.point_labels import line_boxes, marker_box


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def quick_table() -> pd.DataFrame:
    """The capacity table of `nox -s capacity` as it stood (d_key 16, 3 seeds; ν=3 an upper bound)."""
    rows = [("dpfp:nu=1", 32, 26.2, 25.1, 27.3, "", 16, 32), ("dpfp:nu=2", 64, 48.4, 30.1, 66.8, "", 32, 64),
            ("dpfp:nu=3", 96, 72.9, 42.5, 103.2, "<", 0, 96), ("dpfp:nu=4", 128, 104.4, 103.7, 105.0, "", 96, 128)]
    return pd.DataFrame([{"variant": v, "d_key": 16, "d_dot": d, "n_seeds": 3, "capacity_mean": c, "ci_low": lo,
                          "ci_high": hi, "bound": b, "grid_low": gl, "grid_high": gh} for v, d, c, lo, hi, b, gl, gh in rows])


def test_legend_below_and_labels_clear_of_each_other_and_of_the_data(monkeypatch, tmp_path):
    caught = []
    monkeypatch.setattr(interval_figures, "_save", lambda fig, path: caught.append(fig) or path)
    table, official = quick_table(), official_capacities()
    capacity_vs_d_dot_figure(table, tmp_path / "c.png", official)
    fig = caught[0]
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    legend, frame = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
    assert legend.y1 <= frame.y0 and frame.width >= 0.8 * fig.bbox.width  # under the axes; the plot keeps the width
    labels = [t for t in ax.texts if t.get_text() in set(official["variant"])]
    assert sorted(t.get_text() for t in labels) == sorted(official["variant"])
    boxes = [t.get_window_extent(renderer) for t in labels]
    assert not any(_overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    data = [marker_box(ax, r["d_dot"], r["capacity_mean"], 6.0, r["ci_low"], r["ci_high"]) for _, r in table.iterrows()]
    data += [marker_box(ax, r["d_dot"], r["capacity"], 5.0) for _, r in official.iterrows()]
    low, high = ax.get_xlim()
    data += line_boxes(ax, (low, low), (high, high), step_px=4.0)
    assert not any(_overlap(box, other) for box in boxes for other in data)
    assert all(frame.x0 <= b.x0 and b.x1 <= frame.x1 and frame.y0 <= b.y0 and b.y1 <= frame.y1 for b in boxes)
    assert math.isclose(low, ax.get_ylim()[0])  # equal ranges: the diagonal is capacity = d_dot


def test_the_capacity_table_keeps_a_bound_on_the_ratio(tmp_path):
    """A censored capacity (DPFP ν=2 cut at S ≤ 160: ≥ 160) has a bounded ratio, "≥ 0.62", not a measured 0.62."""
    from fwbench.analysis.reference import official_records
    from fwbench.report.render import section_capacity_vs_d_dot

    frame = official_records((1, 2, 3))
    cut = frame[~((frame["setting"] == 1) & (frame["variant"] == "dpfp:nu=2") & (frame["S"] > 160))]
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in
            section_capacity_vs_d_dot(cut, tmp_path).splitlines() if line.startswith("| dpfp")}
    assert rows["dpfp:nu=2"][3:5] == ["≥ 160 (3 seeds)", "≥ 0.62"]
    assert rows["dpfp:nu=1"][4] == "0.95"


def test_a_variant_named_with_dollar_signs_is_drawn_as_written(monkeypatch, tmp_path):
    """The figure is drawn before its save (labels are placed in pixels): a registered map named
    'a$\\frac$' raised the mathtext parser's ValueError there, in `fwbench report` and `fwbench capacity`."""
    caught = []
    monkeypatch.setattr(interval_figures, "_save", lambda fig, path: caught.append(fig) or path)
    table = quick_table()
    table.loc[0, "variant"] = "a$\\frac$"
    table.loc[1, "variant"] = "my$map$"
    capacity_vs_d_dot_figure(table, tmp_path / "c.png", official_capacities())  # old code: ValueError
    texts = caught[0].axes[0].get_legend().get_texts()
    shown = {t.get_text(): t for t in texts}
    assert "a$\\frac$ (d_key 16)" in shown and "my$map$ (d_key 16)" in shown
    assert not any(t.get_parse_math() for t in texts)
