"""``accelbench plan``: choose a training configuration for a model on a device count, by prediction, and optionally
check the choice by measuring the best few.

One module per job:

- :mod:`~accelbench.plan.arguments`: the command line's flags (cheap to import: no torch).
- :mod:`~accelbench.plan.candidates`: the configurations worth considering (strategies, mesh layouts, batch and
  accumulation, precisions), each a :class:`~accelbench.config.RunConfig`, and why others are not offered.
- :mod:`~accelbench.plan.ranking`: each candidate priced by ``estimate``'s :func:`~accelbench.estimate.predict`,
  split into ranked, dropped (predicted not to fit) and unpriced, and Spearman's rank correlation.
- :mod:`~accelbench.plan.measure`: the top K run for real through ``accelbench sweep``, compared with the ranking.
- :mod:`~accelbench.plan.schema`: the plan as data (``Plan``, schema ``accelbench.plan``).
- :mod:`~accelbench.plan.command`: ``accelbench plan`` itself: checks, tables, the sweep file, ``--json``.
"""
