"""Values of the compiled score loops (:mod:`variants.kernels.compiled_scores`) that their surviving
mutants changed and no other test saw (``docs/mutation.md``, the pass of 6 December 2026).

The reference is φ(k)·φ(q) with φ written out by the paper's definition (Eq. 27–28), or q·k for the
softmax scores, in float64, differentiated by plain autograd.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from fwbench.tasks.key_rows import KeyRows, table_scores
from fwbench.variants.kernels.dpfp_scores import dpfp_query_scores


def paper_dpfp(x: torch.Tensor, nu: int) -> torch.Tensor:
    """φ(x): r = [relu(x), relu(−x)], block i = r ⊙ roll(r, i), i = 1..ν."""
    r = torch.cat([x.relu(), (-x).relu()], dim=-1)
    return torch.cat([r * r.roll(shifts=i, dims=-1) for i in range(1, nu + 1)], dim=-1)

#: Run in a fresh process with numba's bounds checks on: the loops index without them, so an index
#: past an array's end reads or writes memory beside it instead of raising, and the values may come
#: out right anyway (a work buffer written past its end, then refilled).
BOUNDS_CHECKED = """
import torch
from fwbench.variants.kernels.dpfp_scores import dpfp_query_scores


def paper_dpfp(x, nu):
    r = torch.cat([x.relu(), (-x).relu()], dim=-1)
    return torch.cat([r * r.roll(shifts=i, dims=-1) for i in range(1, nu + 1)], dim=-1)


g = torch.Generator().manual_seed(0)
d, nu = 5, 2  # T < d_key and R < d_key: a work buffer sized by the wrong axis is too short
k = torch.randn(2, 3, d, generator=g, dtype=torch.float64, requires_grad=True)
phi_q = (torch.rand(2, 1, 2 * d * nu, generator=g, dtype=torch.float64) + 0.1).requires_grad_()
got = dpfp_query_scores(k, phi_q, nu)
want = paper_dpfp(k, nu) @ phi_q.mT
torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
for a, b in zip(torch.autograd.grad(got.sum(), (k, phi_q)), torch.autograd.grad(want.sum(), (k, phi_q))):
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
print("ok")
"""


def test_the_loops_stay_inside_their_arrays(tmp_path):
    """The key path's loops, forward and backward, run with numba's bounds checks (the row loops
    ``row_score`` and ``row_backward`` in them are the table path's too), in a cache directory of
    its own so that no loop compiled without the checks is loaded: an index past an array's end
    raises IndexError. Right value: φ(k)·φ(q) and its gradients, with no IndexError. Mutants:
    ``row_score``'s and ``row_backward``'s first fill of the rolled row over ``range(d + i)`` (for
    ``d − i``) wrote i entries past the work buffer and read past the key row; the second fill then
    overwrote the buffer's tail, so every value came out right and the stray writes went unseen;
    ``_forward``'s and ``_backward``'s work buffers sized by T (``k.shape[1]``) instead of d_key, too
    short where T < d_key (these shapes), long enough in every other test."""
    env = {**os.environ, "NUMBA_BOUNDSCHECK": "1", "NUMBA_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", BOUNDS_CHECKED], capture_output=True, text=True, env=env,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert done.returncode == 0, done.stderr[-1500:]
    assert done.stdout.split() == ["ok"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_pair_of_opposite_signs_whose_difference_overflows_has_no_feature(dtype):
    """A pair of finite coordinates of opposite signs has both features 0 (relu of one of them is 0),
    however large they are: k = [¾ max, −¾ max, 1, 2] (ν = 1) scores 2·w, its one same-sign pair
    (1, 2). The loop writes a pair without a feature as (k'_m + k'_{m+i}) · 0, which keeps the NaN
    of an infinite coordinate and is 0 for finite ones, since a sum of opposite signs cannot
    overflow. Mutant: ``row_score``'s ``k'_m − k'_{m+i}``, which overflows to inf for this pair and
    gave NaN (inf · 0) where φ(k)·φ(q) is finite; the other tests' opposite pairs were too small
    (1e20 and −1e20 in fp32) or infinite (NaN either way)."""
    big = 0.75 * torch.finfo(dtype).max
    k = torch.tensor([[[big, -big, 1.0, 2.0], [-big, big, -1.0, -2.0], [1.0, -2.0, big, -big]]], dtype=dtype)
    phi_q = torch.linspace(0.5, 2.0, 8, dtype=dtype).view(1, 1, 8)
    expected = paper_dpfp(k.double(), 1) @ phi_q.double().mT
    assert expected.isfinite().all() and (expected != 0).all()
    got = dpfp_query_scores(k, phi_q, 1)
    torch.testing.assert_close(got, expected.to(dtype), rtol=1e-6, atol=0)
    ids = torch.arange(3).view(1, 3)
    from_tables = table_scores(KeyRows(k[0], ids, torch.zeros_like(k[0]), ids), phi_q[:, 0], "dpfp", 1)
    torch.testing.assert_close(from_tables, expected[..., 0].to(dtype), rtol=1e-6, atol=0)


@pytest.mark.parametrize("nu", [1, 2])
def test_a_zero_coordinate_beside_one_of_either_sign_passes_no_gradient(nu):
    """relu has no gradient at 0 (torch's relu′(0) = 0), so a zero coordinate's pair passes none
    either way, to the zero or to its partner: the gradients of φ(k)·φ(q) by autograd, here rows with
    a 0 (and a −0) beside negative and positive partners. Mutant: ``row_backward``'s same-sign test
    ``k'_m < 0 and k'_{m+i} <= 0`` (for ``< 0``), which took (−1, 0) as a pair of one sign and gave
    the 0 the gradient ḡ N_m · (−1); the other tests' zeros met partners of the other sign."""
    k = torch.tensor([[[-1.0, 0.0, -2.0], [0.0, -3.0, 1.0], [2.0, -0.0, 1.0], [-0.0, 1.0, -2.0]]],
                     dtype=torch.float64)
    phi_q = torch.linspace(0.5, 2.0, 6 * nu, dtype=torch.float64).view(1, 1, -1)
    grad = torch.tensor([[[1.0], [-2.0], [3.0], [0.5]]], dtype=torch.float64)
    k_exact = k.clone().requires_grad_()
    (expected,) = torch.autograd.grad(paper_dpfp(k_exact, nu) @ phi_q.mT, k_exact, grad)
    k_op = k.clone().requires_grad_()
    (got,) = torch.autograd.grad(dpfp_query_scores(k_op, phi_q, nu), k_op, grad)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=0)
    assert (got[k == 0] == 0).all()
    table = k[0].clone().requires_grad_()
    ids = torch.arange(4).view(1, 4)
    (from_tables,) = torch.autograd.grad(table_scores(KeyRows(table, ids, torch.zeros_like(k[0]), ids), phi_q[:, 0],
                                                      "dpfp", nu), table, grad[..., 0])
    torch.testing.assert_close(from_tables, expected[0], rtol=1e-12, atol=0)
