"""Stage 2, measure: the HTTP transport, the cell runner, prompts and workloads, per-request records, metrics.

May import: `ddsweep.storage`, `ddsweep.config`, `ddsweep.figures` (the figures' definitions).
Never `point`, `analysis` or `sim`.
"""
