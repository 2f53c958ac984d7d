"""How the GRPO run changes TRL, through which hook: constant-reward groups leave the loss through `rollout_func`'s
env_mask (groups spanning processes included), and the one private override (log-probabilities per prompt group)
steps aside for a TRL whose method has another signature."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from grpo_helpers import set_env, tiny_model

from trace_cli.training.grpo_rollout import make_rollout_func, mask_constant_groups


class Ranks:
    """An accelerator as process `rank` of `len(shares)` sees it: `gather` concatenates every process's tensor
    in rank order (what accelerate's gather returns)."""

    def __init__(self, shares, rank):
        self.shares, self.process_index, self.device = shares, rank, "cpu"

    def gather(self, local):
        import torch

        assert local.tolist() == [float(r) for r in self.shares[self.process_index]]
        return torch.tensor([float(r) for share in self.shares for r in share])


def masks(rewards, length=3):
    return [[1] * (length - 1) + [0] for _ in rewards]


def test_constant_groups_are_masked_and_the_others_kept():
    rewards = [1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0]  # groups of 4: constant, mixed, constant
    got = mask_constant_groups(masks(rewards), rewards, 4, Ranks([rewards], 0))
    assert got[:4] == [[0, 0, 0]] * 4
    assert got[4:8] == masks(rewards)[4:8]
    assert got[8:] == [[0, 0, 0]] * 4


def test_a_group_spanning_two_processes_is_judged_whole():
    shares = [[1, 1], [1, 0]]  # one group of 4 over ranks 0 and 1: constant on rank 0 alone, mixed as a whole
    for rank, local in enumerate(shares):
        assert mask_constant_groups(masks(local), local, 4, Ranks(shares, rank)) == masks(local)
    shares = [[0, 0], [0, 0], [1, 0], [1, 1]]  # groups of 4: ranks 0+1 constant, ranks 2+3 mixed
    got = [mask_constant_groups(masks(s), s, 4, Ranks(shares, r)) for r, s in enumerate(shares)]
    assert got[0] == got[1] == [[0, 0, 0]] * 2
    assert got[2] == masks(shares[2]) and got[3] == masks(shares[3])


def test_nothing_is_masked_when_every_group_is_constant():
    rewards = [0.5] * 8  # TRL's normaliser (the loss mask's tokens) would be zero
    assert mask_constant_groups(masks(rewards), rewards, 4, Ranks([rewards], 0)) == masks(rewards)


def test_rollout_func_masks_constant_groups_of_replayed_episodes():
    """The rollout_func TRL calls hands back the masked env_mask, and the model's tokens per episode unmasked
    (the completion_length metric)."""
    from types import SimpleNamespace

    def episode(reward):
        return {
            "prompt_ids": [1, 2],
            "completion_ids": [3, 4, 5],
            "env_mask": [1, 0, 1],
            "reward": reward,
            "success": reward == 1,
            "n_actions": 1,
            "termination": "done",
        }

    replay = [episode(r) for r in (1, 1, 0, 1)]  # groups of 2: constant, mixed
    for drop, first in ((True, [0, 0, 0]), (False, [1, 0, 1])):
        spec = SimpleNamespace(
            replay=replay,
            num_generations=2,
            sampling=None,
            use_vllm=False,
            drop_constant_groups=drop,
            make_env=lambda: SimpleNamespace(),
        )
        func = make_rollout_func(spec, tokenizer=None, max_context=None, state={})
        trainer = SimpleNamespace(accelerator=Ranks([[1, 1, 0, 1]], 0))
        cols = func(["trace-seed:1"] * 4, trainer)
        assert cols["env_mask"][:2] == [first, first]
        assert cols["env_mask"][2:] == [[1, 0, 1], [1, 0, 1]]
        assert cols["env_model_tokens"] == [2.0] * 4


def test_logps_override_fits_only_trl_116s_signature():
    from trace_cli.training.grpo_trainer import TraceGRPOTrainer, logps_override_fits

    def other(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, **kw): ...

    assert logps_override_fits()  # the pinned TRL
    assert logps_override_fits(TraceGRPOTrainer._get_per_token_logps_and_entropies)  # the override's own
    assert not logps_override_fits(other)


@pytest.mark.timeout(300)
def test_another_trl_signature_gets_trls_own_logps(tmp_path, tmp_path_factory):
    """A TRL whose log-probability method takes other parameters: the trainer class keeps TRL's method (the
    override is dropped, the shared-prompt path off) and says so once; a GRPO run still trains."""
    set_env()
    model_dir = tiny_model(tmp_path_factory)
    script = textwrap.dedent(
        f"""
        import pathlib, sys, trl

        real = trl.GRPOTrainer._get_per_token_logps_and_entropies

        def changed(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, **kw):
            return real(self, model, input_ids, attention_mask, logits_to_keep, batch_size, **kw)

        trl.GRPOTrainer._get_per_token_logps_and_entropies = changed
        from trace_cli.training.grpo_trainer import TraceGRPOTrainer

        assert TraceGRPOTrainer._get_per_token_logps_and_entropies is changed
        assert TraceGRPOTrainer.shared_prompt is False

        from grpo_helpers import grpo_spec, register_parity
        from trace_cli.training.grpo import train_grpo

        register_parity()
        run = dict(num_generations=4, per_device_batch_size=8, gradient_accumulation_steps=1, max_steps=2,
                   max_turns=2, max_new_tokens=10, max_completion_length=64, learning_rate=0.05,
                   checkpoint_every=0, lora=dict(r=4, alpha=8, dropout=0.0, target_modules="all-linear"))
        res = train_grpo(grpo_spec(pathlib.Path({str(model_dir)!r}), pathlib.Path({str(tmp_path)!r}) / "out",
                                   list(range(40)), **run))
        assert res.global_step == 2
        print("ok")
        """
    )
    helpers = os.path.dirname(__file__)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([helpers, *sys.path])}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"
    assert out.stderr.count("keeps TRL's own log-probabilities") == 1
