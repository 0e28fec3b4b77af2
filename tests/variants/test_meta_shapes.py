"""A shape-only run on ``meta`` (no values) goes through every variant, form and call.

Softmax's reads skip their value check on meta, and a softmax language model on meta was already a
supported dry run; every fast-weight variant raised "Tensor.item() cannot be called on meta tensors"
from the kernels' finiteness check (and, with ``check_finite`` on, from the input check).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fwbench.tasks.lm_model import DecoderConfig, DecoderLM
from fwbench.variants import AttentionLayer, VariantError, build_attention

SPECS = ["softmax", "linear", "linear-delta", "linear-delta-unnorm", "favor:m=4", "favor-delta:m=4", "dpfp",
         "dpfp-delta:nu=2", "linear-fwm", "tanh-fwm"]
FORMS = ["auto", "parallel", "chunk", "recurrent"]


def on_meta(x):
    if torch.is_tensor(x):
        return x.to("meta")
    if dataclasses.is_dataclass(x):
        return type(x)(**{f.name: on_meta(getattr(x, f.name)) for f in dataclasses.fields(x)})
    return x


def first_tensor(x):
    return x if torch.is_tensor(x) else x.W if hasattr(x, "W") else x.k


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("spec", SPECS)
def test_every_call_on_meta_gives_the_shapes_and_dtypes_of_a_real_run(spec, form):
    try:
        attention = build_attention(spec, 4, form=form, chunk_size=2)
    except VariantError:
        pytest.skip("a form the rule has no kernel for")
    generator = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 5, 4, generator=generator), torch.randn(1, 2, 5, 4, generator=generator)
    v, beta = torch.randn(1, 2, 5, 3, generator=generator), torch.rand(1, 2, 5, generator=generator)
    y, state = attention(q, k, v, beta=beta)
    calls = {
        "forward": (lambda q, k, v, beta, state: attention(q, k, v, beta=beta, state=state)[0], y),
        "state": (lambda q, k, v, beta, state: first_tensor(attention(q, k, v, beta=beta, state=state)[1]),
                  first_tensor(attention(q, k, v, beta=beta, state=state)[1])),
        "write": (lambda q, k, v, beta, state: first_tensor(attention.write(k, v, beta, state)),
                  first_tensor(attention.write(k, v, beta, state))),
        "read": (lambda q, k, v, beta, state: attention.read(q, state), attention.read(q, state)),
        "write_read": (lambda q, k, v, beta, state: attention.write_read(k, v, q, beta, state),
                       attention.write_read(k, v, q, beta, state)),
    }
    for check_finite in False, True:
        attention.check_finite = check_finite
        for name, (call, real) in calls.items():
            out = call(*(on_meta(x) for x in (q, k, v, beta, state)))
            assert (out.device.type, out.shape, out.dtype) == ("meta", real.shape, real.dtype), (name, check_finite)


@pytest.mark.parametrize("spec", SPECS)
def test_a_layer_and_a_language_model_on_meta_run_shapes_only(spec):
    layer = AttentionLayer(spec, 8, 2, check_finite=True).to("meta")
    y, _ = layer(torch.empty(2, 3, 8, device="meta"))
    assert (y.device.type, y.shape) == ("meta", (2, 3, 8))
    model = DecoderLM(spec, DecoderConfig(vocab_size=7, d_model=8, n_heads=2, n_layers=1, d_ff=8, context=8))
    logits, states = model.to("meta")(torch.tensor([[1, 2, 3, 4, 5]], device="meta"))
    assert (logits.device.type, logits.shape, states[0].position) == ("meta", (1, 5, 7), 5)
