"""Layers and models after ``.to(dtype)`` (issue 14.3): fp16, bf16, fp32 and float64, every variant,
every form, and generation with a carried state.

Before the fix ``AttentionLayer("favor:m=16", 32, 2).to(torch.bfloat16)`` raised "expected m1 and
m2 to have the same dtype" on a bf16 input (Ω cast to bf16, the features computed in fp32). Each
cast model is compared with the same weights cast back to fp32, so a path that silently computes
in the wrong precision, or a state carried in the wrong dtype, shows as an error beyond the
dtype's rounding.
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import FORMS, SPECS, assert_close

from fwbench.tasks.lm_model import DecoderConfig, DecoderLM
from fwbench.tasks.mqar import MQARModel
from fwbench.tasks.retrieval import RetrievalModel
from fwbench.variants import AttentionLayer, using_form

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64}
#: Relative RMSE against the fp32 model on the same rounded weights and inputs: the outputs are
#: rounded to the dtype once per layer (unit roundoff 4.9e-4 fp16, 3.9e-3 bf16), and float64
#: computes what fp32 does, exactly.
REL_RMSE = {torch.float16: 5e-3, torch.bfloat16: 4e-2, torch.float32: 1e-6, torch.float64: 1e-5}
D_MODEL, N_HEADS, T = 32, 2, 11


def run_in(form: str, module: torch.nn.Module, *args, **kwargs):
    """``module(*args, **kwargs)`` with every attention inside it switched to ``form``."""
    with using_form(module, form):
        return module(*args, **kwargs)


def cast_and_reference(model: torch.nn.Module, dtype: torch.dtype):
    """``model`` cast to ``dtype`` and a copy of the cast weights back in fp32 (eval mode both)."""
    torch.manual_seed(0)
    cast = model.to(dtype).eval()
    return cast, copy.deepcopy(cast).float().eval()


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("spec", SPECS)
def test_attention_layer_works_after_to_dtype_in_every_form_and_with_a_carried_state(spec, dtype):
    torch.manual_seed(0)
    layer, reference = cast_and_reference(AttentionLayer(spec, D_MODEL, N_HEADS, chunk_size=4), dtype)
    x = torch.randn(2, T, D_MODEL).to(dtype)
    with torch.no_grad():
        expected, _ = run_in("recurrent", reference, x.float())
        for form in FORMS:
            y, _ = run_in(form, layer, x)
            assert y.dtype == dtype
            assert_close(y.float(), expected, REL_RMSE[dtype])
        # generation: a prefix in one call, then one token at a time through the carried state
        y_prefix, state = run_in("chunk", layer, x[:, :6])
        steps = [y_prefix]
        for t in range(6, T):
            y_t, state = run_in("recurrent", layer, x[:, t:t + 1], state=state)
            steps.append(y_t)
        assert_close(torch.cat(steps, dim=1).float(), expected, REL_RMSE[dtype])


def test_favor_layer_cast_to_bf16_reads_a_bf16_input():
    """The issue's exact case."""
    layer = AttentionLayer("favor:m=16", 32, 2).to(torch.bfloat16)
    y, _ = layer(torch.randn(2, 5, 32, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16 and torch.isfinite(y).all()


def test_favor_redraw_keeps_the_cast_dtype():
    layer = AttentionLayer("favor:m=16", 32, 2).to(torch.float64)
    layer.attention.redraw_features()
    assert layer.attention.feature_map.omega.dtype == torch.float64


def test_favor_redraw_keeps_the_device():
    """Ω is drawn on the CPU (the global RNG) and moved to the layer's device: here the meta device,
    which stands in for a GPU on a machine without one."""
    layer = AttentionLayer("favor:m=16", 32, 2).to("meta")
    layer.attention.redraw_features()
    assert layer.attention.feature_map.omega.device.type == "meta"


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("spec", ["softmax", "favor:m=8", "dpfp-delta:nu=1"])
def test_decoder_lm_forward_and_generation_after_to_dtype(spec, dtype):
    torch.manual_seed(0)
    config = DecoderConfig(vocab_size=12, d_model=16, n_heads=2, n_layers=1, d_ff=32, context=8, chunk_size=4)
    model, reference = cast_and_reference(DecoderLM(spec, config), dtype)
    tokens = torch.randint(0, 12, (2, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, _ = run_in("recurrent", reference, tokens)
        for form in FORMS:
            logits, _ = run_in(form, model, tokens)
            assert logits.dtype == dtype
            assert_close(logits.float(), expected, REL_RMSE[dtype])
    sampled, states = model.generate(tokens[:, :5], n_tokens=4, temperature=0.0)
    assert sampled.shape == (2, 4) and len(states) == 1


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("spec", ["linear", "favor-delta:m=8"])
def test_mqar_model_after_to_dtype(spec, dtype):
    torch.manual_seed(0)
    model, reference = cast_and_reference(MQARModel(spec, vocab_size=16, d_model=16, n_heads=2, chunk_size=4), dtype)
    tokens = torch.randint(0, 16, (2, 12), generator=torch.Generator().manual_seed(2))
    labels = torch.randint(0, 16, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected, _ = run_in("recurrent", reference, tokens, labels)
        for form in FORMS:
            logits, _ = run_in(form, model, tokens, labels)
            assert_close(logits.float(), expected, REL_RMSE[dtype])


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("spec", ["linear", "favor:m=8", "dpfp-delta:nu=1", "favor-delta:m=8"])
def test_retrieval_model_after_to_dtype(spec, dtype):
    torch.manual_seed(0)
    model, reference = cast_and_reference(RetrievalModel(spec, S=6, d_key=8, chunk_size=4), dtype)
    g = torch.Generator().manual_seed(4)
    keys, values = torch.randint(0, 6, (3, 9), generator=g), torch.randint(0, 6, (3, 9), generator=g)
    queries = torch.randint(0, 6, (3, 2), generator=g)
    with torch.no_grad():
        expected = run_in("recurrent", reference, keys, values, queries)
        for form in ("auto", *FORMS):
            assert_close(run_in(form, model, keys, values, queries).float(), expected, REL_RMSE[dtype])


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch's deprecation notice for quantized tensors
@pytest.mark.parametrize("spec", SPECS)
def test_a_layer_quantized_with_quantize_dynamic_takes_its_float_input(spec):
    """``torch.ao.quantization.quantize_dynamic`` swaps the projections for int8 Linears whose ``weight`` is
    a method; the layer's input check read ``q_proj.weight.device`` and raised "AttributeError: 'function'
    object has no attribute 'device'" on every fp32 input (c851c8d). A projection with no floating weight
    tensor decides what it takes: the quantized layer answers as the fp32 one, within int8 rounding."""
    torch.manual_seed(0)
    layer = AttentionLayer(spec, D_MODEL, N_HEADS).eval()
    quantized = torch.ao.quantization.quantize_dynamic(copy.deepcopy(layer), {torch.nn.Linear}, dtype=torch.qint8)
    x = torch.randn(2, T, D_MODEL)
    with torch.no_grad():
        y, _ = quantized(x)
        assert_close(y, layer(x)[0], rel_rmse=0.1)
