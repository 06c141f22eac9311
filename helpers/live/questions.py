"""Look inside a job while it runs: ask every rank's debug server, get pandas tables back.

A script that calls :func:`helpers.serve_debug_requests` in each rank has a small
HTTP server per rank, on loopback (see that module). From the notebook, with the handle of a
run started by :func:`helpers.launch_in_background`:

    rank_stacks(job)        every rank's Python stacks now, one row per frame
    where_ranks_are(job)    one row per rank: the line of the script it is on now
    profile_ranks(job, 2)   a 2 s torch.profiler capture from every rank at once, loaded
                            with load_run (one trace per rank, one time axis)
    flight_records_now(job) every rank's Flight Recorder entries now, as load_flight_records
                            gives them
    wait_counters(job)      PyTorch's wait counters of every rank (time spent waiting, by kind)
    listening_sockets(job)  every socket a process of the job listens on, and whether it is
                            on loopback

Every rank is asked at the same time (one thread per rank). What each question returns is
kept in the run folder, ``live/<NN>-<question>/``: the profiles are trace files that Perfetto
opens; in recorded mode the answers are read back from there, in the same order.
A rank that does not answer within ``timeout`` seconds, a server that is not up, or a run
that has ended are each a :class:`LiveRunError` that says which.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd

from .._files import write_atomically
from ..hangs.flight_recorder import load_flight_records
from ..hangs.stacks import STACK_COLUMNS, lines_in_script, stack_frames
from ..jobs.background import BackgroundRun
from ..jobs.listeners import Listener, listeners_of_run
from ..traces.load import RunTraces, load_run
from .debug_server import SERVERS_FOLDER, ask_server

__all__ = [
    "LiveRunError",
    "debug_servers",
    "rank_stacks",
    "where_ranks_are",
    "profile_ranks",
    "flight_records_now",
    "wait_counters",
    "listening_sockets",
    "saved_answers",
    "saved_stacks",
    "lines_in_script",
]

LIVE_FOLDER = "live"  # in the run folder: one subfolder per question asked
STACKS_FILE = "stacks.json"  # in a stacks answer's folder: the frames, as rank_stacks returns
MAX_ANSWER_MB = 512  # an answer larger than this is refused (a 2 s profile is a few MB)
_asked: dict[Path, int] = {}  # questions asked of each run folder so far (recorded mode)


class LiveRunError(RuntimeError):
    """A question to a running job that got no usable answer; the message says why."""


def debug_servers(job: BackgroundRun, wait: float = 30.0) -> pd.DataFrame:
    """The debug server of every rank (rows: rank; columns ``address``, ``pid``), once all
    ``world_size`` ranks have written their address (waiting up to ``wait`` s for them)."""
    folder, world = job.run_dir, job.record.world_size
    deadline = time.monotonic() + (0 if job.replayed else wait)
    while True:
        found = {}
        for path in folder.rglob(f"{SERVERS_FOLDER}/rank*.json"):
            entry = _server_entry(path)
            found[entry["rank"]] = entry
        if len(found) >= world or time.monotonic() > deadline:
            break
        if not job.running:
            raise LiveRunError(_ended(job, "before every rank started its debug server"))
        time.sleep(0.1)
    missing = sorted(set(range(world)) - set(found))
    if missing:
        raise LiveRunError(
            f"run {job.record.relative_dir()}: no debug server address from rank(s) {missing} "
            f"after {wait:g} s; does the script call serve_debug_requests() in every rank?"
        )
    table = pd.DataFrame([found[r] for r in sorted(found)]).set_index("rank")
    return table[["address", "pid"]]


def _server_entry(path: Path) -> dict:
    """One rank's ``debug_server/rank<N>.json``: its rank, an ``http://`` address and its pid;
    a LiveRunError naming the file when it is anything else."""
    try:
        entry = json.loads(path.read_text())
        entry = {"rank": int(entry["rank"]), "address": entry["address"], "pid": entry["pid"]}
        if not re.fullmatch(r"http://[\w.:\[\]-]+", entry["address"]):
            raise ValueError(f"address {entry['address']!r} is not http://host:port")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise LiveRunError(
            f"{path}: not a debug server's address file ({err}); serve_debug_requests() writes "
            f"these: remove the file or start the run again"
        ) from None
    return entry


def _ended(job: BackgroundRun, what: str) -> str:
    return (
        f"run {job.record.relative_dir()} has ended ({job.record.status}) {what}: a running "
        f"job's servers are gone with it; start it again with launch_in_background()"
    )


def saved_answers(job: BackgroundRun, question: str) -> list[Path]:
    """The folders keeping the answers to ``question`` (``stacks``, ``profile``, ``flight``,
    ``wait-counters``, ``sockets``) asked of this job so far, oldest first."""
    found = (job.run_dir / LIVE_FOLDER).glob(f"[0-9]*-{question}")
    return sorted(found, key=lambda folder: int(folder.name.split("-", 1)[0]))


def _answer_folder(job: BackgroundRun, question: str) -> Path:
    """The folder keeping this question's answers: ``live/<NN>-<question>``, NN counting the
    questions asked of this run (in recorded mode: the recorded answer of the same number)."""
    number = _asked.get(job.run_dir, 0) + 1
    _asked[job.run_dir] = number
    folder = job.run_dir / LIVE_FOLDER / f"{number:02d}-{question}"
    if job.replayed and not folder.is_dir():
        raise LiveRunError(
            f"recorded mode: the recording of {job.record.relative_dir()} has no answer "
            f"{folder.name}: the notebook asked other questions, in another order, than when "
            f"it was recorded; run it from the top, or live (use_recorded_runs(False))"
        )
    return folder


def _post(address: str, handler: str, timeout: float) -> bytes:
    """POST ``/handler/<handler>`` to one rank's server; its answer (bounded in size)."""
    body = ask_server(address, handler, timeout, int(MAX_ANSWER_MB * 2**20))
    if body is None:
        raise LiveRunError(f"{address}: answer to {handler} over {MAX_ANSWER_MB} MB: refused")
    return body


def _ask_every_rank(job: BackgroundRun, handler: str, timeout: float) -> dict[int, bytes]:
    """``{rank: answer}`` to ``handler`` from every rank's server, all asked at once; a
    LiveRunError naming the ranks that did not answer, and why."""
    if not job.running:
        raise LiveRunError(_ended(job, "before the question " + handler.split("?")[0]))
    servers = debug_servers(job)

    def ask(rank: int) -> bytes | str:
        try:
            return _post(servers.at[rank, "address"], handler, timeout)
        except (OSError, http.client.HTTPException, LiveRunError) as err:  # URLError too
            return f"rank {rank} ({servers.at[rank, 'address']}): {getattr(err, 'reason', err)}"

    with ThreadPoolExecutor(max_workers=len(servers)) as pool:
        answers = dict(zip(servers.index, pool.map(ask, servers.index)))
    failed = [why for why in answers.values() if isinstance(why, str)]
    if failed:
        state = "" if job.running else f" The run has ended ({job.record.status})."
        raise LiveRunError(
            f"{len(failed)} of {len(answers)} ranks gave no answer to {handler} within "
            f"{timeout:g} s:\n  " + "\n  ".join(failed) + state
        )
    return answers


def rank_stacks(job: BackgroundRun, timeout: float = 10.0) -> pd.DataFrame:
    """Every rank's Python stacks now, one row per frame: ``rank, thread, depth`` (0: the
    innermost call), ``file, line, function`` and ``code`` (the line's text)."""
    folder = _answer_folder(job, "stacks")
    if not job.replayed:
        answers = _ask_every_rank(job, "dump_traceback", timeout)
        rows = [row for rank, text in answers.items() for row in stack_frames(rank, text.decode())]
        write_atomically(folder / STACKS_FILE, json.dumps(rows))
    return saved_stacks(folder)


def saved_stacks(folder: Path) -> pd.DataFrame:
    """The stacks that :func:`rank_stacks` kept in ``folder`` (one of
    ``saved_answers(job, "stacks")``), as it returned them."""
    return pd.DataFrame(json.loads((folder / STACKS_FILE).read_text()), columns=STACK_COLUMNS)


def where_ranks_are(job: BackgroundRun, timeout: float = 10.0) -> pd.DataFrame:
    """One row per rank: the line of the run's script it is on now (:func:`lines_in_script`),
    with the function and the line's text."""
    here = lines_in_script(rank_stacks(job, timeout), job.record.script)
    return here.reindex(range(job.record.world_size))


def profile_ranks(job: BackgroundRun, seconds: float = 2.0, timeout: float = 60.0) -> RunTraces:
    """A ``torch.profiler`` capture of ``seconds`` from every rank at the same moment, loaded
    with :func:`helpers.load_run` (one trace per rank, one time axis). The trace files stay
    in ``live/<NN>-profile/`` (open them in Perfetto)."""
    folder = _answer_folder(job, "profile")
    if not job.replayed:
        answers = _ask_every_rank(job, f"torch_profile?duration={seconds:g}", seconds + timeout)
        for rank, trace in answers.items():
            write_atomically(folder / f"rank{rank}_live.json", trace)
    return load_run(folder, expect_ranks=range(job.record.world_size))


def flight_records_now(job: BackgroundRun, timeout: float = 10.0) -> pd.DataFrame:
    """Every rank's Flight Recorder entries now, as JSON (no pickle), in the DataFrame that
    :func:`helpers.load_flight_records` gives. The dumps stay in ``live/<NN>-flight/``."""
    folder = _answer_folder(job, "flight")
    if not job.replayed:
        for rank, dump in _ask_every_rank(job, "fr_trace_json", timeout).items():
            write_atomically(folder / f"fr_{rank}", dump)
    return load_flight_records(folder, expect_ranks=range(job.record.world_size))


def wait_counters(job: BackgroundRun, timeout: float = 10.0) -> pd.DataFrame:
    """PyTorch's wait counters of every rank now: one row per rank and counter (``counter``,
    ``calls``, ``total_ms``, ``max_ms``, ``active``: waits going on at this moment)."""
    folder = _answer_folder(job, "wait-counters")
    saved = folder / "wait_counters.json"
    if not job.replayed:
        answers = _ask_every_rank(job, "wait_counter_values", timeout)
        write_atomically(saved, json.dumps({r: json.loads(a) for r, a in answers.items()}))
    rows = [
        dict(rank=int(rank), counter=name.removeprefix("pytorch.wait_counter."),
             calls=v["total_calls"], total_ms=v["total_time_us"] / 1e3,
             max_ms=v["max_time_us"] / 1e3, active=v["active_count"])
        for rank, counters in json.loads(saved.read_text()).items()
        for name, v in counters.items()
    ]  # fmt: skip
    return pd.DataFrame(rows).sort_values(["rank", "counter"], ignore_index=True)


def listening_sockets(job: BackgroundRun) -> pd.DataFrame:
    """Every TCP socket a process of the job listens on now, from the system's socket table:
    ``process`` (``rank`` or ``torchrun agent``), ``pid``, ``address, port`` and ``loopback``."""
    folder = _answer_folder(job, "sockets")
    saved = folder / "sockets.json"
    if not job.replayed:
        if not job.running:
            raise LiveRunError(_ended(job, "before its sockets were listed"))
        found = [dataclasses.asdict(s) for s in listeners_of_run(job.record.run_id)]
        write_atomically(saved, json.dumps(found))
    listeners = [Listener(**row) for row in json.loads(saved.read_text())]
    table = pd.DataFrame(
        [dict(dataclasses.asdict(s), loopback=s.loopback) for s in listeners],
        columns=["process", "pid", "address", "port", "loopback"],
    )
    return table.sort_values(["process", "pid", "port"], ignore_index=True)
