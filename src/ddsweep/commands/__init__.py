"""Stage 6, commands: the subcommands that join the stages: `summarize` and `picks` (analyse, build the decision
object, write tables, plots and the summary rendered from it), `compare` and `status`.

May import: `ddsweep.analysis`, `ddsweep.report`, `ddsweep.plotting`, `ddsweep.storage`, `ddsweep.config`,
`ddsweep.slurm`. Imported by the command line only (by name).
"""
