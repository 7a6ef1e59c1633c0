"""What a run counts (loop/accounting.py): devices held, per-step counts, FLOPs."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from scalerl.loop.accounting import count_step
from scalerl.state import RunState


def test_devices_held_count_every_device_of_the_run():
    """compute/device_hours = wall clock x devices held: on CPU a device is one CPU thread (the
    trainer's plus a pipeline generator process's own), on GPU a GPU."""
    from scalerl.loop.accounting import devices_held
    from scalerl.rollout.modes import Placement

    cpu, gpu0, gpu1 = torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda", 1)
    # sync / ppo_off_policy on CPU: the generator shares the trainer's threads
    assert devices_held(cpu, Placement(2, 2, cpu), 1, generator_process=False) == 2
    # pipeline_rl on CPU: the generator process has threads of its own
    assert devices_held(cpu, Placement(1, 1, cpu), 1, generator_process=True) == 2
    assert devices_held(cpu, Placement(6, 2, cpu), 1, generator_process=True) == 8
    # several trainer processes on CPU: each one's threads
    assert devices_held(cpu, Placement(4, 4, cpu), 2, generator_process=False) == 8
    # GPUs: the trainers', plus the generator's when it has one of its own
    assert devices_held(gpu0, Placement(8, 8, gpu0), 1, generator_process=True) == 1
    assert devices_held(gpu0, Placement(8, 8, gpu1, generator_gpus=1), 1, generator_process=True) == 2
    assert devices_held(gpu0, Placement(8, 8, gpu0), 4, generator_process=False) == 4


def test_a_step_adds_its_counts_to_the_run_state():
    """FLOPs are 2N per generated and 6N per trained token (all ranks'); generated tokens of other
    ranks are added here (this rank's were counted when it generated them); lags add up per lag."""
    run = SimpleNamespace(state=RunState(gen_tokens=10), n_params=100)
    counts = {"dropped": 2, "gen_tokens": 30, "trained_tokens": 20, "lag/0": 12, "lag/2": 8}
    count_step(run, {"gen_tokens": 10}, counts)
    count_step(run, {"gen_tokens": 10}, {**counts, "dropped": 1, "lag/2": 1})
    st = run.state
    assert st.zero_variance_dropped == 3
    assert st.lag_tokens == {0: 24, 2: 9}
    assert st.gen_tokens == 10 + 20 + 20
    assert st.flops == 2 * (2.0 * 100 * 30 + 6.0 * 100 * 20)
