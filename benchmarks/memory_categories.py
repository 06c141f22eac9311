"""Benchmark: the categories inferred by ``allocation_lives`` against the profiler's own memory
timeline (``export_memory_timeline``), at each rank's peak.

Launches lesson 14's ``memory_job.py`` (written from its notebook) with ``--timeline``, so that
each rank writes the profiler's categories beside its trace, in the cases below; reads each
run twice, once with the profiler's categories and once inferring them; and prints, per case and
rank, the share of the bytes alive at the peak whose inferred category is the profiler's, with
the bytes on which they differ, by (profiler's, inferred). The cases: the job the rules were
written against (``tuned``: rank 1 keeps 1 MiB a step in its forward) and jobs they never saw
(another rank keeping in its loss, another width and batch, a job that keeps nothing).

    python benchmarks/memory_categories.py [--out FOLDER]

The profiler's memory timeline fails on torch 2.14 under FSDP2 and where the trace holds
Adam's first step, so no such case is here.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from helpers import (  # noqa: E402
    alive_at_peak,
    allocation_lives,
    launch,
    load_memory,
    load_memory_categories,
    load_run,
    peak_moments,
    script_from_lesson,
)

#: name: (the job's arguments, whether the rules were written against it)
CASES = {
    "tuned": (["--keep-rank", "1"], True),
    "loss, rank 0, 0.5 MiB": (
        ["--keep-rank", "0", "--keep-mib", "0.5", "--keep-in", "loss"],
        False,
    ),
    "width 768, batch 128": (["--width", "768", "--batch", "128", "--keep-rank", "1"], False),
    "keeps nothing": ([], False),
}


def agreement(run_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per rank, the share of bytes alive at its peak on which both agree; and the bytes they
    differ on, by rank, profiler's and inferred category."""
    memory, events = load_memory(run_dir), load_run(run_dir, cache=False).events
    theirs = allocation_lives(memory, events, load_memory_categories(run_dir))
    ours = allocation_lives(memory, events)
    peaks = peak_moments(theirs, memory)[["rank", "at_us"]]
    both = theirs.assign(inferred=ours["category"].to_numpy()).merge(peaks, on="rank")
    alive = both[(both["alloc_us"] <= both["at_us"]) & ~(both["free_us"] <= both["at_us"])]
    alive = alive.fillna({"category": "(none)", "inferred": "(none)"})
    same = alive["category"] == alive["inferred"]
    shares = (alive["bytes"].where(same, 0).groupby(alive["rank"]).sum()
              / alive.groupby("rank")["bytes"].sum()).rename("agree")  # fmt: skip
    differ = alive[~same].groupby(["rank", "category", "inferred"])["bytes"].sum() / 2**20
    assert alive_at_peak(theirs, memory)["mib"].sum() > 0
    return shares.reset_index(), differ.round(3).rename("mib").reset_index()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="where the runs go")
    args = parser.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="memory-categories-"))
    script_from_lesson("memory_job.py", "14_where_the_memory_went.ipynb", dest=root)
    rows = []
    for name, (job_args, tuned) in CASES.items():
        run = launch(root / "memory_job.py", 2, experiment="categories", cpu=True, echo=False,
                     args=[*job_args, "--timeline"], traces_root=root)  # fmt: skip
        shares, differ = agreement(run.run_dir)
        for r in shares.itertuples():
            rows.append((name, "tuned" if tuned else "held out", r.rank, f"{r.agree:.1%}"))
        if not differ.empty:
            print(f"{name}: where they differ (MiB)\n{differ.to_string(index=False)}\n")
    table = pd.DataFrame(rows, columns=["case", "rules", "rank", "bytes agreeing at the peak"])
    print(table.to_markdown(index=False))


if __name__ == "__main__":
    main()
