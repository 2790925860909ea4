"""Stage 4b, findings: the decisions turned into the decision object (`ddsweep.analysis.outcome.Outcome`), built
once: the first screen with its launch commands, the caveats (failures grouped by cause among them) and
reference sections, the adaptive funnel and the full coding eval; the tidy tables; the comparison of two studies;
a running study's progress.

May import: `ddsweep.analysis`, `ddsweep.storage`, `ddsweep.config`, `ddsweep.coding`, `ddsweep.figures`,
`ddsweep.formatting`. Imported by `commands` and `adaptive` (the funnel section); never by `report`, which renders
the object these modules build.
"""
