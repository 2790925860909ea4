"""Stage 4, analyse: from the records point jobs wrote to figures and decisions (result loading, per-repeat cell
figures, launch models, statistics, regimes, ties, drift, diagnosis, decisions, load levels, the chain
comparison, launch spread, coding outcomes), and the decision object that carries the study's whole outcome
(outcome.py: its types only; `ddsweep.findings` builds it, reports/summary.json is its JSON form).

May import: `ddsweep.storage`, `ddsweep.config`, `ddsweep.coding` (output comparison), `ddsweep.figures`
(the figures' definitions), `ddsweep.formatting` (how figures are written). Never `report` (which writes
these decisions for people), nor `point`, `bench` or `sim`: it reads what point jobs wrote, not how they ran.
"""
