"""Stage 3, run a point: the server lifecycle, knob verification, environment capture, preflight, run-point.

May import: `ddsweep.storage`, `ddsweep.config`, `ddsweep.bench`, `ddsweep.coding`. Never `analysis` or `sim`.
"""
