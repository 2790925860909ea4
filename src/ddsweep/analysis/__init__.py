"""Stage 4, analyse and report: loading results, statistics, decisions, Markdown, tables, plots, bundles.

May import: `ddsweep.storage`, `ddsweep.config`, `ddsweep.coding` (output comparison), `ddsweep.figures`
(the figures' definitions). Never `point`, `bench`
or `sim`: it reads what point jobs wrote, not how they ran.
"""
