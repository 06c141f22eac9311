"""The phases of a sharded (FSDP2) training step, per unit and rank, read from the annotations
that ``torch.distributed.fsdp.fully_shard`` records with ``record_function``.

Each module given to ``fully_shard`` is a *unit*: its parameters are kept sharded, one piece per
rank, and gathered whole just before the unit computes. FSDP marks each step of that cycle with
an annotation named after the unit (its name in the model, ``layer1``; the root has none):

- ``FSDP::all_gather (u)``: the all-gather of the unit's parameters (inside ``pre_forward`` in
  forward, ``pre_backward`` in backward, or a prefetch);
- ``FSDP::all_gather_copy_out (u)``: the gathered parameters copied into place;
- ``FSDP::post_forward (u)``, ``FSDP::post_backward_reshard (u)``: the gathered parameters let
  go again (resharded);
- ``FSDP::post_backward_reduce (u)``: the gradients reduce-scattered, each rank keeping its piece.

Between its ``pre_forward`` and ``post_forward`` a unit computes its forward; between its
``pre_backward`` and ``post_backward_accumulate``, its backward (less the units nested in it).
"""

from __future__ import annotations

import pandas as pd

from ..traces.kinds import event_names
from .collectives import collective_waits
from .intervals import uncovered_parts

__all__ = ["ROOT_UNIT", "FSDP_PHASES", "fsdp_phases", "fsdp_collectives"]

#: The name of the root unit, which FSDP's annotations leave without one.
ROOT_UNIT = "(root)"
#: FSDP's annotations that mark a phase themselves, and the phase each marks.
FSDP_PHASES = {
    "all_gather": "all-gather",
    "all_gather_copy_out": "copy-out",
    "post_forward": "reshard",
    "post_backward_reshard": "reshard",
    "post_backward_reduce": "reduce-scatter",
}
#: The annotations between which a unit computes, and the phase that is.
_COMPUTE = {"forward": ("pre_forward", "post_forward"), "backward": ("pre_backward", "post_backward_accumulate")}  # fmt: skip
#: The annotations that end a unit's part of each pass (after the closing one).
_PASS_END = {"forward": ("post_forward",), "backward": ("post_backward_reshard", "post_backward_reduce")}  # fmt: skip
_ANNOTATION = r"^FSDP::(\w+)(?: \((.*)\))?$"
COLUMNS = ["rank", "step", "unit", "phase", "start_us", "end_us", "ms"]


def fsdp_phases(events: pd.DataFrame) -> pd.DataFrame:
    """Every phase of every unit in every step, per rank: ``rank, step, unit, phase, start_us,
    end_us, ms``. The phases are ``all-gather``, ``copy-out``, ``forward``, ``backward``,
    ``reshard`` and ``reduce-scatter``; a unit's ``forward`` and ``backward`` leave out the time
    of the units nested in it (one row per stretch). Empty for a run without FSDP's
    annotations (a DDP run)."""
    found = event_names(events).str.extract(_ANNOTATION)
    marks = (
        events[found[0].notna().to_numpy()]
        .assign(what=found[0], unit=found[1].fillna("").replace("", ROOT_UNIT))
        .dropna(subset=["step"])
    )
    marked = marks[marks["what"].isin(FSDP_PHASES)]
    rows = [marked.assign(phase=marked["what"].map(FSDP_PHASES))[COLUMNS[:6]]]
    for (rank, step), mine in marks.groupby(["rank", "step"], observed=True):
        for phase, (opening, closing) in _COMPUTE.items():
            rows.append(_compute_rows(mine, int(rank), int(step), phase, opening, closing))
    found_rows = [r for r in rows if len(r)]
    if not found_rows:
        return pd.DataFrame(columns=COLUMNS)
    table = pd.concat(found_rows, ignore_index=True)
    table = table.assign(ms=(table["end_us"] - table["start_us"]) / 1e3)[COLUMNS]
    return (
        table.astype({"rank": int, "step": int})
        .sort_values(["rank", "start_us"])
        .reset_index(drop=True)
    )


def fsdp_collectives(events: pd.DataFrame, phases: pd.DataFrame | None = None) -> pd.DataFrame:
    """:func:`helpers.collective_waits` of a sharded run with the FSDP phase each collective
    belongs to: ``unit`` and ``phase`` (``all-gather`` or ``reduce-scatter``) of the phase of
    the same rank whose span holds the collective's start (the latest to start, when prefetched
    phases overlap), or missing for a collective outside them. ``phases`` is
    :func:`fsdp_phases` of ``events``, computed when not given."""
    phases = fsdp_phases(events) if phases is None else phases
    waits = collective_waits(events).assign(unit=pd.NA, phase=pd.NA)
    comm = phases[phases["phase"].isin(["all-gather", "reduce-scatter"])]
    for rank, mine in comm.groupby("rank"):
        mine = mine.sort_values("start_us")
        rows = waits.index[waits["rank"] == rank]
        starts = waits.loc[rows, "start_us"].to_numpy()
        at = mine["start_us"].searchsorted(starts, side="right") - 1
        found = (at >= 0) & (starts <= mine["end_us"].to_numpy()[at.clip(0)])
        waits.loc[rows[found], "unit"] = mine["unit"].to_numpy()[at[found]]
        waits.loc[rows[found], "phase"] = mine["phase"].to_numpy()[at[found]]
    return waits


def _compute_rows(
    marks: pd.DataFrame, rank: int, step: int, phase: str, opening: str, closing: str
) -> pd.DataFrame:
    """The stretches in which each unit of one rank's step computed ``phase``: from the end of
    its ``opening`` annotation to the start of its ``closing`` one, less the spans of the units
    nested in it (each from its own ``opening`` to the end of its last annotation of the pass:
    its reduce-scatter, in backward)."""
    spans = {}
    for unit, own in marks.groupby("unit"):
        opens = own[own["what"] == opening].sort_values("start_us")
        if opens.empty:
            continue
        first = opens.iloc[0]
        after = own[own["start_us"] >= first["end_us"]]
        closes = after[after["what"] == closing]
        if closes.empty:
            continue
        close = closes.iloc[0]
        rest = after[
            after["what"].isin(_PASS_END[phase]) & (after["start_us"] >= close["start_us"])
        ]
        span_end = max(close["end_us"], rest["end_us"].max() if len(rest) else close["end_us"])
        spans[unit] = (first["start_us"], first["end_us"], close["start_us"], span_end)
    rows = []
    for unit, (_, begin, end, _) in spans.items():
        nested = [(s[0], s[3]) for u, s in spans.items() if u != unit and _inside(u, unit)]
        rows += [(rank, step, unit, phase, a, b) for a, b in uncovered_parts(begin, end, nested)]
    return pd.DataFrame(rows, columns=COLUMNS[:6])


def _inside(unit: str, outer: str) -> bool:
    """Whether ``unit`` is a module nested in ``outer`` (every unit is inside the root)."""
    return outer == ROOT_UNIT or unit.startswith(outer + ".")
