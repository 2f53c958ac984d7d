"""The smallest environment that satisfies the protocol (one message ends it), as a third-party package ships one:
the registry tests register it, and install a copy of this file as a plugin with an entry point."""

from trace_cli.envs.base import Observation, RewardBreakdown, StepResult


class EchoEnv:
    name = "echo"

    def __init__(self, word="ping", max_turns=2):
        self.word, self.max_turns, self.said = word, max_turns, []

    def reset(self, seed):
        self.said = []
        return Observation("repeat the word", [], [{"role": "user", "content": self.word}], f"echo-{seed}")

    def step(self, action):
        self.said.append(action.get("content", ""))
        return StepResult("ok", "user", True, self.verify().reward)

    def verify(self):
        ok = self.word in self.said
        return RewardBreakdown(float(ok), ok)

    def task_metadata(self):
        return {"task_id": "echo", "family": "echo", "required_capabilities": [], "reference_actions": []}

    def reference_actions(self):
        return [{"content": self.word}]


def make_echo(**params):
    return EchoEnv(**params)
