"""A run summarised rank by rank on a Dask cluster: for a job whose traces are too many for one
machine.

The work is the one ``helpers.summarise_run`` does on this machine, written once and handed to
Dask: a Dask worker reads each rank's events from its Parquet cache (decoded from JSON and
cached on the first pass) and reduces them to what the run-wide analyses need
(``kept_of_file``), and the parts are joined into the same ``RunSummary`` (``summary_of``), whose
``step_times()``, ``waiting_per_step()``, ``find_straggler()`` and ``path_summary()`` (the
critical path, strung together from each rank's part of it) are the series' own functions.
The trace files must be where every worker can read them (a shared file system).

    python examples/rank_by_rank_on_dask.py RUN_FOLDER                 # a local cluster (loopback)
    python examples/rank_by_rank_on_dask.py RUN_FOLDER --scheduler tcp://HOST:8786
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import dask
from distributed import Client, LocalCluster

from helpers.analysis.rank_by_rank import RunSummary, kept_of_file, summary_of
from helpers.traces import trace_files


def summarise_on_dask(files: Sequence[str | Path], client: Client) -> RunSummary:
    """The :class:`RunSummary` of the ranks' ``files``, each rank read and reduced by a worker
    of ``client``'s cluster."""
    parts = [dask.delayed(kept_of_file)(Path(f)) for f in files]
    return summary_of(client.compute(parts, sync=True), files)


def local_cluster(workers: int = 2) -> LocalCluster:
    """A cluster of ``workers`` processes on this machine, listening on loopback only, without
    its web dashboard."""
    return LocalCluster(
        n_workers=workers, threads_per_worker=1, host="127.0.0.1", dashboard_address=None
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a run folder of trace files, one per rank")
    parser.add_argument("--scheduler", help="a Dask scheduler's address (default: a local one)")
    opts = parser.parse_args()
    cluster = None if opts.scheduler else local_cluster()
    with Client(opts.scheduler or cluster) as client:
        summary = summarise_on_dask(trace_files(opts.run), client)
    if cluster is not None:
        cluster.close()
    print("median step time per rank (ms):", summary.step_times().median().round(1).to_dict())
    print("median waiting per step (ms):", summary.waiting_per_step().median().round(1).to_dict())
    print("the rank the others wait for:", summary.find_straggler())
    top = summary.path_summary().iloc[0]
    print(f"most on the critical path: rank {top['rank']}'s {top['name']} ({top['kind']}), "
          f"{top['ms_per_step']:.1f} ms per step")  # fmt: skip


if __name__ == "__main__":
    main()
