"""Random streams under torchrun (issue 14 item 8): each rank draws its own dropout masks, and all
ranks draw the same FAVOR+ features. Two CPU processes (gloo), a tiny language model with
dropout 0.5 and FAVOR+ features, three training steps, on a small fake corpus.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest

TEXT = "".join(f"{who}: I am {what}; speak, {who.lower()}!\n" for who, what in [("ROMEO", "here"), ("NURSE", "old")] * 80)

WORKER = textwrap.dedent('''
    import dataclasses, hashlib, json, sys
    import torch
    from torch import nn
    from fwbench import tasks
    from fwbench.run import distributed
    from fwbench.run.training import fit
    from fwbench.tasks.shakespeare import ShakespeareConfig, ShakespeareTask
    from fwbench.variants import Favor

    data_dir, sha256, out = sys.argv[1:4]
    torch.set_num_threads(1)
    tasks.TASKS["shakespeare"] = ShakespeareTask(data_dir=data_dir, sha256=sha256)
    masks, omegas = [], []
    dropout_forward, redraw = nn.Dropout.forward, Favor.redraw_features

    def recording_dropout(self, x):
        y = dropout_forward(self, x)
        if self.training and self.p > 0:
            masks.append(hashlib.sha256((y == 0).numpy().tobytes()).hexdigest())
        return y

    def recording_redraw(self):
        redraw(self)
        omegas.append(hashlib.sha256(self.omega.numpy().tobytes()).hexdigest())

    nn.Dropout.forward, Favor.redraw_features = recording_dropout, recording_redraw
    if sys.argv[4:] == ["solo-cut"]:  # one process, no torchrun: stopped after step 3, checkpoint at step 2
        class Stop(Exception):
            pass

        def stop_at_3(step, loss):
            if step == 3:
                raise Stop

        config = ShakespeareConfig(d_model=16, n_heads=2, n_layers=1, d_ff=32, context=16, batch_size=4, max_steps=4,
                                   eval_every=4, eval_segments=2, dropout=0.5, sample_tokens=5, stream_eval=False,
                                   positional="learned", checkpoint_every=2, prompt="ROMEO")
        try:
            fit("shakespeare", "linear", config, 1, torch.device("cpu"), stop_at_3, f"{out}/solo.pt")
        except Stop:
            pass
        sys.exit(0)
    context, device = distributed.start(distributed.context_from_environment(), torch.device("cpu"))
    config = ShakespeareConfig(d_model=16, n_heads=2, n_layers=1, d_ff=32, context=16, batch_size=4, max_steps=3,
                               eval_every=3, eval_segments=2, dropout=0.5, sample_tokens=5, stream_eval=False,
                               positional="learned", checkpoint_every=0, prompt="ROMEO")
    if sys.argv[4:] == ["resume"]:  # uninterrupted, then stopped after step 3 and resumed from step 2
        class Stop(Exception):
            pass

        def stop_at_3(step, loss):
            if step == 3:
                raise Stop

        config = dataclasses.replace(config, max_steps=4, checkpoint_every=2)
        fit("shakespeare", "favor-delta:m=8", config, 1, device, checkpoint_path=f"{out}/whole.pt", distributed=context)
        whole = masks[6:]  # steps 3 and 4 (3 dropout calls a step)
        try:
            fit("shakespeare", "favor-delta:m=8", config, 1, device, stop_at_3, f"{out}/cut.pt", distributed=context)
        except Stop:
            pass
        del masks[:]
        fit("shakespeare", "favor-delta:m=8", config, 1, device, checkpoint_path=f"{out}/cut.pt", distributed=context)
        with open(f"{out}/resume{context.rank}.json", "w") as handle:
            json.dump({"whole": whole, "resumed": masks}, handle)
    elif sys.argv[4:] == ["solo-resume"]:  # the one-process checkpoint of solo-cut, resumed by 2 ranks
        config = dataclasses.replace(config, max_steps=4, checkpoint_every=2)
        fit("shakespeare", "linear", config, 1, device, checkpoint_path=f"{out}/solo.pt", distributed=context)
        with open(f"{out}/solo{context.rank}.json", "w") as handle:
            json.dump(masks, handle)
    else:
        result = fit("shakespeare", "favor-delta:m=8", config, 1, device, distributed=context)
        with open(f"{out}/rank{context.rank}.json", "w") as handle:
            json.dump({"masks": masks, "omegas": omegas, "digests": result.distributed["parameter_sha256"]}, handle)
    distributed.stop()
    # past this point torch 2.13's gloo teardown at interpreter exit aborted now and then ("terminate called
    # without an active exception", SIGABRT in C++ destructors, no Python frame: 5 of 28 runs on an idle
    # 2-core machine), after every rank had written its results and left the group; the results are
    # closed files, so skip the destructors
    sys.stdout.flush(); sys.stderr.flush()
    import os; os._exit(0)
''')


def run_two_ranks(tmp_path, *mode: str, nproc: int | None = 2) -> None:
    """The worker script under torchrun, ``nproc`` processes (``None``: one, without torchrun), on the
    fake corpus; results in ``tmp_path``."""
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / "input.txt").write_text(TEXT)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    sha256 = hashlib.sha256(TEXT.encode()).hexdigest()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launcher = [] if nproc is None else ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    done = subprocess.run(
        [sys.executable, *launcher, str(script), str(data), sha256, str(tmp_path), *mode],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
def test_each_rank_draws_its_own_dropout_masks_and_the_same_features(tmp_path):
    run_two_ranks(tmp_path)
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    # 3 steps × (embedding + attention and feed-forward branches of 1 layer) = 9 dropout calls per rank
    assert len(rank0["masks"]) == len(rank1["masks"]) == 9
    assert all(a != b for a, b in zip(rank0["masks"], rank1["masks"])), "a rank repeated another's dropout mask"
    assert len(set(rank0["masks"])) == 9
    assert rank0["omegas"] == rank1["omegas"] and len(set(rank0["omegas"])) == len(rank0["omegas"]) > 0
    assert rank0["digests"][0] == rank0["digests"][1] == rank1["digests"][1]


@pytest.mark.slow
def test_a_resumed_run_continues_each_ranks_own_dropout_stream(tmp_path):
    """The checkpoint keeps every rank's dropout stream (rank 0 gathers them), not only rank 0's."""
    run_two_ranks(tmp_path, "resume")
    rank0, rank1 = (json.loads((tmp_path / f"resume{r}.json").read_text()) for r in (0, 1))
    for rank in (rank0, rank1):
        assert len(rank["whole"]) == 6 and rank["resumed"] == rank["whole"]
    assert all(a != b for a, b in zip(rank0["resumed"], rank1["resumed"]))


@pytest.mark.slow
def test_two_ranks_resuming_a_one_process_checkpoint_draw_their_own_masks(tmp_path):
    """A run killed on one process and resumed under torchrun (the same run id, so the same checkpoint
    file): the file holds no rank streams, and every rank restored its global stream, so both ranks
    drew the same dropout masks from the resumed step on (6 of 6 equal). Rank 1 now starts its own."""
    run_two_ranks(tmp_path, "solo-cut", nproc=None)
    run_two_ranks(tmp_path, "solo-resume")
    rank0, rank1 = (json.loads((tmp_path / f"solo{r}.json").read_text()) for r in (0, 1))
    assert len(rank0) == len(rank1) == 6  # steps 3 and 4, 3 dropout calls a step
    assert all(a != b for a, b in zip(rank0, rank1)), "two ranks drew the same dropout mask after resuming"
