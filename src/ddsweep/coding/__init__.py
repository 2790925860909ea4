"""Stage 2, evaluate code: HumanEval data, code extraction, sandboxed execution, the runner, output comparison.

May import: `ddsweep.storage`, `ddsweep.config`. Never `point`, `analysis`, `bench` or `sim`.
"""
