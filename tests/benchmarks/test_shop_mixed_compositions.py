"""benchmarks/shop_mixed_compositions.py: its command line (the run itself needs trained adapters: see its
docstring and the closing note of issue 30 for a measured run)."""

from __future__ import annotations


def test_it_needs_the_store_diagnosis_and_adapters(run_benchmark):
    proc = run_benchmark("shop_mixed_compositions.py", "--store", "x")
    assert proc.returncode == 2 and "--diagnosis" in proc.stderr and "--adapters" in proc.stderr
    ok = run_benchmark("shop_mixed_compositions.py", "--help")
    assert ok.returncode == 0 and "one adapter and several" in ok.stdout
