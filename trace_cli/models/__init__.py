"""Models: references (store artifacts, local dirs, hub ids), the offline tiny-model builder, chat
templating and tool-call parsing, and policies (HF models, reference solver, random) for the rollout loop."""
