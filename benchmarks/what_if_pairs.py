"""Benchmark: the what-if held to runs made without the change (issue 69). Every figure is
measured from the runs this script records.

Each pair is a job run twice, fresh each time: with a change (a rank's batches loaded late, its
backward or its optimizer slowed, a pipeline stage slowed, work that overlaps a collective) and
without it. ``what_if`` on the first run predicts the median step without the change; the second
run measures it. Each pair is recorded ``--repeats`` times; its error is the median of its
repeats' predictions against the median of their runs without the change, and every repeat's
own error is kept too. Beside them: what two runs of the same job made without the change differ
by (their median steps), the noise any prediction is held to.

The jobs are the lessons' own scripts (lesson 3's DDP, lesson 10's FSDP2, lesson 13's 2x2 mesh,
lesson 14's pipelines, written out with ``dist.recv``/``dist.isend`` and run by
``torch.distributed.pipelining``) and ``what_if_job.py``; some with more ranks than the machine
has cores. The two GPU pairs are the series' H200 recordings (``../shared/real-traces/h200``,
one run each: no GPU here).

    OMP_NUM_THREADS=1 python benchmarks/what_if_pairs.py --repeats 3 --runs build/what-if-pairs
    python benchmarks/what_if_pairs.py --runs build/what-if-pairs --measure-only [--record]

``--record`` writes the table into ``helpers/analysis/path/what_if_checks.csv``
(:func:`helpers.what_if_checks`), which the report and lesson 11 quote.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import warnings
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from helpers import load_run, step_times, what_if  # noqa: E402
from helpers.jobs import launch, script_from_lesson, usable_cores  # noqa: E402

CHECKS = REPO / "helpers" / "analysis" / "path" / "what_if_checks.csv"
H200 = REPO.parent / "shared" / "real-traces" / "h200"
DDP = ["--steps", "9", "--wait", "2", "--warmup", "1", "--active", "6"]
PIPE = ["--steps", "6", "--microbatches", "6", "--work-ms", "5"]
LESSON_PIPE = ["--steps", "6", "--microbatches", "6", "--work-ms", "10"]
#: The cores of the machine the first runs were recorded on, before their records said it.
CORES = 2


@dataclass(frozen=True)
class Pair:
    """A job as it is (``changed``: its arguments) and without the change (``without``), and
    what the what-if changes: ``rank``'s events named ``name`` (a regular expression), to
    ``factor`` of their time."""

    shape: str
    script: str
    nproc: int
    changed: tuple[str, ...]
    without: tuple[str, ...]
    rank: int
    name: str
    factor: float = 0.0


def _slowed(part: str, rank: int = 1, ms: int = 150) -> tuple[str, ...]:
    return ("--slow-rank", str(rank), "--delay-ms", str(ms), "--slow-part", part)


#: Every pair, by name.
PAIRS = {
    "DDP, 2 ranks: rank 1's batches 150 ms late": Pair(
        "DDP", "train_ddp.py", 2, (*DDP, *_slowed("data")), tuple(DDP), 1, "DataLoader"),
    "DDP, 2 ranks: rank 1's backward 150 ms slower": Pair(
        "DDP", "train_ddp.py", 2, (*DDP, *_slowed("backward")), tuple(DDP), 1, "BackwardHookFunctionBackward"),
    "DDP, 2 ranks: rank 1's optimizer 100 ms slower": Pair(
        "DDP", "train_ddp.py", 2, (*DDP, *_slowed("optimizer", ms=100)), tuple(DDP), 1, "^Optimizer.step"),
    "DDP, 3 ranks on 2 cores: rank 2's batches 150 ms late": Pair(
        "DDP", "train_ddp.py", 3, (*DDP, *_slowed("data", rank=2)), tuple(DDP), 2, "DataLoader"),
    "DDP, 3 ranks on 2 cores: rank 1's backward 150 ms slower": Pair(
        "DDP", "train_ddp.py", 3, (*DDP, *_slowed("backward")), tuple(DDP), 1, "BackwardHookFunctionBackward"),
    "two slowed ranks (120 and 60 ms): remove rank 0's delay": Pair(
        "slack", "what_if_job.py", 2, ("--delay-ms", "120,60"), ("--delay-ms", "0,60"), 0, "^load_batch$"),
    "three ranks on 2 cores, two slowed (120 and 60 ms): remove rank 0's": Pair(
        "slack", "what_if_job.py", 3, ("--delay-ms", "120,60,0"), ("--delay-ms", "0,60,0"), 0, "^load_batch$"),
    "rank 0 works 40 ms while rank 1 holds the collective 60 ms: remove that work": Pair(
        "buys nothing", "what_if_job.py", 2, ("--delay-ms", "0,60", "--overlap-ms", "40,0"), ("--delay-ms", "0,60"), 0, "^overlapped$"),
    "rank 0 works 100 ms while rank 1 holds it 60 ms: remove that work": Pair(
        "buys nothing", "what_if_job.py", 2, ("--delay-ms", "0,60", "--overlap-ms", "100,0"), ("--delay-ms", "0,60"), 0, "^overlapped$"),
    "FSDP2, 2 ranks: rank 1's batches 150 ms late": Pair(
        "FSDP2", "train_fsdp.py", 2, (*DDP, *_slowed("data")), tuple(DDP), 1, "DataLoader"),
    "FSDP2, 3 ranks on 2 cores: rank 1's batches 150 ms late": Pair(
        "FSDP2", "train_fsdp.py", 3, (*DDP, *_slowed("data")), tuple(DDP), 1, "DataLoader"),
    "1F1B, 3 stages on 2 cores: stage 1 slowed 20 ms a forward": Pair(
        "pipeline", "pipeline_job.py", 3, (*PIPE, "--schedule", "1f1b", "--slow-rank", "1", "--delay-ms", "20", "--delay-name", "slow_layer"), (*PIPE, "--schedule", "1f1b"), 1, "^slow_layer$"),
    "GPipe, 3 stages on 2 cores: stage 2 slowed 15 ms a forward": Pair(
        "pipeline", "pipeline_job.py", 3, (*PIPE, "--schedule", "gpipe", "--slow-rank", "2", "--delay-ms", "15", "--delay-name", "slow_layer"), (*PIPE, "--schedule", "gpipe"), 2, "^slow_layer$"),
    "1F1B as lesson 14 runs it (10 ms a forward): stage 2 slowed 15 ms a forward": Pair(
        "pipeline", "pipeline_job.py", 3, (*LESSON_PIPE, "--schedule", "1f1b", "--slow-rank", "2", "--delay-ms", "15", "--delay-name", "slow_layer"), (*LESSON_PIPE, "--schedule", "1f1b"), 2, "^slow_layer$"),
    "GPipe as lesson 14 runs it (10 ms a forward): stage 1 slowed 10 ms a forward": Pair(
        "pipeline", "pipeline_job.py", 3, (*LESSON_PIPE, "--schedule", "gpipe", "--slow-rank", "1", "--delay-ms", "10", "--delay-name", "slow_layer"), (*LESSON_PIPE, "--schedule", "gpipe"), 1, "^slow_layer$"),
    "1F1B, lesson 14's slowed run: stage 1 slowed 20 ms a forward": Pair(
        "pipeline", "pipeline_job.py", 3, (*LESSON_PIPE, "--slow-rank", "1", "--delay-ms", "20", "--delay-name", "slow_layer"), tuple(LESSON_PIPE), 1, "^slow_layer$"),
    "GPipe, 4 micro-batches, sends let go: stage 2 slowed 20 ms a forward": Pair(
        "pipeline", "pipeline_job.py", 3, ("--steps", "6", "--microbatches", "4", "--schedule", "gpipe", "--let-go", "--slow-rank", "2", "--delay-ms", "20", "--delay-name", "slow_layer"), ("--steps", "6", "--microbatches", "4", "--schedule", "gpipe", "--let-go"), 2, "^slow_layer$"),
    "torch.distributed.pipelining 1F1B, 3 stages: stage 1 slowed 20 ms a forward": Pair(
        "pipeline", "pipelining_job.py", 3, (*PIPE, "--schedule", "1f1b", "--slow-rank", "1", "--delay-ms", "20"), (*PIPE, "--schedule", "1f1b"), 1, "^slow_layer$"),
    "2x2 mesh, 4 ranks on 2 cores: rank 1 80 ms late a step, halved": Pair(
        "mesh", "mesh_job.py", 4, ("--steps", "12", "--profile", "--slow-rank", "1", "--delay-ms", "80"), ("--steps", "12", "--profile", "--slow-rank", "1", "--delay-ms", "40"), 1, "^late$", 0.5),
}  # fmt: skip
#: The GPU pairs, recorded once on one H200: the run with the change, and the run without it.
GPU_PAIRS = {
    "H200, 2 ranks on one GPU: rank 1's slow op on its main stream": (
        "gpuslow-1",
        "base-1",
        1,
        "^slow_op$",
    ),  # fmt: skip
    "H200, 2 ranks on one GPU: rank 1's work on a side stream": (
        "side-1",
        "base-1",
        1,
        "^side_op$",
    ),  # fmt: skip
}
#: Where each script is written from.
LESSONS = {
    "train_ddp.py": "03_ddp_under_torchrun.ipynb",
    "train_fsdp.py": "10_sharded_training.ipynb",
    "mesh_job.py": "13_many_process_groups.ipynb",
    "pipeline_job.py": "14_pipelines.ipynb",
    "pipelining_job.py": "14_pipelines.ipynb",
}


def scripts(folder: Path) -> None:
    """Every pair's script in ``folder``, written from its lesson (or copied from here)."""
    folder.mkdir(parents=True, exist_ok=True)
    for script, lesson in LESSONS.items():
        script_from_lesson(script, lesson, dest=folder)
    (folder / "what_if_job.py").write_text((REPO / "benchmarks" / "what_if_job.py").read_text())


def folder_of(name: str) -> str:
    """The folder a pair's runs are kept in: its name, lower case, words joined by hyphens
    (so a pair keeps its runs when pairs are added or reordered)."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def record(runs: Path, repeats: int, names: list[str]) -> None:
    """Run every pair of ``names`` ``repeats`` times into ``runs``: repeat i of a pair is a run
    in ``<pair>/<i>/changed/`` and one in ``<pair>/<i>/without/`` (made one after the other),
    each with a file ``done`` that names it."""
    scripts(runs / "scripts")
    for i in range(repeats):
        for name in names:
            pair = PAIRS[name]
            for which, args in (("changed", pair.changed), ("without", pair.without)):
                where = runs / folder_of(name) / str(i)
                if (where / which / "done").exists():
                    continue
                done = launch(runs / "scripts" / pair.script, pair.nproc, experiment=which,
                              args=list(args), echo=False, traces_root=where, timeout=600)  # fmt: skip
                said = {"pair": name, "args": list(args), "run": Path(done.run_dir).name, "cores": usable_cores()}  # fmt: skip
                (where / which / "done").write_text(json.dumps(said))
                print(f"{name} #{i} {which}: {done.run_dir}", flush=True)


def median_step(events: pd.DataFrame) -> float:
    """A run's median step (ms): the median over its steps of the median over its ranks."""
    return float(step_times(events).median(axis=1).median())


def measured(events_changed: pd.DataFrame, events_without: pd.DataFrame, pair: Pair, cores: int | None) -> dict:  # fmt: skip
    """One repeat of ``pair``: the what-if's prediction (its median and the range of its steps)
    and subtraction's (the step less the work's time a step, as ``factor`` changes it) against
    the run without the change (its median step and the range of its steps); the ranks shared
    ``cores`` (None: not known)."""
    predicted = what_if(events_changed, pair.rank, pair.name, pair.factor, cores=cores)
    steps = step_times(events_without).median(axis=1)
    names = events_changed["name"].astype(str)
    work = events_changed[(events_changed["rank"] == pair.rank) & names.str.contains(pair.name)]
    work_ms = float((work.groupby("step")["dur_us"].sum() / 1e3).median())
    return {
        "step_ms": median_step(events_changed),
        "subtracted_ms": median_step(events_changed) - (1 - pair.factor) * work_ms,
        "predicted_ms": float(predicted.median()),
        "predicted_low_ms": float(predicted.quantile(0.1)),
        "predicted_high_ms": float(predicted.quantile(0.9)),
        "without_ms": float(steps.median()),
        "without_low_ms": float(steps.min()),
        "without_high_ms": float(steps.max()),
    }


def _load(folder: Path) -> pd.DataFrame:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_run(folder, cache=False).events


def measure(runs: Path) -> pd.DataFrame:
    """One row per repeat of every pair recorded under ``runs``, and one per GPU pair."""
    rows = []
    for done in sorted(runs.glob("*/*/changed/done")):
        name = json.loads(done.read_text())["pair"]
        other = done.parents[1] / "without" / "done"
        if name not in PAIRS or not other.exists():
            continue
        pair = PAIRS[name]
        said = json.loads(done.read_text())
        run_of = [done.parent / said["run"], other.parent / json.loads(other.read_text())["run"]]
        row = measured(_load(run_of[0]), _load(run_of[1]), pair, said.get("cores", CORES))
        job = f"{pair.script} on {pair.nproc} ranks {' '.join(pair.without)}"
        rows.append({"pair": name, "shape": pair.shape, "ranks": pair.nproc, "job": job, "repeat": int(done.parents[1].name), "without_run": str(run_of[1]), **row})  # fmt: skip
    for name, (changed, without, rank, pattern) in GPU_PAIRS.items():
        if (H200 / changed).is_dir():
            pair = Pair("GPU (H200)", "gpu_job.py", 2, (), (), rank, pattern)
            row = measured(_load(H200 / changed), _load(H200 / without), pair, None)
            rows.append({"pair": name, "shape": "GPU (H200)", "ranks": 2, "job": without, "repeat": 0, "without_run": without, **row})  # fmt: skip
    order = {name: i for i, name in enumerate([*PAIRS, *GPU_PAIRS])}
    table = pd.DataFrame(rows).sort_values(["pair", "repeat"], key=lambda c: c.map(order) if c.name == "pair" else c)  # fmt: skip
    table = table.reset_index(drop=True)
    table["error_pct"] = 100 * (table["predicted_ms"] - table["without_ms"]) / table["without_ms"]
    return table


def per_pair(table: pd.DataFrame) -> pd.DataFrame:
    """Each pair's medians over its repeats and its error: the median prediction against the
    median of every run made of the job without the change (the pairs that share it pool their
    runs), with what those runs differ by (their spread over their median; none for one run)."""
    jobs = table.drop_duplicates("without_run").groupby("job")["without_ms"]
    grouped = table.groupby(["pair", "shape", "ranks", "job"], sort=False)
    out = grouped.agg(
        runs=("repeat", "size"),
        step_ms=("step_ms", "median"),
        predicted_ms=("predicted_ms", "median"),
        subtracted_ms=("subtracted_ms", "median"),
        worst_run_pct=("error_pct", lambda s: s.abs().max()),
    ).reset_index()
    out["without_ms"] = out["job"].map(jobs.median())
    out["runs_without"] = out["job"].map(jobs.size())
    spread = (100 * (jobs.max() - jobs.min()) / jobs.median()).where(jobs.size() > 1)
    out["runs_spread_pct"] = out["job"].map(spread)
    for which in ("predicted", "subtracted"):
        off = out[f"{which}_ms"] - out["without_ms"]
        out[f"{which}_error_pct"] = 100 * off / out["without_ms"]
    return out.rename(columns={"predicted_error_pct": "error_pct"})


def distribution(errors: pd.Series) -> str:
    """Median, 90th percentile and worst of ``errors`` (%), in absolute value."""
    a = errors.abs()
    return f"median {a.median():.1f} %, 90th percentile {a.quantile(0.9):.1f} %, worst {a.max():.1f} %"  # fmt: skip


def report(table: pd.DataFrame) -> pd.DataFrame:
    """Print the pairs' table and the distributions; return the pairs' table."""
    pairs = per_pair(table)
    print("| pair | ranks | runs | step | measured without (runs) | what-if | error | worst single run | runs without it differ by | subtraction |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in pairs.itertuples():
        spread = "one run" if pd.isna(r.runs_spread_pct) else f"{r.runs_spread_pct:.1f} %"
        print(f"| {r.pair} | {r.ranks} | {r.runs} | {r.step_ms:.1f} ms | {r.without_ms:.1f} ms ({r.runs_without}) | {r.predicted_ms:.1f} ms | {r.error_pct:+.1f} % | {r.worst_run_pct:.1f} % | {spread} | {r.subtracted_ms:.1f} ms ({r.subtracted_error_pct:+.0f} %) |")  # fmt: skip
    print(f"\n{len(pairs)} pairs of {pairs['shape'].nunique()} shapes; the pairs' errors: {distribution(pairs['error_pct'])}")  # fmt: skip
    print(f"every run's error ({len(table)} runs): {distribution(table['error_pct'])}")
    print(f"subtraction's errors, the pairs': {distribution(pairs['subtracted_error_pct'])}")
    live = pairs[pairs["runs_without"] > 1].drop_duplicates("job")
    print(f"what the runs of one job without the change differ by (max - min over median, per job): median {live['runs_spread_pct'].median():.1f} %, worst {live['runs_spread_pct'].max():.1f} %")  # fmt: skip
    return pairs


def write_checks(pairs: pd.DataFrame) -> None:
    """The pairs' table as :func:`helpers.what_if_checks` reads it: the pairs measured now
    replace their rows; the others keep theirs, with the day they were measured."""
    rows = pd.DataFrame(
        {
            "case": pairs["pair"],
            "shape": pairs["shape"],
            "ranks": pairs["ranks"],
            "what_if_ms": pairs["predicted_ms"].round(1),
            "subtraction_ms": pairs["subtracted_ms"].round(1),
            "measured_ms": pairs["without_ms"].round(1),
            "runs": pairs["runs"],
            "measured_on": date.today().isoformat(),
            "error_pct": pairs["error_pct"].round(1),
            "runs_without": pairs["runs_without"],
            "runs_differ_pct": pairs["runs_spread_pct"].round(1),
        }
    )
    kept = pd.read_csv(CHECKS) if CHECKS.exists() else rows.iloc[:0]
    kept = kept[~kept["case"].isin(rows["case"])]
    order = {name: i for i, name in enumerate([*PAIRS, *GPU_PAIRS])}
    rows = pd.concat([kept, rows]).sort_values("case", key=lambda c: c.map(order))
    rows.to_csv(CHECKS, index=False)
    print(f"recorded in {CHECKS.relative_to(REPO)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=REPO / "build" / "what-if-pairs")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--measure-only", action="store_true", help="read the runs recorded")
    parser.add_argument("--pairs", default="", help="only the pairs whose names contain this")
    parser.add_argument("--record", action="store_true", help=f"write {CHECKS.name}")
    parser.add_argument("--json", type=Path, help="write every run's row here too")
    args = parser.parse_args(argv)
    names = [n for n in PAIRS if args.pairs in n]
    if not args.measure_only:
        record(args.runs, args.repeats, names)
    table = measure(args.runs)
    pairs = report(table)
    if args.json:
        args.json.write_text(table.to_json(orient="records", indent=1))
    if args.record:
        write_checks(pairs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
