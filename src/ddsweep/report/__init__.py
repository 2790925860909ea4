"""Stage 5, report: the decision object written for people: the Markdown summary and its first screen, report
bundles, the comparison of studies and `ddsweep status`. Every report renders what the analysis computed and
computes nothing of its own.

May import: from `ddsweep.analysis` only the decision object's types (`ddsweep.analysis.outcome`), never its
functions; `ddsweep.formatting` (how figures are written), `ddsweep.storage`, `ddsweep.config`. Imported by
`commands`, `adaptive` and the command line only; never by `analysis`.
"""
