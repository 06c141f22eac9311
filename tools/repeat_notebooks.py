"""Execute lessons and solutions again and again under nbval and count the runs each one passed,
and each assertion: a claim a notebook asserts must hold in every run, not in most.

    python tools/repeat_notebooks.py --times 5 notebooks/*.ipynb solutions/*.ipynb
    python tools/repeat_notebooks.py --times 2 --busy 2 notebooks/04_reading_ddp_traces.ipynb
    python tools/repeat_notebooks.py --stress notebooks/*.ipynb solutions/*.ipynb
    python tools/repeat_notebooks.py --summary          # the tables of every run recorded

``--busy N`` keeps N processes spinning on the CPU while the notebooks run (a busy machine: the
runs that find the races); ``--stress`` is one round idle and one with two spinning. Each run's
result is appended to ``build/repeat/results.jsonl`` (notebook, round, busy, passed, seconds, the
first failure's last lines), and every ``assert`` its cells ran, with the values it compared, to
``build/repeat/asserts.jsonl`` (``tools/assert_recorder.py``, loaded into the kernels this tool
starts), so that rounds run at different times add up. The tables at the end count every run
recorded there: per notebook, then per assertion with its worst margin (how far the compared
values stayed from failing, as a share of the larger; ``=`` for an assertion that always saw the
same values, ``-`` where it compared no numbers).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "build" / "repeat" / "results.jsonl"
ASSERTS = ROOT / "build" / "repeat" / "asserts.jsonl"
NBVAL = [
    "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x", "--nbval", "--nbval-current-env",
    "--nbval-sanitize-with", "tests/nbval_sanitize.cfg", "--nbval-cell-timeout=600",
]  # fmt: skip
#: The IPython startup file that loads the assertion recorder into a kernel this tool starts.
STARTUP = f"import sys\nsys.path.insert(0, {str(ROOT / 'tools')!r})\n" + (
    "import assert_recorder\nassert_recorder.install()\n"
)
#: Comparisons whose margin is the distance between the values compared.
ORDERED = {"Lt", "LtE", "Gt", "GtE"}


def _spin() -> None:
    while True:
        pass


def run_once(notebook: Path, busy: int, recorded: bool, profile: Path) -> tuple[dict, list]:
    """One nbval run of ``notebook``: whether it passed, how long it took, how it failed; and
    the assertions its cells ran (``profile``: an IPython folder that loads the recorder)."""
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(busy)]
    for spinner in spinners:
        spinner.start()
    log = profile / "asserts.jsonl"
    log.unlink(missing_ok=True)
    env = dict(os.environ, PDP_CHECKS_MUST_PASS="1", PDP_NO_PROGRESS="1",
               IPYTHONDIR=str(profile), PDP_ASSERT_LOG=str(log))  # fmt: skip
    if recorded:
        env["PDP_RECORDED"] = "1"
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, *NBVAL, str(notebook)], cwd=ROOT, env=env,
            capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        passed, out = done.returncode == 0, done.stdout + done.stderr
    except subprocess.TimeoutExpired:
        passed, out = False, "timed out after 1800 s"
    finally:
        for spinner in spinners:
            spinner.terminate()
    failure = "" if passed else "\n".join(out.strip().splitlines()[-25:])
    asserts = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return {"passed": passed, "seconds": round(time.monotonic() - started, 1), "failure": failure}, asserts  # fmt: skip


def margin(row: dict) -> float | None:
    """How far an ordered comparison's values stayed from failing, as a share of the larger
    (the least over a chain's pairs; negative where it failed); None for other assertions."""
    found = []
    for op, a, b in zip(row["ops"], row["values"], row["values"][1:]):
        if op not in ORDERED or a is None or b is None:
            continue
        gap = b - a if op in ("Lt", "LtE") else a - b
        found.append(gap / max(abs(a), abs(b)) if max(abs(a), abs(b)) else 0.0)
    return min(found) if found else None


def notebook_table(rows: list[dict]) -> list[str]:
    """Per notebook: runs passed, runs, of them busy."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for row in rows:
        counts[row["notebook"]][0] += row["passed"]
        counts[row["notebook"]][1] += 1
        counts[row["notebook"]][2] += row["busy"] > 0
    return ["notebook: passed/runs (of them on a busy machine)"] + [
        f"{name}: {passed}/{runs} ({busy} busy)" for name, (passed, runs, busy) in sorted(counts.items())
    ]  # fmt: skip


def assertion_table(rows: list[dict]) -> list[str]:
    """Per assertion (notebook and claim): held/runs, of them busy, and its worst margin."""
    seen: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in rows:
        seen[(row["notebook"], row["message"] or row["test"])].append(row)
    lines = ["notebook | assertion | held/runs (busy) | worst margin"]
    for (notebook, claim), found in sorted(seen.items()):
        held = sum(r["held"] for r in found)
        busy = sum(r["busy"] > 0 for r in found)
        margins = [m for m in map(margin, found) if m is not None]
        numbers = any(v is not None for v in found[0]["values"])
        same = numbers and len({json.dumps(r["values"]) for r in found}) == 1
        worst = "=" if same else f"{min(margins):.0%}" if margins else "-"
        lines.append(
            f"{Path(notebook).name} | {claim[:70]} | {held}/{len(found)} ({busy}) | {worst}"
        )
    return lines


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument("--times", type=int, default=5, help="runs of each notebook")
    parser.add_argument("--busy", type=int, default=0, help="processes spinning meanwhile")
    parser.add_argument("--stress", action="store_true", help="one round idle, one with 2 busy")
    parser.add_argument("--recorded", action="store_true", help="in recorded mode")
    parser.add_argument("--summary", action="store_true", help="only print the tables")
    args = parser.parse_args(argv)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    rounds = [0, 2] if args.stress else [args.busy] * args.times
    with tempfile.TemporaryDirectory() as folder:
        profile = Path(folder)
        (profile / "profile_default" / "startup").mkdir(parents=True)
        (profile / "profile_default" / "startup" / "00-assert-recorder.py").write_text(STARTUP)
        for round_, busy in enumerate([] if args.summary else rounds):
            for notebook in args.notebooks:
                result, asserts = run_once(notebook, busy, args.recorded, profile)
                row = {"notebook": str(notebook), "round": round_, "busy": busy,
                       "recorded": args.recorded}  # fmt: skip
                with RESULTS.open("a") as f:
                    f.write(json.dumps({**row, **result}) + "\n")
                with ASSERTS.open("a") as f:
                    f.writelines(json.dumps({**row, **a}) + "\n" for a in asserts)
                print(f"{notebook}: {'passed' if result['passed'] else 'FAILED'} "
                      f"({result['seconds']} s, busy {busy})", flush=True)  # fmt: skip
    print("\n" + "\n".join(notebook_table(_read(RESULTS))))
    print("\n" + "\n".join(assertion_table(_read(ASSERTS))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
