"""Reproductions of hangs across process groups (issue 49): random cases of ``hang_job.py``, each
kept with the rank that hung it, and what the series and PyTorch's analyser say of each.

Each case draws, from ``--seed``: 4 or 8 ranks, a stall or a kill, the rank, the step (1-3) and
the collective (tp, ep or dp) before which it happens. It runs the job under torchrun, keeps the
Flight Recorder dumps in ``--out``/<case>/ with ``case.json`` (what was drawn), then prints a
table: the ranks :func:`helpers.first_mismatch` names, and PyTorch's analyser's first finding
(``python -m torch.distributed.flight_recorder.fr_trace`` through
:func:`helpers.analyse_with_pytorch`), each beside the rank that hung the job. With ``--table``
only, it reads cases kept before and runs nothing. The tests read the kept cases
(``tests/data/hang-cases/``, ``tests/test_hang_cases.py``).

    OMP_NUM_THREADS=1 python benchmarks/hang_cases.py --cases 24 --out tests/data/hang-cases
    python benchmarks/hang_cases.py --table --out tests/data/hang-cases
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from helpers import RankFailed, analyse_with_pytorch, first_mismatch, load_flight_records  # noqa: E402
from helpers.jobs import launch  # noqa: E402

JOB = REPO / "benchmarks" / "hang_job.py"
CASE = "case.json"


def draw(rng: random.Random) -> dict:
    """One case: the job's size and what goes wrong, where."""
    world = rng.choice([4, 8])
    return {
        "world": world,
        "fault": rng.choice(["stall", "kill"]),
        "rank": rng.randrange(world),
        "step": rng.randint(1, 3),
        "at": rng.choice(["tp", "ep", "dp"]),
    }


def run_case(case: dict, dest: Path, scratch: Path) -> None:
    """Run the job of ``case`` and keep its dumps and ``case.json`` in ``dest``."""
    options = ["--fault", case["fault"], "--fault-rank", str(case["rank"])]
    options += ["--fault-step", str(case["step"]), "--fault-at", case["at"]]
    try:
        launch(JOB, nproc=case["world"], cpu=True, echo=False, timeout=120,
               traces_root=scratch, experiment="hang", args=options)  # fmt: skip
    except RankFailed as err:
        run = err.record
    else:
        raise SystemExit(f"{case}: the job finished; it was meant to hang")
    dest.mkdir(parents=True, exist_ok=True)
    for dump in run.paths("fr_*"):
        shutil.copy(dump, dest / dump.name)
    (dest / CASE).write_text(json.dumps(case) + "\n")


def verdicts(folder: Path) -> dict:
    """What the series and PyTorch's analyser name in the case kept in ``folder``."""
    case = json.loads((folder / CASE).read_text())
    records = load_flight_records(folder)  # a killed rank left none: the job's ranks say so
    mismatch = first_mismatch(records, ranks=list(range(case["world"])))
    pytorch = analyse_with_pytorch(folder)
    return {
        **case,
        "series": mismatch.culprits if mismatch else [],
        "pytorch": pytorch.culprits,
        "findings": "; ".join(f"{f.desc} #{f.seq}: {f.culprits}" for f in pytorch.findings),
    }


def table(out: Path) -> str:
    """The cases kept in ``out`` as a Markdown table, with how often each names the rank alone."""
    rows = [verdicts(f) for f in sorted(p.parent for p in out.glob(f"*/{CASE}"))]
    lines = ["| case | ranks | fault | rank, step, group | series names | PyTorch's first finding | all its findings |"]  # fmt: skip
    lines.append("| --- | --- | --- | --- | --- | --- | --- |")
    for i, r in enumerate(rows):
        where = f"{r['rank']}, {r['step']}, {r['at']}"
        lines.append(f"| {i:02d} | {r['world']} | {r['fault']} | {where} | {r['series']} | {r['pytorch']} | {r['findings'] or 'none'} |")  # fmt: skip
    alone = sum(r["series"] == [r["rank"]] for r in rows)
    theirs = sum(r["pytorch"] == [r["rank"]] for r in rows)
    lines += ["", f"The rank alone: the series {alone} of {len(rows)}, PyTorch's analyser's first finding {theirs}."]  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=24)
    parser.add_argument("--seed", type=int, default=49)
    parser.add_argument("--out", type=Path, required=True, help="where the cases are kept")
    parser.add_argument("--table", action="store_true", help="only the table of kept cases")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    if not args.table:
        rng = random.Random(args.seed)
        with tempfile.TemporaryDirectory(prefix="hang-cases-") as scratch:
            for i in range(args.cases):
                case = draw(rng)
                run_case(case, args.out / f"{i:02d}", Path(scratch))
                print(f"case {i:02d}: {case}", flush=True)
    print(table(args.out))


if __name__ == "__main__":
    main()
