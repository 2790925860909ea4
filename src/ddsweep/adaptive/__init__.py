"""The adaptive study (`sweep.strategy: adaptive`): the stage plan, screening statistics, selection, refinement,
the race and the funnel, and their subcommands (with `ddsweep plan`, which shows the stage plan).

May import: `ddsweep.storage`, `ddsweep.config`, `ddsweep.bench`, `ddsweep.figures` (metric definitions),
`ddsweep.analysis` (statistics, failure text), `ddsweep.report` (the summary's funnel section). Imported by no
other stage; only the command line (by module name) and the workflow's rules use it.
"""
