"""Benchmark: the categories inferred by ``allocation_lives`` against the profiler's own memory
timeline (``export_memory_timeline``), at each rank's peak.

Launches lesson 15's ``memory_job.py`` (written from its notebook) with ``--timeline``, so that
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


def agreement(run_dir: Path, device: str | None = None) -> tuple[pd.Series, pd.DataFrame]:
    """Per rank, the share of bytes alive at its peak on which both agree; and the bytes they
    differ on, by rank, profiler's and inferred category (what was alive is
    :func:`helpers.alive_at_peak`'s, by the pair of categories). ``device``: that device's
    peaks alone (``cuda:0``, where the job wrote the timeline of its GPU); None: every one."""
    memory, events = load_memory(run_dir), load_run(run_dir, cache=False).events
    theirs = allocation_lives(memory, events, load_memory_categories(run_dir))
    ours = allocation_lives(memory, events)
    pairs = theirs["category"].fillna("(none)") + " | " + ours["category"].fillna("(none)")
    alive = alive_at_peak(theirs.assign(pair=pairs.to_numpy()), memory, by="pair")
    if device is not None:
        alive = alive[alive["device"] == device]
    alive[["category", "inferred"]] = alive["pair"].str.split(" \\| ", expand=True)
    same = alive["category"] == alive["inferred"]
    shares = alive["mib"].where(same, 0).groupby(alive["rank"]).sum() / alive.groupby("rank")["mib"].sum()  # fmt: skip
    differ = alive[~same][["rank", "category", "inferred", "mib"]].round(3)
    return shares.rename("agree"), differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="where the runs go")
    args = parser.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="memory-categories-"))
    root.mkdir(parents=True, exist_ok=True)
    script_from_lesson("memory_job.py", "15_where_the_memory_went.ipynb", dest=root)
    rows = []
    for name, (job_args, tuned) in CASES.items():
        run = launch(root / "memory_job.py", 2, experiment="categories", cpu=True, echo=False,
                     args=[*job_args, "--timeline"], traces_root=root)  # fmt: skip
        shares, differ = agreement(run.run_dir)
        for rank, agree in shares.items():
            rows.append((name, "tuned" if tuned else "held out", rank, f"{agree:.1%}"))
        if not differ.empty:
            print(f"{name}: where they differ (MiB)\n{differ.to_string(index=False)}\n")
    table = pd.DataFrame(rows, columns=["case", "rules", "rank", "bytes agreeing at the peak"])
    print(table.to_markdown(index=False))


if __name__ == "__main__":
    main()
