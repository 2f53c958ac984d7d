"""The sample-efficiency benchmark as a small library (`benchmarks/sample_efficiency.py` is its command line).

- `settings`: the typed, frozen `Settings` built once from the command line;
- `measure`: stages in one store and what an evaluation measured, read through the store's index views;
- `methods`: GRPO on the target and TRACE (diagnose, synthesize, train, compose) at every budget;
- `plan`: how TRACE splits a budget between its environments, and what a configuration spent;
- `stats`: the table's arithmetic and the paired bootstrap of TRACE's gain against GRPO's;
- `results`: the results files (JSON schemas in `benchmarks/schemas/`, checked on write and on read),
  `--combine`, and resuming a stopped run;
- `output`: the printed tables and the plot;
- `sweep`: the learning-rate sweep on validation seeds and each method's rate chosen from it;
- `freeze`: the digests of the target and the base agent, and the pre-registration a run must match.
"""
