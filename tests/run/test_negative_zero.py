"""A float zero written −0.0 in a grid names the run of 0.0 (issue 14 kind 12)."""

from __future__ import annotations

from fwbench.run.grid import RunSpec, expand, load_grid


def test_a_negative_zero_in_a_grid_names_the_run_of_zero(tmp_path):
    """``target_loss = -0.0`` (or dropout, grad_clip, temperature) compares as 0.0 everywhere, but the
    run id hashed ``-0.0``: one computation, two ids. The grid reads every float zero as 0.0."""
    path = tmp_path / "lm.toml"
    path.write_text('name = "lm"\ntask = "shakespeare"\n[profiles.quick]\nvariant = "linear"\nseed = 1\n'
                    "target_loss = -0.0\ngrad_clip = -0.0\n")
    spec, = expand(load_grid(path), "quick")
    assert str(spec.config["target_loss"]) == "0.0" and str(spec.config["grad_clip"]) == "0.0"
    zero = RunSpec("lm", "shakespeare", "linear", 1, {**spec.config, "target_loss": 0.0, "grad_clip": 0.0})
    assert spec.run_id == zero.run_id
