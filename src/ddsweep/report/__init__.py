"""Stage 5, report: the analysis written for people: the summary document and its Markdown, the first screen,
tables, plots, the adaptive funnel section, report bundles, comparison of studies, and `ddsweep status`.

May import: `ddsweep.analysis` (the decisions it writes), `ddsweep.storage`, `ddsweep.config`, `ddsweep.coding`
(the lossless assessment of the full coding eval). Imported by `adaptive` (the funnel section) and the command
line only; never by `analysis`.
"""
