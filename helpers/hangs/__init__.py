"""Hangs: the Flight Recorder's per-rank dumps of a hung job in pandas, where the ranks'
sequences of collectives part, group by group, and PyTorch's own analyser run on them (lesson 8).

- ``flight_recorder``: :func:`load_flight_records`; a bad dump raises
  :class:`FlightRecorderError`, naming it.
- ``groups``: each process group's members compared with each other (:func:`group_members`,
  :func:`group_states`), and :func:`first_mismatch` (a :class:`Mismatch`): the disagreement that
  started a hang, in a job of one group or of many.
- ``chains``: :func:`wait_chains`, the hang followed from group to group: who waits where, for
  whom, to the ranks where each chain ends; ``positions``: where each rank is, how far it got
  in each group (a dump is a ring buffer: a missing entry with later ones was evicted), and the
  ranks stopped inside a failure (read by both).
- ``analyser``: :func:`analyse_with_pytorch`, PyTorch's analyser run on checked copies of the
  dumps, its findings read back (an :class:`AnalyserVerdict`); :func:`verdicts_compared`, its
  verdict beside :func:`first_mismatch`'s, and why they differ.
- ``trace_groups``: :func:`with_groups_from_flight_records`, each gloo collective of a trace
  given its process group and sequence number from the Flight Recorder (gloo's trace does not
  name them), so that the trace's collectives are matched within their own group.
- ``stacks``: Python stacks as a table (:func:`load_stack_dumps` reads what a rank's
  ``faulthandler`` left in a file; :func:`lines_in_script`, where each rank is in a script).
A dump is read by the series' checked reader of plain data (``helpers._plaindata``): it
refuses anything but plain data, bounded in size, nesting and count, so a dump never runs code.
"""

from .analyser import AnalyserVerdict, analyse_with_pytorch, verdicts_compared
from .chains import wait_chains
from .flight_recorder import FlightRecorderError, load_flight_records
from .groups import Mismatch, first_mismatch, group_descriptions, group_members, group_states
from .stacks import lines_in_script, load_stack_dumps
from .trace_groups import with_groups_from_flight_records

__all__ = [
    "load_flight_records",
    "first_mismatch",
    "Mismatch",
    "group_members",
    "group_descriptions",
    "group_states",
    "wait_chains",
    "with_groups_from_flight_records",
    "analyse_with_pytorch",
    "AnalyserVerdict",
    "verdicts_compared",
    "FlightRecorderError",
    "load_stack_dumps",
    "lines_in_script",
]
