"""`trace compose`: combine capability adapters into one composition (router, moe, merge)."""

from __future__ import annotations

from trace_cli.cli.common import echo_outcome, print_table
from trace_cli.cli.options import Flag, StageOptions


def _labelled(text: str) -> dict[str, str]:
    """`--data EXPERT=ROLLOUTS` -> one item of moe.data."""
    from trace_cli.errors import UsageError

    expert, sep, ref = text.partition("=")
    if not sep or not expert or not ref:
        raise UsageError(f"--data {text!r}: expected EXPERT=ROLLOUTS, e.g. base=store://rollouts/shop-eval")
    return {"expert": expert, "rollouts": ref}


COMPOSE = StageOptions(
    "compose",
    "--method",
    "--base",
    Flag("--adapter", "adapters"),
    Flag(
        "--data", "moe.data", metavar="EXPERT=ROLLOUTS", convert=_labelled, note="Given as EXPERT=ROLLOUTS."
    ),
)


@COMPOSE.command(
    epilog=(
        "Examples:\n\n  trace compose --method router --base store://model/base "
        "--adapter store://adapter/precondition --adapter store://adapter/multistep --name demo-router\n\n"
        "  trace compose --method moe --adapter store://adapter/precondition --adapter store://adapter/multistep "
        "--name demo-moe --set moe.steps=200\n\n"
        "  trace compose --method moe ... --data precondition_verification=store://rollouts/pre-eval "
        "--data base=store://rollouts/shop-eval   (label transcripts yourself)\n\n"
        "  trace compose --method merge ... --name demo-merge\n\n"
        "  trace eval --model store://composition/demo-moe --env shop --seeds 0:100\n\n"
        "Config keys are those of schemas/config/compose.v1.json; --set KEY=VALUE overrides any of them."
    ),
    outputs=("Alias for the composition artifact.", "Rebuild even if an identical artifact exists."),
)
def compose(out, as_json):
    """Combine per-capability LoRA adapters into one model: evaluate it with --model store://composition/NAME."""
    if echo_outcome(out, as_json, "use --force to rebuild"):
        return
    s = out.main.summary
    row = [out.main.uri, s.get("method"), ", ".join(s.get("experts", []))]
    cols = ["artifact", "method", "experts"]
    if s.get("method") == "moe":
        per = s.get("routing_accuracy_per_expert") or {}
        cols += ["routing accuracy", "per expert", "held-out turns"]
        row += [
            s.get("routing_accuracy"),
            ", ".join(f"{k} {v}" for k, v in per.items()),
            s.get("routing_turns"),
        ]
    elif s.get("method") == "router":
        cols += ["strategy", "reroute"]
        row += [f"{s.get('strategy')} (p {s.get('top_p')})", s.get("reroute")]
    else:
        cols += ["combination", "weights"]
        row += [s.get("combination_type"), s.get("weights")]
    print_table(cols, [row])
