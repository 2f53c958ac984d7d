"""A row's next token when it samples: temperature, top-k and nucleus (top_p) sampling with the request's own
generator (seeded: a request with a seed gets the same tokens whatever shares its batch)."""

from __future__ import annotations

from typing import Any


def pick(row, job: Any) -> int:
    import torch

    probs = (row.float() / max(job.temperature, 1e-5)).softmax(-1)
    return int(torch.multinomial(probs, 1, generator=job._gen))


def sample(row, job: Any, torch) -> int:
    """Temperature and nucleus (top_p) sampling of one row with the job's own generator."""
    probs = (row.float() / job.temperature).softmax(-1)
    if getattr(job, "top_k", 0) and job.top_k < probs.numel():
        v, idx = probs.topk(job.top_k)
        probs = torch.zeros_like(probs).scatter(0, idx, v)
        probs = probs / probs.sum()
    if job.top_p < 1.0:
        p, order = probs.sort(descending=True)
        keep = (p.cumsum(-1) - p) < job.top_p
        probs = torch.zeros_like(probs).scatter(0, order[keep], p[keep])
    return int(torch.multinomial(probs, 1, generator=job._gen))
