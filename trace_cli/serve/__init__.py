"""`trace serve`: an OpenAI-compatible server over any local model reference (FastAPI + uvicorn)."""
