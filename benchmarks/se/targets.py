"""What the benchmark runs on for each target: the environment its training rollouts come from (diagnosis, GRPO
on the target), the one its test seeds are evaluated on, and their seeds.

`shop` and `shop-mixed` are procedural: one environment, seeds drawn from disjoint ranges (TARGET_TRAIN for
training, --held-out for the test, --validation to choose). τ²-bench's domains have a fixed set of tasks and their
own split: training rollouts come from `split=train`, the test is `split=test` (every task once: seeds 0:N), and
choices are made on training tasks, never on test ones. Their user is `--tau2-user` (`user=scripted` by default:
a CPU smoke run whose numbers are not τ²-bench scores; on a GPU `user=llm&user_model=openai:URL?model=NAME`).
"""

from __future__ import annotations

from dataclasses import dataclass

TARGET_TRAIN = 300000  # target seeds for diagnosis and GRPO-on-target (disjoint from test and validation)
MAX_TURNS = {"shop": 12, "shop-mixed": 16}  # the target's own turn limit (synthesized environments: 12)
TAU2 = {"tau2-retail": (74, 40), "tau2-airline": (30, 20)}  # (train tasks, test tasks) of τ²'s own split
TAU2_USER = "user=scripted"


@dataclass(frozen=True)
class Target:
    name: str  # as the results name it
    train_env: str  # diagnosis rollouts, GRPO on the target, the MoE's gate transcripts
    test_env: str  # the held-out evaluation
    max_turns: int
    train_seeds: str  # GRPO on the target
    held_out: str | None  # the target's own test seeds (None: --held-out)
    validation: str | None  # where choices are made (None: --validation on test_env)
    synthesize: str  # `synthesize --target`

    def diagnosis_seeds(self, n: int) -> str:
        return f"0:{n}" if self.name in TAU2 else f"{TARGET_TRAIN}:{TARGET_TRAIN + n}"

    def moe_seeds(self, n: int) -> str:
        return f"0:{n}" if self.name in TAU2 else f"{TARGET_TRAIN + 50000}:{TARGET_TRAIN + 50000 + n}"


def target(name: str, tau2_user: str = TAU2_USER) -> Target:
    if name in TAU2:
        n_train, n_test = TAU2[name]
        return Target(
            name=name,
            train_env=f"{name}?split=train&{tau2_user}",
            test_env=f"{name}?split=test&{tau2_user}",
            max_turns=50,  # τ²'s environments end episodes by their own max_steps (50, the paper's)
            train_seeds=f"0:{n_train}",
            held_out=f"0:{n_test}",
            validation=f"0:{n_train}",
            synthesize=name,
        )
    return Target(
        name=name,
        train_env=name,
        test_env=name,
        max_turns=MAX_TURNS[name],
        train_seeds=f"{TARGET_TRAIN}:{TARGET_TRAIN + 100000}",
        held_out=None,
        validation=None,
        synthesize=name,
    )


KNOWN = (*MAX_TURNS, *TAU2)
