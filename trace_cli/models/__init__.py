"""Models: references (store artifacts, local dirs, hub ids), import of real checkpoints, the offline tiny-model
builder, chat templating, tool-call parsing and KV-cached generation. The policies that drive them are agents
(trace_cli.agents)."""
