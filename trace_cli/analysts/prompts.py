"""Prompts, response schemas and the tolerant JSON parser shared by the LLM analysts (`openai`, `hf`).

Two tasks, as in TRACE's capability selection (our own wording):
- discovery: read failed and passed trajectories, propose up to N general candidate capabilities;
- labelling: judge ONE trajectory against a fixed list of capabilities, NA / PRESENT / LACKING each,
  borderline cases leaning PRESENT (a false LACKING inflates coverage and Δ).
Both answers are strict JSON objects validated by a JSON Schema; anything else raises
`AnalystResponseError`, which the analysts treat as a reason to ask again.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator

from trace_cli.analysts.base import ERROR, LACKING, NA, PRESENT, Candidate, Label, Trajectory

NAME_PATTERN = r"^[a-z][a-z0-9]*(_[a-z0-9]+){1,4}$"  # snake_case, 2 to 5 words
MAX_RATIONALE_CHARS = 400


class AnalystResponseError(ValueError):
    """The model's answer is not the JSON object asked for (no JSON, bad shape, nothing usable)."""


# ---------------------------------------------------------------------------------------------- schemas

DISCOVERY_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "discovery answer",
    "type": "object",
    "required": ["candidates"],
    "properties": {
        "candidates": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "description"],
                "properties": {
                    "name": {"type": "string", "pattern": NAME_PATTERN},
                    "description": {"type": "string", "minLength": 20},
                    "example_task_ids": {"type": "array", "items": {"type": ["string", "integer"]}},
                },
            },
        }
    },
}

LABELS_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "labelling answer",
    "type": "object",
    "required": ["labels"],
    "properties": {
        "labels": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["capability", "label"],
                "properties": {
                    "capability": {"type": "string", "minLength": 1},
                    "label": {"enum": [NA, PRESENT, LACKING]},
                    "rationale": {"type": "string"},
                },
            },
        }
    },
}

_DISCOVERY_VALIDATOR = Draft202012Validator(DISCOVERY_SCHEMA)
_LABELS_VALIDATOR = Draft202012Validator(LABELS_SCHEMA)


# ---------------------------------------------------------------------------------------------- limits


@dataclass(frozen=True)
class PromptLimits:
    """Bounds on prompt size, in characters (the hf analyst also cuts tokens to the model's context)."""

    max_result_chars: int = 300  # per tool result
    max_trajectory_chars: int = 8000  # per rendered trajectory
    max_discovery_chars: int = 60000  # all trajectories of the discovery prompt together

    @classmethod
    def from_config(cls, llm: dict[str, Any] | None) -> PromptLimits:
        """Reads optional llm keys of the same names; absent keys keep the defaults."""
        llm = llm or {}
        kw = {
            k: int(llm[k])
            for k in ("max_result_chars", "max_trajectory_chars", "max_discovery_chars")
            if llm.get(k)
        }
        return cls(**kw)


def _cut_middle(text: str, limit: int) -> str:
    """Keep the head and the tail (the outcome line and the reference actions), cut at line breaks."""
    if len(text) <= limit:
        return text
    marker = "\n  … [{n} characters omitted] …\n"
    room = max(0, limit - len(marker) - 8)
    head, tail = text[: room * 2 // 3], text[len(text) - room // 3 :]
    if "\n" in head[len(head) // 2 :]:
        head = head[: head.rindex("\n")]
    if "\n" in tail[: len(tail) // 2]:
        tail = tail[tail.index("\n") + 1 :]
    return head + marker.format(n=len(text) - len(head) - len(tail)) + tail


def render_trajectory(
    t: Trajectory, limits: PromptLimits = PromptLimits(), max_chars: int | None = None
) -> str:
    return _cut_middle(
        t.render(max_result_chars=limits.max_result_chars), max_chars or limits.max_trajectory_chars
    )


# ---------------------------------------------------------------------------------------------- discovery

DISCOVERY_SYSTEM = (
    "You study transcripts of a tool-using conversational agent. By contrasting the episodes it failed with "
    "the episodes it passed, you name the general abilities whose absence explains the failures. You answer "
    "with a single JSON object and no other text."
)

DISCOVERY_TASK = """\
Below are {n_fail} FAILED and {n_pass} PASSED episodes of the same agent{omitted}. Each begins with a line \
giving the task id and the outcome. The other lines show what the user said, what the agent said, the tools \
it called with their arguments, and the tool results (long results are shortened; "…" marks a cut). \
"reference actions", when shown, are the actions a correct solution performs.

Propose at most {max_candidates} candidate capabilities (four or more if the evidence supports them). Each one must be:
- a general ability of an agent that works through tools (for example: verifying the state of an object before \
changing it, or carrying every required operation of a request to the end), never a rule that only makes sense \
in this domain or for one task;
- missing in some FAILED episodes and, preferably, shown in PASSED ones, so that it separates the two groups;
- distinct from the others: one cause of failure belongs to one capability.

For each candidate give:
- "name": 2 to 5 lowercase English words in snake_case, e.g. "multi_step_completion";
- "description": 2 or 3 sentences that let a different annotator label any single episode on their own: say when \
the capability is needed (if it is not needed the label is NA), what the agent does when it is PRESENT, and what \
in a transcript shows that it is LACKING;
- "example_task_ids": 2 to 4 task ids taken from the episodes below that illustrate it, mixing failed and passed ones.

Answer with exactly this JSON shape and nothing else:
{{"candidates": [{{"name": "...", "description": "...", "example_task_ids": ["..."]}}]}}

=== FAILED EPISODES ===
{failed}

=== PASSED EPISODES ===
{passed}
"""


def discovery_messages(
    trajectories: list[Trajectory], max_candidates: int, limits: PromptLimits = PromptLimits()
) -> list[dict[str, str]]:
    """Failures and successes interleaved into one prompt of at most `max_discovery_chars` of transcripts."""
    fail = [t for t in trajectories if not t.success]
    ok = [t for t in trajectories if t.success]
    n = max(1, len(trajectories))
    per = max(1500, min(limits.max_trajectory_chars, limits.max_discovery_chars // n))
    order: list[Trajectory] = []
    for i in range(max(len(fail), len(ok))):
        order += [x[i] for x in (fail, ok) if i < len(x)]
    chosen: dict[str, list[str]] = {"fail": [], "ok": []}
    used = 0
    skipped = 0
    for t in order:
        text = render_trajectory(t, limits, per)
        if used + len(text) > limits.max_discovery_chars and (chosen["fail"] or chosen["ok"]):
            skipped += 1
            continue
        chosen["ok" if t.success else "fail"].append(text)
        used += len(text)
    omitted = f" ({skipped} more episodes omitted for length)" if skipped else ""
    user = DISCOVERY_TASK.format(
        n_fail=len(chosen["fail"]),
        n_pass=len(chosen["ok"]),
        omitted=omitted,
        max_candidates=max_candidates,
        failed="\n\n".join(chosen["fail"]) or "(none)",
        passed="\n\n".join(chosen["ok"]) or "(none)",
    )
    return [{"role": "system", "content": DISCOVERY_SYSTEM}, {"role": "user", "content": user}]


# ---------------------------------------------------------------------------------------------- labelling

LABELLING_SYSTEM = (
    "You annotate transcripts of a tool-using conversational agent. You judge one episode against a fixed list "
    "of capabilities, strictly from what the transcript shows, and answer with a single JSON object and no "
    "other text."
)

LABELLING_TASK = """\
Judge the episode at the end against each of the {n} capabilities listed. Give every capability exactly one label:
- "NA": the episode never required this capability (nothing in the task or the conversation called for it);
- "PRESENT": it was required and the agent showed it, or the evidence is mixed or unclear;
- "LACKING": it was required and the transcript clearly shows the agent falling short of it.
If you hesitate between PRESENT and LACKING, choose PRESENT: use LACKING only when you can point to the turn \
that shows it. Judge each capability on its own evidence; the episode's outcome alone says nothing about any \
one capability.

Capabilities:
{capabilities}

Answer with exactly this JSON shape, one entry per capability in the order listed, and nothing else:
{{"labels": [{{"capability": "<name>", "label": "NA" | "PRESENT" | "LACKING", "rationale": "<one short sentence \
naming the evidence>"}}]}}

=== EPISODE ===
{episode}
"""


def labelling_messages(
    t: Trajectory, candidates: list[Candidate], limits: PromptLimits = PromptLimits()
) -> list[dict[str, str]]:
    caps = "\n".join(f"- {c.name}: {' '.join(c.description.split())}" for c in candidates)
    user = LABELLING_TASK.format(n=len(candidates), capabilities=caps, episode=render_trajectory(t, limits))
    return [{"role": "system", "content": LABELLING_SYSTEM}, {"role": "user", "content": user}]


# ---------------------------------------------------------------------------------------------- parsing

_FENCE = re.compile(r"```[a-zA-Z]*\s*(.*?)```", re.S)
_THINK = re.compile(r"<think>.*?</think>", re.S)
_MAX_STARTS = 64


def extract_json(text: Any) -> dict[str, Any]:
    """The first JSON object in a model's answer: inside ```json fences if any, else anywhere in the text
    (leading and trailing prose and <think> blocks are ignored)."""
    if not isinstance(text, str) or not text.strip():
        raise AnalystResponseError("empty answer")
    body = _THINK.sub("", text)
    chunks = [m.group(1) for m in _FENCE.finditer(body)] + [body]
    dec = json.JSONDecoder()
    for chunk in chunks:
        starts = [i for i, ch in enumerate(chunk) if ch == "{"][:_MAX_STARTS]
        for i in starts:
            try:
                obj, _ = dec.raw_decode(chunk, i)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                return obj
    raise AnalystResponseError(f"no JSON object in the answer: {_preview(text)}")


def _preview(text: str, n: int = 80) -> str:
    s = " ".join(str(text).split())
    return repr(s[:n] + ("…" if len(s) > n else ""))


def _check(validator: Draft202012Validator, obj: Any, what: str) -> None:
    errs = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
    if errs:
        e = errs[0]
        where = "/".join(str(p) for p in e.absolute_path) or "(top)"
        more = f" (+{len(errs) - 1} more)" if len(errs) > 1 else ""
        raise AnalystResponseError(f"{what} does not match the schema at {where}: {e.message[:160]}{more}")


def norm_name(s: Any) -> str:
    return re.sub(r"[\s\-]+", "_", str(s).strip().lower())


def _norm_label(v: Any) -> Any:
    if not isinstance(v, str):
        return v
    s = v.strip().upper().replace("/", "").replace(" ", "_")
    return {"NOT_APPLICABLE": NA, "NOT_NEEDED": NA}.get(s, s)


def parse_discovery(text: str, max_candidates: int, task_ids: set[str] | None = None) -> list[Candidate]:
    """Candidates from a discovery answer; names normalised to snake_case, duplicates dropped, at most
    `max_candidates`, example ids restricted to `task_ids` when given."""
    obj = extract_json(text)
    if isinstance(obj.get("candidates"), list):
        for c in obj["candidates"]:
            if isinstance(c, dict) and isinstance(c.get("name"), str):
                c["name"] = norm_name(c["name"])
    _check(_DISCOVERY_VALIDATOR, obj, "discovery answer")
    out: list[Candidate] = []
    seen: set[str] = set()
    for c in obj["candidates"]:
        if c["name"] in seen:
            continue
        seen.add(c["name"])
        ids = [str(x) for x in c.get("example_task_ids") or []]
        if task_ids is not None:
            ids = [x for x in ids if x in task_ids]
        out.append(
            Candidate(
                c["name"],
                " ".join(c["description"].split()),
                examples=[{"task_id": x} for x in dict.fromkeys(ids)][:4],
            )
        )
        if len(out) >= max_candidates:
            break
    return out


def parse_labels(text: str, capabilities: list[str]) -> dict[str, tuple[str, str]]:
    """capability -> (label, rationale) from a labelling answer. Entries naming capabilities not asked
    about are ignored, repeated ones keep the first; an answer covering none of them is an error."""
    obj = extract_json(text)
    if isinstance(obj.get("labels"), list):
        for item in obj["labels"]:
            if isinstance(item, dict):
                item["label"] = _norm_label(item.get("label"))
    _check(_LABELS_VALIDATOR, obj, "labelling answer")
    wanted = {norm_name(c): c for c in capabilities}
    out: dict[str, tuple[str, str]] = {}
    for item in obj["labels"]:
        cap = wanted.get(norm_name(item["capability"]))
        if cap is None or cap in out:
            continue
        why = " ".join(str(item.get("rationale") or "").split())
        out[cap] = (item["label"], why[:MAX_RATIONALE_CHARS])
    if not out:
        raise AnalystResponseError("the answer labels none of the capabilities asked about")
    return out


def to_labels(
    episode_id: str,
    capabilities: list[str],
    run: int,
    parsed: dict[str, tuple[str, str]] | None,
    error: str | None,
) -> list[Label]:
    """One Label per capability: the parsed ones, ERROR (with the reason) for the rest."""
    out = []
    for c in capabilities:
        if parsed is not None and c in parsed:
            lab, why = parsed[c]
            out.append(Label(episode_id, c, run, lab, why))
        else:
            reason = error or "the analyst's answer did not label this capability"
            out.append(Label(episode_id, c, run, ERROR, reason[:MAX_RATIONALE_CHARS]))
    return out
