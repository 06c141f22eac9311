"""Hangs: the Flight Recorder's per-rank dumps of a hung job in pandas, where the ranks'
sequences of collectives part, and PyTorch's own analyser run on them (lesson 8).

- ``flight_recorder``: :func:`load_flight_records`, :func:`first_mismatch` (a
  :class:`Mismatch`), :func:`analyse_with_pytorch`; a bad dump raises
  :class:`FlightRecorderError`, naming it.
- ``stacks``: Python stacks as a table (:func:`load_stack_dumps` reads what a rank's
  ``faulthandler`` left in a file; :func:`lines_in_script`, where each rank is in a script).
- private: ``_dumpreader``, the checked reader of a dump (a pickle): it refuses anything but
  plain data, bounded in size, nesting and count, so a dump never runs code.
"""

from .flight_recorder import (
    FlightRecorderError,
    Mismatch,
    analyse_with_pytorch,
    first_mismatch,
    load_flight_records,
)
from .stacks import lines_in_script, load_stack_dumps

__all__ = [
    "load_flight_records",
    "first_mismatch",
    "Mismatch",
    "analyse_with_pytorch",
    "FlightRecorderError",
    "load_stack_dumps",
    "lines_in_script",
]
