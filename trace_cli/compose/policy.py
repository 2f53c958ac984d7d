"""Model references as policies: `load_policy` turns any reference (models.refs.resolve_model) into the agent
that drives it, and a composition artifact into its policy with the HF policy's interface (`act`, `generate`).

`load_policy` lives here, the lowest layer that may import every kind of policy: the agents (agents.*) and the
compositions, which need the compose package. Layers below receive a policy object, never a reference.

moe and merge are ordinary models after loading (gated layers / merged weights), so they run in `HFPolicy`;
the router needs to see conversations, so `RouterPolicy` routes each episode (once, or at every new user turn),
merges the chosen adapters into the weights and generates for each group of episodes that share a decision.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trace_cli.agents.base import as_turn
from trace_cli.agents.hf import HFPolicy
from trace_cli.compose import GATES_FILE, MERGED_DIR
from trace_cli.compose.adapters import check_targets, load_lora
from trace_cli.compose.spec import read_composition
from trace_cli.envs.rollout import Turn
from trace_cli.models import device
from trace_cli.models.refs import ModelRef

ROUTE_ATTR = "compose_route"  # set on each EpisodeState: {"users": n, "mix": {...}, "decisions": [...]}


def load_model(path: Path, base_dir: Path, *, base_digest: str | None = None):
    """(model, tokenizer, doc, extra) for the composition at `path` on the base model in `base_dir`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_cli.errors import UsageError

    doc = read_composition(path)
    if base_digest is not None and doc["base"]["digest"] != base_digest:
        raise UsageError(
            f"composition {path}: built on base {doc['base']['digest'][:12]}…, not on the model given "
            f"({base_digest[:12]}…)"
        )
    tok = AutoTokenizer.from_pretrained(base_dir, padding_side="left")
    model = device.place(AutoModelForCausalLM.from_pretrained(base_dir, dtype=device.dtype()))
    extra: dict[str, Any] = {}
    if doc["method"] == "merge":
        from trace_cli.compose.merge import load_merged

        model = load_merged(model, Path(path) / doc.get("merged", MERGED_DIR))
    else:
        experts = [load_lora(Path(path) / e["dir"], e["name"]) for e in doc["experts"]]
        targets = check_targets(model, experts)
        if doc["method"] == "moe":
            from trace_cli.compose.moe import attach, load_gates

            gates = doc["gates"]
            layers, trace = attach(
                model,
                experts,
                targets,
                context=gates["context"],
                horizon=gates.get("horizon", 64.0),
                pad_id=tok.pad_token_id,
            )
            load_gates(
                layers,
                Path(path) / gates["file"],
                base_digest=doc["base"]["digest"],
                experts=[e["name"] for e in doc["experts"]],
                origin=str(path),
            )
            extra.update(layers=layers, trace=trace)
        else:
            from trace_cli.compose.router import WeightMerger

            extra["merger"] = WeightMerger(model, experts, targets)
    model.eval()
    return model, tok, doc, extra


class RouterPolicy(HFPolicy):
    """The paper's task router in front of an HF model whose weights it re-merges per routing decision."""

    def __init__(self, model, tokenizer, doc: dict[str, Any], merger, **kw):
        kw["reuse_cache"] = False  # a saved KV cache was computed under another merge of the weights
        super().__init__(model, tokenizer, **kw)
        from trace_cli.compose.router import Skill, label_ids

        s = doc["settings"]["router"]
        self.settings = s
        self.skills = [Skill("base", s["base_description"])] + [
            Skill(e["name"], e["description"]) for e in doc["experts"]
        ]
        self.label_ids = label_ids(tokenizer, len(self.skills))
        self.merger = merger
        self.decisions: list[dict[str, Any]] = []  # every routing decision, in order (for reports and tests)
        self.last_routes: list[dict[str, float]] = []  # the last `generate` call's decisions, one per prompt
        self._head: Any = False  # router.classifier_head, made at the first classification (None: not cached)

    def route(self, conversations: list[list[dict[str, Any]]]) -> list[dict[int, float]]:
        """One mix (expert index -> alpha; empty = base) per conversation, from the frozen base model."""
        from trace_cli.compose.router import classifier_head, classifier_prompt, classify, decide

        if not conversations:
            return []
        self.merger.apply({})  # the classifier is the base model
        if self._head is False:  # the skill list's keys/values, the same for every conversation
            self._head = classifier_head(self.model, self.tok, self.skills)
        prompts = [
            classifier_prompt(self.tok, self.skills, m, self.settings["history"]) for m in conversations
        ]
        probs = classify(
            self.model, self.tok, prompts, self.label_ids, self.settings["temperature"], self._head
        )
        mixes = [decide(p, self.settings["strategy"], self.settings["top_p"]) for p in probs]
        for p, mix in zip(probs, mixes, strict=True):
            self.decisions.append(
                {
                    "probs": {sk.name: round(x, 4) for sk, x in zip(self.skills, p, strict=True)},
                    "mix": {self.skills[i].name: round(a, 4) for i, a in mix.items()},
                }
            )
        return mixes

    def act(self, states) -> list[Turn]:
        from trace_cli.models.chat import render

        need = []
        for s in states:
            users = sum(1 for m in s.messages if m.get("role") == "user")
            r = getattr(s, ROUTE_ATTR, None)
            if r is None or (self.settings["reroute"] == "user_turn" and users > r["users"]):
                need.append((s, users))
        for (s, users), mix in zip(need, self.route([s.messages for s, _ in need]), strict=True):
            r = getattr(s, ROUTE_ATTR, None) or {"decisions": []}
            r.update(users=users, mix=mix)
            r["decisions"].append({self.skills[i].name: a for i, a in mix.items()} or {"base": 1.0})
            setattr(s, ROUTE_ATTR, r)
        out: list[Turn | None] = [None] * len(states)
        groups: dict[tuple, list[int]] = {}
        for i, s in enumerate(states):
            key = tuple(sorted(getattr(s, ROUTE_ATTR)["mix"].items()))
            groups.setdefault(key, []).append(i)
        for key, idx in groups.items():
            self.merger.apply(dict(key))
            prompts = [
                render(self.tok, states[i].messages, states[i].tools, add_generation_prompt=True) for i in idx
            ]
            for i, (text, ids, prompt_ids) in zip(idx, super().generate(prompts), strict=True):
                self._account(states[i], prompt_ids, ids)
                out[i] = as_turn(text, self.parse)
        return out  # type: ignore[return-value]

    def generate(
        self, prompts: list[str], *, conversations: list[list[dict[str, Any]]] | None = None, **kw
    ) -> list[tuple[str, list[int], list[int]]]:
        """Rendered prompts (`trace serve`), each routed on its conversation as eval routes it: on the messages
        up to the user message at which eval would have decided (`routed_part`). Without conversations, on
        the prompt's text. `last_routes` then holds each prompt's decision, as eval records it."""
        if conversations is None:
            routed = self.routes_for(None, prompts=prompts)
        else:
            routed = self.routes_for(conversations)
        self.last_routes = [route for _, route in routed]
        out: list[Any] = [None] * len(prompts)
        groups: dict[tuple, list[int]] = {}
        for i, (key, _) in enumerate(routed):
            groups.setdefault(key, []).append(i)
        for key, idx in groups.items():
            self.use_route(key)
            for i, r in zip(idx, super().generate([prompts[i] for i in idx], **kw), strict=True):
                out[i] = r
        return out

    def routes_for(
        self, conversations: list[list[dict[str, Any]]] | None, *, prompts: list[str] | None = None
    ) -> list[tuple[tuple, dict[str, float]]]:
        """(key for `use_route`, decision as eval records it) per conversation, each routed on the messages
        eval would have decided on (`routed_part`); without conversations, on the prompts' text. Runs the
        classifier on the base weights (leaves them merged as the base)."""
        if conversations is None:
            parts = [[{"role": "user", "content": p[-4000:]}] for p in prompts or []]
        else:
            parts = [routed_part(c, self.settings["reroute"]) for c in conversations]
        mixes = self.route(parts)
        return [
            (tuple(sorted(m.items())), {self.skills[i].name: a for i, a in m.items()} or {"base": 1.0})
            for m in mixes
        ]

    def use_route(self, key: tuple) -> None:
        """Merge the weights for a decision (`routes_for`'s key)."""
        self.merger.apply(dict(key))


def routed_part(messages: list[dict[str, Any]], reroute: str) -> list[dict[str, Any]]:
    """The messages eval's router decided on for the next assistant turn of this conversation: eval routes
    when a user message arrives (the first one only, or every one with `reroute: user_turn`) and keeps that
    decision for the tool calls and turns that follow, so a stateless request is routed on the conversation
    up to and including its first (or last) user message. Without a user message: all of it."""
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if not users:
        return messages
    return messages[: (users[-1] if reroute == "user_turn" else users[0]) + 1]


def load_composition_policy(
    path: Path,
    base_dir: Path,
    *,
    base_digest: str | None = None,
    name: str = "composition",
    **kw,
):
    """The policy for a composition artifact: RouterPolicy for router, HFPolicy for moe and merge."""
    model, tok, doc, extra = load_model(path, base_dir, base_digest=base_digest)
    if doc["method"] == "router":
        return RouterPolicy(model, tok, doc, extra["merger"], name=name, **kw)
    if doc["method"] == "moe" and doc["gates"]["context"]:
        # the gates' running context lives with one forward's batch rows, not with an episode's saved KV
        # cache: every turn is prefilled afresh (generate still caches within the turn)
        kw["reuse_cache"] = False
    policy = HFPolicy(model, tok, name=name, **kw)
    policy.routing = extra  # moe: the gated layers and their trace (tests read the routing decisions)
    return policy


def load_policy(ref: ModelRef, *, record_tokens: bool = False, **sampling: Any):
    """The policy that drives `ref`. `sampling`: temperature, top_p, max_new_tokens, seed, from the stage's config
    (`SamplingSettings.policy_kwargs()` and its `seed`); an OpenAI endpoint needs them all, a local model at
    least temperature and max_new_tokens (top_p and seed too to sample); the built-ins take only the seed."""
    from trace_cli.agents import scripted
    from trace_cli.models.importer import context_of, read_meta

    if ref.kind == "openai":
        from trace_cli.agents.openai_policy import OpenAIPolicy
        from trace_cli.llm.openai_client import parse_ref

        return OpenAIPolicy(parse_ref(ref.extra["ref"]), **sampling)
    if ref.kind == "builtin":
        seed = sampling["seed"]
        if ref.display.startswith("policy:demonstration"):
            from trace_cli.models.refs import demonstration_params

            deficits, rate = demonstration_params(ref.display)
            return scripted.DemonstrationPolicy(deficits, rate, seed)
        return (
            scripted.ReferencePolicy() if ref.display == "policy:reference" else scripted.RandomPolicy(seed)
        )
    if ref.kind == "composition":
        # adapters combined by `trace compose` on their base model: the router routes each conversation,
        # moe gates each token, merge is one merged model
        from transformers import AutoConfig

        return load_composition_policy(
            ref.adapter_path,
            ref.path,
            base_digest=ref.extra.get("base_digest"),
            name=ref.display,
            tool_format=read_meta(ref.path).get("tool_format"),
            max_context=context_of(AutoConfig.from_pretrained(ref.path)),
            record_tokens=record_tokens,
            **sampling,
        )
    from trace_cli.models.refs import load_hf

    model, tok = load_hf(ref)
    return HFPolicy(
        model,
        tok,
        tool_format=read_meta(ref.path).get("tool_format"),
        max_context=context_of(model.config),
        name=ref.display,
        record_tokens=record_tokens,
        prefix_cache=device.prefix_cache(model),
        **sampling,
    )


__all__ = [
    "GATES_FILE",
    "RouterPolicy",
    "load_composition_policy",
    "load_model",
    "load_policy",
    "routed_part",
]
