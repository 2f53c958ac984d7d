"""Agents: every policy the rollout loop drives, behind one protocol (agents.base.Policy): the scripted
built-ins (agents.scripted), a transformers model (agents.hf), an OpenAI-compatible endpoint
(agents.openai_policy) and GRPO's token-history policy (agents.token_history)."""
