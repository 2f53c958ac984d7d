"""LLM clients shared by the analysts, the environment author and API-model policies (one OpenAI SDK client)."""
