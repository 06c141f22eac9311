"""What the Flight Recorder's dumps beside the traces add to the report: each gloo collective's
process group (gloo's traces do not name it), and, when the job hung, the section that says
where and why (:func:`hang_section`)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd

from ..hangs import (
    FlightRecorderError,
    analyse_with_pytorch,
    first_mismatch,
    load_flight_records,
    verdicts_compared,
    wait_chains,
    with_groups_from_flight_records,
)
from .sections import Section

__all__ = ["HANG", "records_beside", "with_groups_from_dumps", "hang_section"]

HANG = "The hang, from the Flight Recorder"


def records_beside(folders: set[Path], warn: bool = False) -> pd.DataFrame | None:
    """The Flight Recorder's records of the dumps (``fr_<rank>``) in the traces' one folder;
    None without dumps, with several folders, or with dumps that cannot be read (with ``warn``,
    a note says why)."""
    if len(folders) != 1:
        return None
    try:
        return load_flight_records(next(iter(folders)))
    except FlightRecorderError as err:
        if warn and "no Flight Recorder dumps" not in err.problem:
            warnings.warn(f"the Flight Recorder dumps were left out: {err}", stacklevel=3)
        return None


def with_groups_from_dumps(events: pd.DataFrame, records: pd.DataFrame | None) -> pd.DataFrame:
    """``events`` with each gloo collective's process group taken from the dumps beside the
    traces (``records``, :func:`records_beside`), when there are some. Unchanged without them."""
    gloo = events["name"].astype(str).str.startswith("gloo:") & events["seq"].isna()
    if records is None or not gloo.any():
        return events
    return with_groups_from_flight_records(events, records)


def hang_section(records: pd.DataFrame | None, world: int | None) -> Section | None:
    """The hang the dumps beside the traces show (``records``, :func:`records_beside`), or None
    when their groups all agree (or there are none): the disagreement that started it
    (:func:`helpers.first_mismatch`), then each wait followed from group to group
    (:func:`helpers.wait_chains`), then PyTorch's analyser's verdict beside it, and why they
    differ where they do. ``world``: the job's size, so that a rank that left no dump is
    named."""
    if records is None:
        return None
    ranks = list(range(world)) if world else None
    mismatch = first_mismatch(records, ranks)
    if mismatch is None:
        return None
    chains = wait_chains(records, ranks)
    dumps = len(records.attrs["ranks"])
    of = f"{dumps} of the job's {world} ranks" if world and world != dumps else f"{dumps} ranks"
    text = [
        f"The Flight Recorder's dumps beside the traces (from {of}) show a hang (lesson 13). "
        "Where it started, as `first_mismatch` reads it; look there first:",
        f"- {mismatch}.",
        "The waits, followed from group to group (a rank missing from one group's collective "
        "because it waits in another's is a waiter, not the cause):",
        *(f"- {chain}." for chain in chains),
        _pytorchs_verdict(records, mismatch, ranks),
    ]
    text = [line for line in text if line]
    return Section(HANG, "\n".join(text))


def _pytorchs_verdict(records: pd.DataFrame, mismatch, ranks: list[int] | None) -> str:
    """PyTorch's analyser (``fr_trace``) run on the same dumps, its verdict beside the
    series' (:func:`helpers.verdicts_compared`); a sentence saying why not where it fails; ""
    for records not read from a folder."""
    if "dumps" not in records.attrs:  # records not read from a folder: nothing to run it on
        return ""
    folder, prefix = records.attrs["dumps"]
    try:
        verdict = analyse_with_pytorch(folder, prefix=prefix)
    except FlightRecorderError as err:
        return f"PyTorch's analyser could not be run on these dumps: {err.problem}"
    return verdicts_compared(records, mismatch, verdict, ranks)
