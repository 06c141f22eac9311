"""The windows the critical path is found in, one path per window: the profiler's steps
(``ProfilerStep#N``) by default; the instances of an annotation (an iteration marked with
``record_function``, as some jobs and HolisticTraceAnalysis's own traces do), numbered from 0
in each rank's order; or the whole trace (:data:`WHOLE_TRACE`).

:func:`window_steps` gives the windows as the path's steps: one row per rank and window,
``rank, step, start_us, end_us, lane`` (the lane that marks them, the rank's *main* lane).
"""

from __future__ import annotations

import pandas as pd

from ..traces.kinds import GPU_CATEGORIES

__all__ = ["WHOLE_TRACE", "window_steps"]

#: The window of the whole trace: one per rank, from its first event to its last.
WHOLE_TRACE = "trace"
_STEP_COLUMNS = ["rank", "step", "start_us", "end_us", "lane"]


def window_steps(events: pd.DataFrame, window: str | None = None) -> pd.DataFrame:
    """The windows of ``events`` (``load_run(...).events``) as steps: ``rank, step, start_us,
    end_us, lane``.

    Args:
        events: a run's events.
        window: None for the profiler's steps; :data:`WHOLE_TRACE` (``"trace"``) for one
            window per rank from its first event to its last, on the CPU thread with the most
            events; else the exact name of an annotation on a CPU thread, whose instances are
            the windows (step 0, 1, ... in each rank's order).

    Raises:
        ValueError: no window of that kind in ``events``, with what to do.
    """
    on_cpu = ~events["cat"].isin(GPU_CATEGORIES).to_numpy()
    if window is None:
        steps = events[(events["kind"] == "step").to_numpy() & on_cpu].dropna(subset=["step"])
        if steps.empty:
            raise ValueError(
                "no ProfilerStep#N events: the critical path is found step by step; profile "
                "with a schedule (torch.profiler.schedule) and call prof.step() after each "
                "step, or name another window (window='trace' for the whole trace, or the name "
                "of an annotation that marks each iteration)"
            )
        return steps[_STEP_COLUMNS]
    if window == WHOLE_TRACE:
        cpu = events[on_cpu]
        if cpu.empty:
            raise ValueError("window='trace': the trace has no event on a CPU thread")
        lane = cpu.groupby(["rank", "lane"], observed=True).size().groupby(level="rank").idxmax()
        spans = events.groupby("rank").agg(start_us=("start_us", "min"), end_us=("end_us", "max"))
        return pd.DataFrame(
            {
                "rank": spans.index.to_numpy(),
                "step": 0,
                "start_us": spans["start_us"].to_numpy(),
                "end_us": spans["end_us"].to_numpy(),
                "lane": [lane[r][1] for r in spans.index],
            }
        )
    marked = events[on_cpu & (events["name"].astype(str) == window).to_numpy()]
    if marked.empty:
        raise ValueError(
            f"window={window!r}: no event of that name on a CPU thread; name an annotation "
            "that marks each iteration (its exact name), or window='trace' for the whole trace"
        )
    marked = marked.sort_values("start_us", kind="stable")
    steps = marked.assign(step=marked.groupby("rank").cumcount())
    return steps[_STEP_COLUMNS].reset_index(drop=True)
