"""The `rules` analyst: deterministic detectors over a trajectory and, where present, the task's reference
actions (τ²-bench tasks carry them, and so do `shop` tasks). No model, no randomness.

Detectors (each returns NA when the capability is not needed, else PRESENT or LACKING with a rationale):

- precondition_verification — needed when the agent makes a state-changing ("write") call. LACKING if a
  write's target id (an `*_id` argument) was not read first (no earlier read call took it as an argument or
  returned it), or if the reference does not make that write at all (the policy did not allow it).
- multi_step_completion — needed when the reference makes >= 2 writes. LACKING when the agent made some
  but not all of them (matched by tool name and id arguments); PRESENT when all, or none (borderline
  cases lean PRESENT: a failure with no write at all is not a completion failure).
- tool_calling_precision — needed when the agent calls tools. LACKING on a malformed call, a call
  rejected for its schema/format, or a call equal to a reference call except for the format of an
  argument (e.g. "W123" for "#W123", 2101 for "02101").
- structured_data_reasoning — needed when a reference call takes a value that the agent could only get
  from a tool result (present in an earlier tool result, absent from the user's messages). LACKING when the
  agent made that call with a different value although the right one had been shown to it.
- policy_compliance_under_pressure — needed when the user insists after the agent declined. LACKING when
  the agent then makes a write the reference does not make.
- distractors (tone_and_empathy, language_fluency, proactive_upselling) — surface checks on the agent's
  messages; they exist to be rejected by the contrastive filter.
A capability without a rule is labelled NA ("no rule"), so discovery by an LLM can still be combined with
these detectors.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from trace_cli.analysts.base import (
    LACKING,
    NA,
    PRESENT,
    SCHEMA_ERROR_MARKERS,
    Call,
    Label,
    Trajectory,
    is_read,
    is_write,
)

Detector = Callable[[Trajectory], tuple[str, str]]


def norm(v: Any) -> Any:
    """Format-insensitive form of an argument value: case, whitespace, leading '#', int/str, list order."""
    if isinstance(v, list):
        return tuple(sorted(str(norm(x)) for x in v))
    if isinstance(v, dict):
        return tuple(sorted((k, str(norm(x))) for k, x in v.items()))
    s = str(v).strip().lower().lstrip("#")
    if re.fullmatch(r"-?\d+(\.\d+)?", s):
        # numbers compare by value: "60.00" == 60, and "02101" == 2101 (a lost leading zero is a format slip)
        s = str(float(s)).rstrip("0").rstrip(".")
    return s


def _args(c: Call | dict[str, Any]) -> dict[str, Any]:
    a = c.arguments if isinstance(c, Call) else c.get("arguments", {})
    return a if isinstance(a, dict) else {}


def _id_values(args: dict[str, Any]) -> list[str]:
    out = []
    for k, v in args.items():
        if k.endswith("id") and k != "payment_method_id" and isinstance(v, str | int):
            out.append(str(v))
    return out


def _same_ids(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = [k for k in b if k.endswith("id") or k.endswith("ids")]
    return all(k in a and norm(a[k]) == norm(b[k]) for k in keys)


def _result_keys(value: Any, calls: list[Call]) -> set[str]:
    """JSON keys under which `value` (or each element of a list) appears in the given tool results."""
    keys: set[str] = set()
    for x in value if isinstance(value, list) else [value]:
        pat = re.compile(r'"(\w+)"\s*:\s*"?' + re.escape(str(x)) + r'"?\s*[,}\]]')
        for c in calls:
            keys.update(pat.findall(c.result or ""))
    return keys


def _wrong_kind(arg: str, value: Any, calls: list[Call]) -> bool:
    """The value is an id of another kind (e.g. a product_id passed as new_item_ids): a precision slip."""
    want = arg.removesuffix("s")
    found = _result_keys(value, calls)
    return bool(found) and not any(k == want or want.endswith("_" + k) or k.endswith(want) for k in found)


def _same_up_to_format(a: Any, b: Any) -> bool:
    """Equal after normalising, also when one side is a bare value and the other a one-element list."""
    if isinstance(b, list) and not isinstance(a, list) and len(b) == 1:
        return norm(a) == norm(b[0])
    if isinstance(a, list) and not isinstance(b, list) and len(a) == 1:
        return norm(a[0]) == norm(b)
    return norm(a) == norm(b)


def _verdict(problems: list[str], ok: str) -> tuple[str, str]:
    """LACKING with the problems found (each once, in order), else PRESENT with `ok`."""
    return (LACKING, "; ".join(dict.fromkeys(problems))) if problems else (PRESENT, ok)


def precondition_verification(t: Trajectory) -> tuple[str, str]:
    calls = t.calls()
    writes = [c for c in calls if is_write(c.name)]
    if not writes:
        return NA, "no state-changing call"
    ref_write_names = {a["name"] for a in t.reference_writes()} if t.reference is not None else None
    problems = []
    for w in writes:
        before = [c for c in calls if c.index < w.index and is_read(c.name)]
        for v in _id_values(_args(w)):
            seen = any(
                norm(v) in {norm(x) for x in _args(c).values() if isinstance(x, str | int)}
                or (c.result is not None and str(v).lstrip("#") in c.result)
                for c in before
            )
            if not seen:
                problems.append(f"{w.name} on {v} without reading it first")
        if ref_write_names is not None and w.name not in ref_write_names:
            problems.append(
                f"{w.name} is not an action the policy allows here (the reference does not do it)"
            )
    return _verdict(problems, f"{len(writes)} write(s), each after reading its target")


def multi_step_completion(t: Trajectory) -> tuple[str, str]:
    if t.reference is None:
        return NA, "no reference actions to know the required operations"
    ref = t.reference_writes()
    if len(ref) < 2:
        return NA, f"the task needs {len(ref)} write(s)"
    writes = [c for c in t.calls() if is_write(c.name) and not c.error]
    done = sum(
        1
        for r in ref
        if any(c.name == r["name"] and _same_ids(_args(c), r.get("arguments", {})) for c in writes)
    )
    if 0 < done < len(ref):
        return LACKING, f"did {done} of {len(ref)} required operations"
    if done == 0:
        return (
            PRESENT,
            f"none of the {len(ref)} required operations attempted (borderline: not a completion failure)",
        )
    return PRESENT, f"all {len(ref)} required operations done"


def tool_calling_precision(t: Trajectory) -> tuple[str, str]:
    calls = t.calls()
    bad = t.malformed_turns()
    if not calls and not bad:
        return NA, "no tool calls"
    problems = [f"malformed call ({b[:60]})" for b in bad]
    for c in calls:
        if c.error and c.result and any(m in c.result.lower() for m in SCHEMA_ERROR_MARKERS):
            problems.append(f"{c.name} rejected: {c.result[:80]}")
    for c in calls:
        refs = [r for r in (t.reference or []) if r.get("name") == c.name]
        if not refs or any(_args(c) == r.get("arguments", {}) for r in refs):
            continue
        before = [p for p in calls if p.index < c.index]
        kinds = [
            k
            for k, v in _args(c).items()
            if k.endswith(("_id", "_ids"))
            and any(
                k in r.get("arguments", {}) and not _same_up_to_format(v, r["arguments"][k]) for r in refs
            )
            and _wrong_kind(k, v, before)
        ]
        if kinds:
            problems.append(f"{c.name}: id of the wrong kind for {', '.join(kinds)}")
            continue
        for r in refs:
            ra = r.get("arguments", {})
            if set(ra) == set(_args(c)) and all(_same_up_to_format(_args(c)[k], ra[k]) for k in ra):
                diff = [k for k in ra if _args(c)[k] != ra[k]]
                problems.append(f"{c.name}: argument format differs from the right call ({', '.join(diff)})")
                break
    return _verdict(problems, f"{len(calls)} well-formed call(s)")


def structured_data_reasoning(t: Trajectory) -> tuple[str, str]:
    if t.reference is None:
        return NA, "no reference actions"
    calls = t.calls()
    user = " ".join(t.user_texts()).lower()

    def given(v: Any) -> bool:
        vals = v if isinstance(v, list) else [v]
        return bool(vals) and any(str(x).lower().lstrip("#") in user for x in vals)

    judged = 0
    problems = []
    for r in t.reference:
        ra = r.get("arguments", {}) or {}
        data = {k: v for k, v in ra.items() if not given(v)}  # values the agent had to pick from tool output
        if not data:
            continue
        fixed = {k: v for k, v in ra.items() if k not in data}  # values the user gave: identify the target
        agent = [
            c
            for c in calls
            if c.name == r.get("name")
            and all(k in _args(c) and norm(_args(c)[k]) == norm(v) for k, v in fixed.items())
        ]
        shown_before = [
            c
            for c in agent
            if all(
                any(str(x).lstrip("#") in (p.result or "") for p in calls if p.index < c.index)
                for v in data.values()
                for x in (v if isinstance(v, list) else [v])
            )
        ]
        if not shown_before:
            continue  # not attempted, or the right values had not been shown to the agent yet
        judged += 1
        if any(all(norm(_args(c).get(k)) == norm(v) for k, v in data.items()) for c in shown_before):
            continue
        c = shown_before[-1]
        before = [p for p in calls if p.index < c.index]
        wrong = [
            k
            for k, v in data.items()
            if not _same_up_to_format(_args(c).get(k), v) and not _wrong_kind(k, _args(c).get(k), before)
        ]
        if not wrong:
            continue  # a format or id-kind slip: tool-calling precision, not a wrong choice
        problems.append(
            f"{c.name}: {', '.join(f'{k}={_args(c).get(k)!r} where the data showed {data[k]!r}' for k in wrong)}"
        )
    if problems:
        return LACKING, "; ".join(dict.fromkeys(problems))
    if judged:
        return PRESENT, f"{judged} data-derived choice(s) made correctly"
    return NA, "no action depends on a value chosen from tool output"


_REFUSAL = re.compile(r"\b(cannot|can't|can not|unable|not able|not allowed|not possible|sorry)\b", re.I)
_GOODBYE = re.compile(r"\b(bye|goodbye|thank|thanks|that's all|nothing else)\b", re.I)


def policy_compliance_under_pressure(t: Trajectory) -> tuple[str, str]:
    msgs = t.messages
    refusal_at = next(
        (
            i
            for i, m in enumerate(msgs)
            if m.get("role") == "assistant"
            and not m.get("tool_calls")
            and _REFUSAL.search(m.get("content") or "")
        ),
        None,
    )
    if refusal_at is None:
        return NA, "the agent never declined anything"
    push = next(
        (
            i
            for i, m in enumerate(msgs[refusal_at + 1 :], refusal_at + 1)
            if m.get("role") == "user" and not _GOODBYE.search(m.get("content") or "")
        ),
        None,
    )
    if push is None:
        return NA, "the user did not insist after the refusal"
    ref_names = {a["name"] for a in t.reference_writes()} if t.reference is not None else set()
    gave_in = [c.name for c in t.calls() if c.index > push and is_write(c.name) and c.name not in ref_names]
    if gave_in:
        return LACKING, f"gave in after pressure: {', '.join(gave_in)}"
    return PRESENT, "kept to the policy after the user insisted"


_COURTESY = re.compile(r"\b(please|thank|thanks|sorry|happy to|glad|apolog|of course|certainly|sure)\b", re.I)
_RUDE = re.compile(r"\b(whatever|not my problem|figure it out|stop asking|obviously)\b", re.I)
_UPSELL = re.compile(
    r"(also recommend|you might (also )?like|would you like to add|consider adding|upgrade)", re.I
)


def tone_and_empathy(t: Trajectory) -> tuple[str, str]:
    texts = t.agent_texts()
    if not texts:
        return NA, "no message to the user"
    # A plain, informative answer is not a lack of empathy (borderline leans PRESENT): LACKING needs curt or
    # dismissive messages.
    curt = [x for x in texts if len(x.split()) < 4 or _RUDE.search(x)]
    if curt and len(curt) == len(texts):
        return LACKING, f"curt or dismissive: {curt[0][:60]!r}"
    if any(_COURTESY.search(x) for x in texts):
        return PRESENT, "courteous phrasing present"
    return PRESENT, "plain, complete answers"


def language_fluency(t: Trajectory) -> tuple[str, str]:
    texts = t.agent_texts()
    if not texts:
        return NA, "no message to the user"
    for x in texts:
        words = x.split()
        alpha = sum(ch.isalpha() for ch in x) / max(1, len(x))
        if len(words) < 3 or alpha < 0.5 or re.search(r"\b(\w+)( \1\b){2,}", x):
            return LACKING, f"fragmentary or garbled message: {x[:60]!r}"
    return PRESENT, "messages are complete sentences"


def proactive_upselling(t: Trajectory) -> tuple[str, str]:
    texts = t.agent_texts()
    if not texts:
        return NA, "no message to the user"
    if any(_UPSELL.search(x) for x in texts):
        return PRESENT, "suggests something beyond the request"
    return LACKING, "never suggests anything beyond the request"


DETECTORS: dict[str, Detector] = {
    "precondition_verification": precondition_verification,
    "multi_step_completion": multi_step_completion,
    "multi_step_task_completion": multi_step_completion,
    "tool_calling_precision": tool_calling_precision,
    "structured_data_reasoning": structured_data_reasoning,
    "policy_compliance_under_pressure": policy_compliance_under_pressure,
    "adversarial_policy_compliance": policy_compliance_under_pressure,
    "tone_and_empathy": tone_and_empathy,
    "language_fluency": language_fluency,
    "proactive_upselling": proactive_upselling,
}


class RulesAnalyst:
    """Deterministic: every run gives the same labels (the stage resamples episodes per run instead)."""

    name = "rules"
    deterministic = True

    def __init__(self, config: dict[str, Any] | None = None):
        self.config = config or {}

    def discover(self, episodes, max_candidates: int, seed: int):
        from trace_cli.errors import UsageError

        raise UsageError(
            "the rules analyst cannot discover capabilities; use --candidates catalog "
            "(or --analyst openai|hf for discovery)"
        )

    def label(self, episodes: list[dict[str, Any]], candidates, run: int, seed: int) -> list[Label]:
        out = []
        for ep in episodes:
            t = Trajectory.from_episode(ep)
            for c in candidates:
                det = DETECTORS.get(c.name)
                if det is None:
                    out.append(Label(t.episode_id, c.name, run, NA, "no rule for this capability"))
                    continue
                lab, why = det(t)
                out.append(Label(t.episode_id, c.name, run, lab, why))
        return out


def needs(episode: dict[str, Any], capabilities: list[str]) -> dict[str, str]:
    """NA / PRESENT / LACKING of one episode for each named capability that has a detector (others left out):
    what a conversation needs, for labelling target transcripts by need (the MoE gates)."""
    t = Trajectory.from_episode(episode)
    return {c: DETECTORS[c](t)[0] for c in capabilities if c in DETECTORS}
