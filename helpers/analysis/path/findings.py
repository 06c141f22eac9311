"""What the graph of a run holds that no run can give (:func:`.graph.validate`), said in a
sentence: the warning :func:`.lanes.lane_intervals` gives of cycles, and the report's cautions.
"""

from __future__ import annotations

import pandas as pd

from .dependencies import DEPENDENCIES
from .graph import validate

__all__ = ["findings_said"]


def findings_said(lanes, ev: pd.DataFrame, problem: str) -> str | None:
    """A sentence on what the graph of ``lanes`` (a :class:`.lanes.Lanes`, whose module imports
    this one) holds that no run can give (:func:`.graph.validate`), of one ``problem``:
    ``"negative lag"`` (edges whose target came before its source: two lanes' clocks that
    disagree, a kernel that began before its launch call by the trace's clocks) or ``"cycle"``
    (moments that wait, through their edges, for themselves); None where there is none.
    :func:`.lanes.lane_intervals` warns of cycles; the report says both among its cautions."""
    graph = lanes.graph
    found = validate(graph).query("problem == @problem")
    if found.empty:
        return None
    if problem == "negative lag":
        codes = {d.name: d.code for d in DEPENDENCIES}
        said = []
        for dependency, rows in found.groupby("dependency", sort=True):
            most = -graph.lag[(graph.lag < 0) & (graph.dependency == codes[dependency])].min()
            said.append(f"{len(rows)} {dependency} edge(s) by up to {most:.0f} µs")
        return (
            f"In the graph of what each moment waited for, {'; '.join(said)} have their target "
            "before their source: the two lanes' clocks disagree by that much (a GPU's and its "
            "CPU's may, in a trace, so that a kernel seems to begin before its launch call). "
            "The critical path follows them as measured." + _meanings(found["dependency"])
        )
    kinds = sorted({k for d in found["dependency"] for k in d.split(", ")})
    named = validate(graph, _interval_names(lanes, ev)).query("problem == 'cycle'")
    events = list(dict.fromkeys(named["events"].iat[0]))[:4]
    return (
        f"The graph of what each moment waited for holds {len(found)} cycle(s) of moments that "
        f"wait, through their edges, for themselves ({', '.join(kinds)}; the first among "
        f"{', '.join(events)}), which no run can give: those moments and the ones after them "
        "keep their measured times in the critical path and the what-if."
        + _meanings(kinds)
        + " Please report it with the traces' first lines."
    )


def _meanings(names) -> str:
    """What each kind of edge of ``names`` is, in words (:attr:`.dependencies.Dependency.means`),
    a sentence each, in the order of their names, as the cautions list them."""
    means = {d.name: d.means for d in DEPENDENCIES}
    return "".join(f" {'An' if name[0] in 'aeiou' else 'A'} {name} edge is {means[name]}." for name in sorted(set(names)))  # fmt: skip


def _interval_names(lanes, ev: pd.DataFrame) -> list[str]:
    """Each interval's event name, ``(a gap)`` for a gap."""
    labels = lanes.intervals["event"].to_numpy()
    return ev["name"].astype(str).reindex(labels).fillna("(a gap)").tolist()
