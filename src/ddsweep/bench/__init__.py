"""Stage 2, measure: the HTTP transport, the cell runner, prompts and workloads, per-request records, metrics.

May import: `ddsweep.storage`, `ddsweep.config`, `ddsweep.figures` (the figures' definitions),
`ddsweep.coding.humaneval` (the coding workload's problems and instruction). Never `point`, `analysis` or `sim`.
"""
