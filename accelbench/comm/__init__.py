"""`accelbench comm`: the bandwidth of the collectives training strategies use, measured over a backend's own
collective backend (gloo, nccl, rccl, xccl, ccl) on its devices, in nccl-tests' terms (algbw, busbw, #wrong).

A job is launched as `accelbench run` is (``--devices N``, or torchrun, srun, mpirun); each rank fills its buffers
with known values, times every collective at every message size with the device synchronised, and checks the
result; rank 0 prints the table and writes one record. ``compare`` and ``report`` put the records of many systems
side by side as bandwidth curves.

Where things are:

- :mod:`.collectives`: the collectives, their variants and bus-bandwidth factors (no torch).
- :mod:`.records`: the record's schema (``accelbench.comm``), writing it and reading it back, validated.
- :mod:`.options`: the command line's options and message sizes (no torch: ``accelbench comm --help`` is fast).
- :mod:`.run`: measuring on one rank: buffers, fills, timing, checking, what the ranks agree on.
- :mod:`.render`: the table, in nccl-tests' layout.
- :mod:`.command`: the command: preflight, launching the workers, the record.

This package imports nothing at import time: ``compare`` reads records through :mod:`.records` without torch.
"""
