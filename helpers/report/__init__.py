"""A report for any folder of per-rank traces: this series' runs, or your own job's.

``python -m helpers.report TRACES... [--out report.html] [--skip-bad] [--merged FILE]`` (or the
``pdp-report`` command) reads a run's traces and writes one self-contained HTML file, figures
embedded, that opens offline; given two folders that each hold a run, it compares them. In
Python:

- :func:`build_report` reads the traces (whole, or one rank at a time when they are too large to
  load whole) and returns a :class:`Report`: the job at a glance, then sections in the order to
  read them (the hang, when Flight Recorder dumps beside the traces show one; what held the
  steps and what to fix first; what the traces cannot tell; step time; waiting and the
  straggler; time per kind; the GPU; a sharded job's phases; where the memory went). A
  section shows itself in a notebook.
- :func:`build_comparison`: two runs compared (did the change work, by how much beyond the
  steps' noise, where on the critical path, did a rank's memory peak fall or its growth stop;
  :func:`helpers.compare_runs`).
- :func:`write_report` writes it as HTML; :func:`report_html` gives the HTML.
- :class:`ReportError`: bad input, said with the file and what to do.

Modules: ``build`` (reading the traces), ``held`` (the first section: the critical path, what
to fix first and a what-if, stalls and unmatched collectives), ``sections`` (the other parts),
``memory`` (each rank's peak, what was alive at it, memory that grows step after step),
``cautions`` (what the traces cannot tell), ``flight`` (what Flight Recorder dumps beside the
traces add: gloo's process groups, and the hang), ``compare`` (two runs), ``html`` (the page), ``__main__`` (the command).
"""

from __future__ import annotations

from .build import WHOLE_LIMIT_MB, Report, ReportError, build_report
from .compare import build_comparison
from .html import report_html, write_report
from .sections import Section

__all__ = [
    "Report",
    "Section",
    "ReportError",
    "WHOLE_LIMIT_MB",
    "build_report",
    "build_comparison",
    "report_html",
    "write_report",
]
