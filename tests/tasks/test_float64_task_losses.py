"""A float64 task model's loss and evaluation are computed in float64, as its kernels are.

Each task's loss cast the model's output to fp32 (``.float()``), so a float64 model trained and was
scored on losses rounded to fp32 (relative error 1e-8 for retrieval, 1e-7 for MQAR) and its gradients
were rounded with them. The references here are the losses' formulas written out in float64.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fwbench.tasks import TASKS, MQARConfig, RetrievalConfig, ShakespeareConfig
from fwbench.tasks.lm_evaluation import sliding_window_losses, token_losses
from fwbench.tasks.lm_model import DecoderLM
from fwbench.tasks.retrieval import retrieval_loss

#: float64 against a float64 reference of the same sum: far below fp32's rounding (1e-7)
FLOAT64_REL = 1e-12


def _close64(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == torch.float64, actual.dtype
    assert torch.allclose(actual, expected, rtol=FLOAT64_REL, atol=0.0), (actual, expected)


@pytest.mark.parametrize("variant", ["linear", "dpfp-delta:nu=1"])
def test_retrieval_loss_of_a_float64_model_is_float64(variant):
    torch.manual_seed(0)
    task, config = TASKS["retrieval"], RetrievalConfig(setting=1, S=8, d_key=8, batch_size=4)
    model = task.build_model(config, variant).double()
    batch = task.train_batch(config, torch.Generator().manual_seed(1))
    predicted = model(batch["keys"], batch["values"], batch["queries"])
    codes = F.one_hot(batch["targets"], config.S).double()
    _close64(task.loss(model, batch, config), 0.5 * ((predicted - codes) ** 2).sum(-1).mean())
    # the loss's gradient reaches the parameters in float64 too
    task.loss(model, batch, config).backward()
    assert all(p.grad.dtype == torch.float64 for p in model.parameters() if p.grad is not None)


def test_retrieval_loss_keeps_fp32_for_fp32_and_fp16_predictions():
    targets = torch.tensor([[1, 0]])
    for dtype in (torch.float16, torch.float32):
        predicted = torch.tensor([[[0.25, 0.5], [1.0, 0.0]]], dtype=dtype)
        loss = retrieval_loss(predicted, targets, 2)
        assert loss.dtype == torch.float32
        assert loss.item() == pytest.approx(0.5 * (0.25**2 + 0.5**2) / 2)


def test_mqar_loss_and_evaluation_of_a_float64_model_are_float64():
    torch.manual_seed(0)
    task = TASKS["mqar"]
    config = MQARConfig(vocab_size=32, seq_len=16, num_kv_pairs=2, d_model=8, batch_size=4, eval_sequences=4)
    model = task.build_model(config, "linear").double()
    batch = task.train_batch(config, torch.Generator().manual_seed(1))
    logits, labels = model(batch["inputs"], batch["labels"])
    reference = -torch.log_softmax(logits, dim=-1).gather(-1, labels[:, None]).mean()
    _close64(task.loss(model, batch, config), reference)
    evaluated = task.evaluate(model, config, torch.Generator().manual_seed(2), torch.device("cpu"))
    eval_batch = task._batch(config, config.eval_sequences, torch.Generator().manual_seed(2))
    logits, labels = model(eval_batch["inputs"], eval_batch["labels"])
    expected = -torch.log_softmax(logits, dim=-1).gather(-1, labels[:, None]).mean()
    assert evaluated["loss"] == pytest.approx(expected.item(), rel=FLOAT64_REL)


def test_shakespeare_loss_and_token_losses_of_a_float64_model_are_float64():
    torch.manual_seed(0)
    task = TASKS["shakespeare"]
    config = ShakespeareConfig(d_model=8, n_heads=2, n_layers=1, d_ff=16, context=6, batch_size=2)
    vocabulary = 7  # the model built directly: the task's build_model reads the corpus for its vocabulary
    model = DecoderLM("linear", config.decoder_config(vocabulary)).double().eval()
    batch = torch.randint(0, vocabulary, (2, 7), generator=torch.Generator().manual_seed(1))
    logits, _ = model(batch[:, :-1])
    per_token = -torch.log_softmax(logits, dim=-1).gather(-1, batch[:, 1:, None])[..., 0]
    _close64(task.loss(model, batch, config), per_token.mean())
    stream = torch.randint(0, vocabulary, (20,), generator=torch.Generator().manual_seed(2))
    logits, _ = model(stream[None, :-1])
    carried = -torch.log_softmax(logits[0], dim=-1).gather(-1, stream[1:, None])[:, 0]
    _close64(token_losses(model, stream, 6, torch.device("cpu"), carry=True), carried)
    for losses in (token_losses(model, stream, 6, torch.device("cpu"), carry=False),
                   sliding_window_losses(model, stream, 6, 3, torch.device("cpu"))):
        assert losses.dtype == torch.float64 and losses.shape == (19,)
    # each segment of 6 tokens read on its own (starts 0, 6, 12: batched; 18: the tail), in float64:
    # a dtype check alone let either path round to fp32 (torch.cat promotes fp32 beside float64)
    segments = []
    for start in range(0, 19, 6):
        window = stream[start : start + 7]
        logits, _ = model(window[None, :-1])
        segments.append(-torch.log_softmax(logits[0], dim=-1).gather(-1, window[1:, None])[:, 0])
    _close64(token_losses(model, stream, 6, torch.device("cpu"), carry=False), torch.cat(segments))
