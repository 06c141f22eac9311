"""Root pytest set-up for the notebooks: their stderr is never compared with nbval.

Kineto (the profiler's C++ side) and torchrun write harmless lines to stderr that
differ between machines (a CUDA build on a CPU-only machine, thread ids, times).
What a lesson claims is asserted in the notebook's own code instead.
"""


def pytest_collectstart(collector):
    if collector.fspath and str(collector.fspath).endswith(".ipynb"):
        collector.skip_compare += ("stderr",)
