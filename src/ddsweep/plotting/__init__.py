"""Stage 5, plots: the study's figures drawn from the analysed results (regime bars, Pareto fronts, acceptance,
coding) and the plot of `ddsweep compare`.

May import: `ddsweep.analysis` (the results and decisions it draws), `ddsweep.coding` (intervals of pass rates),
`ddsweep.storage`. Imported by `commands` only.
"""
