"""The contrastive selection's pure functions on hand-computed examples (TRACE §2; ARCHITECTURE.md, "The method")."""

from __future__ import annotations

import pytest

from trace_cli.analysts.aggregate import RunStats, run_stats, select

F, P = False, True  # episode failed / passed


def rows(failed: list[str], passed: list[str], w: float = 1.0):
    return [(F, lab, w) for lab in failed] + [(P, lab, w) for lab in passed]


def test_rates_delta_coverage_unweighted():
    # failed: L L P NA -> ER- = 2/3, coverage = 2/4; passed: L P P P NA -> ER+ = 1/4
    s = run_stats(
        rows(["LACKING", "LACKING", "PRESENT", "NA"], ["LACKING", "PRESENT", "PRESENT", "PRESENT", "NA"])
    )
    assert s.er_minus == pytest.approx(2 / 3)
    assert s.er_plus == pytest.approx(1 / 4)
    assert s.delta == pytest.approx(2 / 3 - 1 / 4)  # 5/12
    assert s.coverage == pytest.approx(0.5)
    assert (s.total_failed, s.total_passed, s.na_failed, s.na_passed) == (4, 5, 1, 1)


def test_rates_with_weights():
    # bootstrap multiplicities: failed L×2, L×1, P×1, NA×1 ; passed L×0 (not drawn), P×3
    r = [
        (F, "LACKING", 2.0),
        (F, "LACKING", 1.0),
        (F, "PRESENT", 1.0),
        (F, "NA", 1.0),
        (P, "LACKING", 0.0),
        (P, "PRESENT", 3.0),
    ]
    s = run_stats(r)
    assert s.er_minus == pytest.approx(3 / 4)
    assert s.coverage == pytest.approx(3 / 5)
    assert s.er_plus == 0.0  # the weight-0 LACKING success does not count
    assert s.delta == pytest.approx(0.75)
    assert s.total_passed == 3


def test_er_plus_is_zero_when_no_success_needs_the_capability():
    s = run_stats(rows(["LACKING", "PRESENT"], ["NA", "NA", "NA"]))
    assert s.er_plus == 0.0
    assert s.delta == pytest.approx(0.5)


def test_delta_undefined_when_no_failure_needs_it_never_passes():
    s = run_stats(rows(["NA", "NA"], ["LACKING", "PRESENT"]))
    assert s.er_minus is None and s.delta is None
    assert s.coverage == 0.0
    assert not s.passes(0.0, 0.0)
    assert s.to_dict()["delta"] is None


def test_error_labels_are_left_out_of_counts_and_coverage():
    s = run_stats(rows(["LACKING", "PRESENT", "ERROR", "ERROR"], ["PRESENT", "ERROR"]))
    assert s.errors == 3
    assert s.total_failed == 2 and s.total_passed == 1
    assert s.er_minus == pytest.approx(0.5)
    assert s.coverage == pytest.approx(0.5)  # 1 LACKING of the 2 labelled failures, not of 4


def test_thresholds_at_the_boundary_pass():
    # coverage exactly 1/10 and delta exactly 0.2
    s = run_stats(rows(["LACKING"] + ["PRESENT"] * 4 + ["NA"] * 5, ["PRESENT"] * 3))
    assert s.coverage == pytest.approx(0.1) and s.delta == pytest.approx(0.2)
    assert s.passes(0.10, 0.20)
    assert not s.passes(0.11, 0.20)
    assert not s.passes(0.10, 0.21)


def test_boundary_tolerates_float_rounding():
    # delta = 3/10 - 1/10 = 0.19999999999999998 in floating point: still counts as reaching 0.2
    s = run_stats(rows(["LACKING"] * 3 + ["PRESENT"] * 7, ["LACKING"] + ["PRESENT"] * 9))
    assert s.delta < 0.2
    assert s.passes(0.10, 0.20)


def _stats(delta_pass: bool, er_minus_l: int = 3) -> RunStats:
    """A run where the capability passes (Δ = 0.6, coverage 0.6) or fails (no LACKING failures)."""
    if delta_pass:
        return run_stats(rows(["LACKING"] * er_minus_l + ["PRESENT"] * (5 - er_minus_l), ["PRESENT"] * 5))
    return run_stats(rows(["PRESENT"] * 5, ["PRESENT"] * 5))


def test_k_of_n_selection():
    per_run = {"a": [_stats(True), _stats(True), _stats(False)]}
    (sel,) = select(per_run, rho=0.1, delta=0.2, k=2)
    assert sel.passed == [True, True, False] and sel.runs_passed == 2 and sel.selected
    (sel,) = select(per_run, rho=0.1, delta=0.2, k=3)
    assert not sel.selected
    # mean/std over runs (population std), Δ per run: 0.6, 0.6, 0.0
    assert sel.mean_delta == pytest.approx(0.4)
    assert sel.std_delta == pytest.approx((((0.2**2) * 2 + 0.4**2) / 3) ** 0.5)
    assert sel.mean_coverage == pytest.approx(0.4)


def test_sorted_by_mean_delta_selected_first():
    per_run = {
        "low": [_stats(True, 2)] * 2,  # Δ 0.4, passes
        "high": [_stats(True, 4)] * 2,  # Δ 0.8, passes
        "mid_rejected": [_stats(True, 3), _stats(False)],  # Δ 0.6, 0.0 -> passes 1 of 2
        "never": [_stats(False)] * 2,
    }
    out = select(per_run, rho=0.1, delta=0.2, k=2, examples={"high": [str(i) for i in range(12)]})
    assert [s.capability for s in out] == ["high", "low", "mid_rejected", "never"]
    assert [s.selected for s in out] == [True, True, False, False]
    assert out[0].example_failed == [str(i) for i in range(8)]  # at most 8 examples


def test_undefined_delta_counts_as_zero_in_the_mean():
    per_run = {"c": [run_stats(rows(["NA"], ["PRESENT"])), _stats(True)]}
    (sel,) = select(per_run, rho=0.1, delta=0.2, k=1)
    assert sel.passed == [False, True]
    assert sel.mean_delta == pytest.approx(0.3)
