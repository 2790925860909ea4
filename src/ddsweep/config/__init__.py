"""Stage 1, configure: the schema, validation, the knob registry, sweep expansion and `ddsweep plan`.

May import: `ddsweep.storage`, `ddsweep.figures` (which metrics a study may rank on).
Imported by every later stage; imports none of them.
"""
