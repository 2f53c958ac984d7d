"""Agents: policies the rollout loop drives. `openai_policy` is any OpenAI-compatible endpoint."""
