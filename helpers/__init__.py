"""Helpers for the Profiling Distributed PyTorch notebooks, one module per job:

- ``launch``: start a script under torchrun and keep a record of the run (``launch``, ``RunRecord``)
- ``traces``: load, check, gather and merge per-rank profiler traces (``load_run``, ``TraceError``)
- ``analysis``: step times, time per kind, waiting in collectives, stragglers, clock offsets
- ``plotting``: per-rank timelines (``plot_rank_timeline``)
- ``kineto_noise``: keep the profiler's harmless C++ log lines out of a notebook
"""
