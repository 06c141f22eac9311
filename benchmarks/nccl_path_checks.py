"""Benchmark: the critical path on real multi-GPU NCCL jobs (issue 68's three figures), measured
with a matching of its own that shares nothing with the path's.

Each folder is one job, every rank present, one GPU per rank (``../shared/real-traces/nccl-jobs``,
or folders given on the command line). For each:

- **tiling**: per step, how far the path's time is from the step's wall time (its window:
  from the moment the last rank ended the step before to the moment the last rank ended it),
  and whether any two segments overlap; the worst step;
- **last arrival**: at each collective whose transfer the path holds (a ``transfer`` segment on
  an NCCL kernel), whether the path just before the transfer is on the rank that arrived last.
  The checker finds the collective on every rank on its own, by time alone: on each other rank,
  the NCCL kernel of the same name that overlaps it longest (a collective's kernels all run at
  its last arrival); the rank whose kernel started last arrived last;
- **waiting in NCCL**: the share of the path's time spent inside NCCL kernels before their
  collective's last arrival (a rank spinning while it waits for the others).

    python benchmarks/nccl_path_checks.py [FOLDER ...]

Prints one table (markdown) and, with ``--json FILE``, writes its rows.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from helpers import critical_path, load_run  # noqa: E402

NCCL_JOBS = REPO.parent / "shared" / "real-traces" / "nccl-jobs"
#: How far a kernel may fall short of overlapping its collective's kernel on another rank (µs;
#: a small send or receive of an all-to-all ends once its own data has moved).
SLACK_US = 100.0
_NCCL = r"^nccl(?:Dev)?Kernel"


@dataclass
class Figures:
    """One job's figures (see the module)."""

    job: str
    ranks: int
    steps: int
    worst_tiling: float  # |path time - window| / window, the worst step
    overlaps: int  # pairs of consecutive segments that overlap
    transfers: int  # collectives whose transfer the path holds (checked: on every rank)
    right_rank: int  # of those, where the path just before is on the last arrival
    waiting_share: float  # of the path, inside NCCL kernels before their last arrival
    ranks_on_path: str  # the ranks the path visits

    @property
    def right_share(self) -> float:
        return self.right_rank / self.transfers if self.transfers else float("nan")

    def passes(self) -> bool:
        """Issue 68's three bars."""
        return (
            self.worst_tiling <= 0.03
            and self.overlaps == 0
            and self.transfers >= 1
            and self.right_share >= 0.8
            and self.waiting_share <= 0.05
        )


def nccl_kernels(events: pd.DataFrame) -> pd.DataFrame:
    """Every NCCL kernel of the run, with ``last_rank`` and ``last_arrival_us``: the rank of its
    collective whose kernel started last and when. Its collective, on each other rank: the
    kernel of the same name that overlaps it longest in time, if it overlaps (or falls short by
    at most :data:`SLACK_US`). NaN where some rank has none."""
    on_gpu = events["cat"].astype(str).isin(["kernel"]).to_numpy()
    kernels = events[on_gpu & events["name"].astype(str).str.contains(_NCCL).to_numpy()].copy()
    ranks = sorted(kernels["rank"].unique())
    by_rank_name = {
        key: (g["start_us"].to_numpy(float), g["end_us"].to_numpy(float))
        for key, g in kernels.groupby(["rank", "name"], observed=True)
    }
    last_rank, last_arrival = [], []
    for rank, name, start, end in zip(
        kernels["rank"], kernels["name"], kernels["start_us"], kernels["end_us"]
    ):
        arrivals = {rank: start}
        for other in ranks:
            starts, ends = by_rank_name.get((other, name), (np.zeros(0), np.zeros(0)))
            if other == rank or not len(starts):
                continue
            overlap = np.minimum(ends, end) - np.maximum(starts, start)
            at = int(np.argmax(overlap))
            if overlap[at] > -SLACK_US:
                arrivals[other] = starts[at]
        if len(arrivals) < len(ranks):
            last_rank.append(np.nan)
            last_arrival.append(np.nan)
            continue
        who = max(arrivals, key=lambda r: (arrivals[r], -r))
        last_rank.append(who)
        last_arrival.append(arrivals[who])
    return kernels.assign(last_rank=last_rank, last_arrival_us=last_arrival)


def figures(job: str, events: pd.DataFrame, path: pd.DataFrame) -> Figures:
    """The three figures of one job (see the module)."""
    steps = events[(events["kind"] == "step").to_numpy()].dropna(subset=["step"])
    ends = steps.groupby("step")["end_us"].max().sort_index()
    starts = steps.groupby("step")["start_us"].min()
    walls, previous = {}, None
    for step, hi in ends.items():
        lo = starts[step] if previous is None else previous
        walls[int(step)] = (float(lo), float(hi))
        previous = float(hi)
    tiling, overlaps = 0.0, 0
    for step, seg in path.groupby("step"):
        lo, hi = walls[int(step)]
        tiling = max(tiling, abs(seg["dur_us"].sum() - (hi - lo)) / (hi - lo))
        seg = seg.sort_values("start_us")
        overlaps += int((seg["start_us"].to_numpy()[1:] < seg["end_us"].to_numpy()[:-1] - 1e-3).sum())  # fmt: skip

    kernels = nccl_kernels(events)

    path = path.reset_index(drop=True)
    transfers = right = 0
    nccl_segments = path["name"].astype(str).str.contains(_NCCL).to_numpy()
    for i in np.flatnonzero(nccl_segments & (path["reason"] == "transfer").to_numpy()):
        seg = path.loc[i]
        found = _collective_of(seg, kernels)
        if found is None:
            continue
        transfers += 1
        before = path.loc[i - 1] if i > 0 and path.at[i - 1, "step"] == seg["step"] else seg
        right += int(before["rank"] == found[0])

    waiting = 0.0
    for i in np.flatnonzero(nccl_segments):
        seg = path.loc[i]
        found = _collective_of(seg, kernels)
        if found is not None:
            waiting += max(0.0, min(seg["end_us"], found[1]) - seg["start_us"])
    return Figures(
        job,
        int(events["rank"].nunique()),
        len(walls),
        float(tiling),
        overlaps,
        transfers,
        right,
        waiting / float(path["dur_us"].sum()),
        ",".join(str(r) for r in sorted(path["rank"].unique())),
    )


def _collective_of(segment: pd.Series, kernels: pd.DataFrame) -> tuple[int, float] | None:
    """The last rank and last arrival of the NCCL kernel a path segment lies in (on its rank, by
    name, the kernel that covers the segment); None where that kernel's collective is not seen
    on every rank."""
    mine = kernels[(kernels["rank"] == segment["rank"]).to_numpy()]
    mine = mine[(mine["name"].astype(str) == str(segment["name"])).to_numpy()]
    inside = mine[(mine["start_us"] <= segment["start_us"] + 1e-3).to_numpy() & (mine["end_us"] >= segment["end_us"] - 1e-3).to_numpy()]  # fmt: skip
    if inside.empty or np.isnan(inside["last_rank"].iloc[0]):
        return None
    return int(inside["last_rank"].iloc[0]), float(inside["last_arrival_us"].iloc[0])


def job_figures(folder: Path) -> Figures:
    """Load one job (read only: no cache) and measure it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        events = load_run(folder, cache=False).events
        path = critical_path(events)
    return figures(folder.name, events, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*", type=Path)
    parser.add_argument("--json", type=Path, help="write the rows here too")
    args = parser.parse_args(argv)
    folders = args.folders or sorted(p for p in NCCL_JOBS.iterdir() if p.is_dir() and any(p.glob("*.json*")))  # fmt: skip
    rows = [job_figures(f) for f in folders]
    print("| job | ranks | steps | worst tiling | overlaps | transfers on the path | before it on the last arrival | in NCCL before the last arrival | ranks on the path | passes |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r.job} | {r.ranks} | {r.steps} | {r.worst_tiling:.2%} | {r.overlaps} | "
            f"{r.transfers} | {r.right_rank} ({r.right_share:.0%}) | {r.waiting_share:.2%} | "
            f"{r.ranks_on_path} | {'yes' if r.passes() else 'NO'} |"
        )
    if args.json:
        args.json.write_text(json.dumps([asdict(r) | {"passes": r.passes()} for r in rows], indent=1))  # fmt: skip
    return 0 if all(r.passes() for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
