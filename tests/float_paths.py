"""Comparing what two computation paths compute (cached vs full prefill, merged vs unmerged, batched vs single,
chunked vs one pass, fused vs plain kernels).

Two paths that do the same arithmetic in a different order (another matmul shape, another reduction split, a
different SIMD width) round differently: on one CPU the results agree to the last bit, on the next one they
differ in the 7th digit (issue 45: 0.39622039 against 0.39622027). A test that compares such floats with `==`
tests the CPU, not the code. So:

* floats (probabilities, logits, mixing weights) from two paths are compared with a tolerance (`PROB_ATOL`,
  `LOGIT_ATOL`), far above rounding and far below any real error;
* decisions (which expert, which token) may be compared exactly only where the margin behind them is checked:
  `assert_same_greedy` accepts two greedy sequences that agree, or that part at a step whose top-2 logit
  margin is a near tie rounding can flip, and fails on any other difference.

`tests/test_float_comparisons.py` scans the tests for `==` / `torch.equal` on values from two paths; a
comparison that is exact by construction (the same tensors restored, the same kernel on the same data, integer
ids) says why on its line with `# exact: <reason>`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

PROB_ATOL = 1e-5  # probabilities from two paths: rounding moves them ~1e-7
LOGIT_ATOL = 1e-4  # logits (|x| up to ~10s) from two paths: rounding moves them ~1e-6
TIE_MARGIN = 1e-3  # a top-2 logit margin below this is a near tie that two paths may break differently


def assert_routes_close(got: Sequence[Mapping[str, float]], want: Sequence[Mapping[str, float]]) -> None:
    """Routing decisions from two paths: the same experts chosen for every prompt (exact), their mixing weights
    (probabilities renormalised over the chosen ones) within PROB_ATOL."""
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert sorted(g) == sorted(w), (i, g, w)
        for k, a in g.items():
            assert abs(a - w[k]) <= PROB_ATOL, (i, k, a, w[k])


def assert_same_greedy(
    a: Sequence[int],
    b: Sequence[int],
    next_logits: Callable[[int], Sequence[float]],
    *,
    margin: float = TIE_MARGIN,
) -> None:
    """Greedy tokens from two paths agree, or part only where the logits behind them are a near tie.

    `next_logits(i)` returns the logits of the token at position `i` (from either path: they agree to
    LOGIT_ATOL). Sequences that agree pass without a call; at the first position where they differ (or one
    stops), the two tokens must be the top two of those logits with a margin below `margin`; after that
    nothing is claimed (the paths condition on different tokens)."""
    import torch

    n = min(len(a), len(b))
    i = next((j for j in range(n) if a[j] != b[j]), n)
    if i == len(a) == len(b):
        return
    logits = torch.as_tensor(next_logits(i), dtype=torch.float64).reshape(-1)
    top = torch.topk(logits, 2)
    gap = float(top.values[0] - top.values[1])
    tokens = {int(t) for t in top.indices}
    parted = {int(x[i]) for x in (a, b) if i < len(x)}
    assert gap < margin and parted <= tokens, (
        f"greedy tokens part at position {i} ({a[i : i + 3]} vs {b[i : i + 3]}) where the top-2 margin is "
        f"{gap:.2e} (top {sorted(tokens)}): not a near tie, a real difference"
    )
