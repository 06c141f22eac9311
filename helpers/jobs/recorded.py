"""Recorded mode: replay real runs that ship with the series, for machines that cannot launch.

The folder ``recordings/`` holds runs that the lessons themselves made (``make record``),
each with its manifest, what its ranks printed, and its files (gzip-compressed). In recorded
mode every :func:`helpers.launch` call is answered by the recording made with the same
script, experiment, ranks, nodes and arguments: its files are copied into a new run folder
under ``traces/`` (decompressed, under their original names), its output is printed as it
was, and a run that failed raises the same error. Loading, analysis and plots then run
unchanged on real traces.

Switch it on with the environment variable ``PDP_RECORDED=1`` (for example
``make lab RECORDED=1``) or, in a running notebook, with :func:`use_recorded_runs`.
``PDP_RECORD=1`` does the opposite: every live launch is saved as a recording.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from .runs import (
    LOGS_DIR,
    REPO_ROOT,
    LaunchError,
    RankFailed,
    RendezvousTimedOut,
    RunInterrupted,
    RunRecord,
    RunTimedOut,
    new_run_dir,
    shorten_paths,
    show_path,
)

__all__ = [
    "RECORDINGS_ROOT",
    "RecordingMissing",
    "RecordingDamaged",
    "use_recorded_runs",
    "replaying",
    "recording",
    "replay",
    "save_recording",
    "recorded_traces",
]

#: Where runs are recorded and replayed from; ``PDP_RECORDINGS`` (relative to the repository)
#: moves it, as the GPU rehearsal does to ``recordings/gpu`` beside the CPU recordings.
RECORDINGS_ROOT = REPO_ROOT / os.environ.get("PDP_RECORDINGS", "recordings")
RECORDING_NAME = "recording.json"
_RUN_DIR_MARK = "{RUN_DIR}"  # stands for the run folder in a recorded error message
_switched: bool | None = None  # set by use_recorded_runs(); None: follow PDP_RECORDED


class RecordingMissing(LookupError):
    """Recorded mode was asked for a run that was never recorded."""


class RecordingDamaged(ValueError):
    """A recording that cannot be replayed as it is: a file outside its run folder, an error
    the launcher never raises. The message names the recording."""


# The errors a recording can replay: those the launcher raises.
_ERRORS = {
    c.__name__: c
    for c in (LaunchError, RankFailed, RendezvousTimedOut, RunInterrupted, RunTimedOut)
}

# Absolute paths of a machine, which a recording must not carry: a user's home (Linux, macOS,
# Windows), root's, and this project's development machine's. The test of every committed file
# looks for the same. (Written so that this source does not match itself.)
MACHINE_PATH = re.compile(
    r"(?<![\w.~-])(?:/(?:home|Users)/[^/\s\"'<>]+/|/(?:root|work)/)|\b[A-Za-z]:\\+Users\\+"
)


def use_recorded_runs(on: bool | None = True) -> None:
    """Replay recorded runs instead of launching (``False``: launch for real again;
    ``None``: follow the environment variable ``PDP_RECORDED`` again)."""
    global _switched
    _switched = on


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def replaying() -> bool:
    """True in recorded mode."""
    return _env_flag("PDP_RECORDED") if _switched is None else _switched


def recording() -> bool:
    """True when live launches are saved as recordings (``PDP_RECORD=1``)."""
    return _env_flag("PDP_RECORD") and not replaying()


def _key(
    script: str, experiment: str, nproc: int, nnodes: int, start_nodes: int, args: Sequence[str]
) -> dict:
    return {
        "script": script,
        "experiment": experiment,
        "nproc": nproc,
        "nnodes": nnodes,
        "start_nodes": start_nodes,
        "args": [str(a) for a in args],
    }


def _folder_name(key: dict) -> str:
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:8]
    return f"{key['experiment']}-{digest}"


def save_recording(
    record: RunRecord, echoed: list[tuple[int, str]], error: Exception | None, start_nodes: int
) -> Path:
    """Keep a finished live run as a recording: its files gzipped, its output, its error;
    no absolute path of this machine in any of them (see :func:`_portable`).

    Args:
        record: the run.
        echoed: the lines it printed, ``(rank, line)``, in order.
        error: what it raised (None: it ended well).
        start_nodes: the nodes it started (part of what a replay matches on).

    Returns:
        The recording's folder.
    """
    key = _key(
        record.script, record.experiment, record.nproc, record.nnodes, start_nodes, record.args
    )
    dest = RECORDINGS_ROOT / _folder_name(key)
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    files = []
    for rel in record.files:  # listed by record.save() when the run finished
        if LOGS_DIR in Path(rel).parts[:-1]:
            continue
        target = dest / "files" / (rel + ".gz")
        target.parent.mkdir(parents=True, exist_ok=True)
        data = (record.run_dir / rel).read_bytes()
        if rel.endswith((".json", ".txt")):  # traces name their own path (traceName), stacks files
            data = _portable(data.decode(errors="surrogateescape"), record).encode(
                errors="surrogateescape"
            )
        target.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
        files.append(rel)
    here = record.relative_dir()
    spec = None
    if error is not None:
        spec = {"type": type(error).__name__, "message": str(error).replace(here, _RUN_DIR_MARK)}
        for attr in ("rank", "exit_code", "last_lines"):
            if hasattr(error, attr):
                spec[attr] = getattr(error, attr)
    saved = {
        "key": key,
        "manifest": record.to_json(),
        "files": files,
        "error": spec,
        "output": {str(r): lines for r, lines in record.output.items()},
        "echoed": echoed,
    }
    (dest / RECORDING_NAME).write_text(json.dumps(_portable(saved, record), indent=1))
    return dest


def _portable(value: Any, record: RunRecord) -> Any:
    """``value`` (text, or JSON data) with no absolute path of this machine in it: the run's
    folder written as the repository shows it, paths inside the repository relative to it, the
    home folder as ``~``, and any other path of a user's (:data:`MACHINE_PATH`) as ``.../``."""
    if isinstance(value, dict):
        return {k: _portable(v, record) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_portable(v, record) for v in value]
    if not isinstance(value, str):
        return value
    for run_dir in {str(record.run_dir.resolve()), str(record.run_dir)}:
        value = value.replace(run_dir + os.sep, record.relative_dir() + "/")
        value = value.replace(run_dir, record.relative_dir())
    value = shorten_paths(value).replace(str(Path.home()) + os.sep, "~/")
    return MACHINE_PATH.sub(".../", value)


def _find(key: dict) -> Path:
    folder = RECORDINGS_ROOT / _folder_name(key)
    if (folder / RECORDING_NAME).is_file():
        return folder
    same = sorted(
        json.loads(p.read_text())["key"]["args"]
        for p in RECORDINGS_ROOT.glob(f"{key['experiment']}-*/{RECORDING_NAME}")
    )
    known = "; ".join(" ".join(a) or "(no arguments)" for a in same) or "none"
    raise RecordingMissing(
        f"recorded mode: no recording of {key['script']} with {key['nproc']} ranks per node on "
        f"{key['nnodes']} node(s) and arguments {key['args']} (experiment "
        f"{key['experiment']!r}; recorded arguments for it: {known}). Recorded mode replays "
        f"the lessons' own runs only: launch for real with use_recorded_runs(False)"
    )


def replay(
    script: Path,
    nproc: int,
    experiment: str,
    args: Sequence[str],
    nnodes: int,
    start_nodes: int,
    echo: bool,
    traces_root: str | Path | None,
) -> RunRecord:
    """Answer a launch with its recording: a new run folder with the recorded files; the
    recorded output printed; the recorded error raised if the run failed.

    Args:
        script: the launched script; its name, with the next five, picks the recording.
        nproc: ranks per node.
        experiment: the run's folder under ``traces/``.
        args: the script's arguments.
        nnodes: nodes.
        start_nodes: nodes started.
        echo: print the recorded output as the run printed it.
        traces_root: the folder to use instead of ``traces/`` (None: ``traces/``).

    Returns:
        The replayed run's :class:`RunRecord`, in its new folder.

    Raises:
        RecordingMissing: no recording of this launch.
        RecordingDamaged: a recording that cannot be replayed.
        RankFailed, RunTimedOut...: the recorded run's own error, when it failed.
    """
    source = _find(_key(script.name, experiment, nproc, nnodes, start_nodes, args))
    saved = json.loads((source / RECORDING_NAME).read_text())
    files = [_inside_run(rel, source) for rel in saved["files"]]
    if saved["error"] and saved["error"].get("type") not in _ERRORS:
        raise RecordingDamaged(
            f"{show_path(source / RECORDING_NAME)}: error type {saved['error'].get('type')!r} is "
            f"not one the launcher raises ({', '.join(_ERRORS)}): the recording is damaged; "
            f"record the run again (make record)"
        )
    run_id, run_dir = new_run_dir(experiment, traces_root)
    for rel in files:
        target = run_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(gzip.decompress((source / "files" / (rel + ".gz")).read_bytes()))
    record = RunRecord.from_json(
        dict(saved["manifest"], run_id=run_id, replayed_from=source.name), run_dir
    )
    record.output = {int(r): lines for r, lines in saved["output"].items()}
    record.save()
    if echo:
        print(f"replaying a recorded run of {record.describe()}", flush=True)
        for rank, line in saved["echoed"]:
            print(f"[rank{rank}] {line}", flush=True)
    if saved["error"]:
        raise _recorded_error(saved["error"], record)
    return record


def _inside_run(rel: Any, recording: Path) -> str:
    """``rel``, a file of a recording, checked to name a path inside the run folder (and its
    copy inside the recording): relative, with no ``..``; else :class:`RecordingDamaged`."""
    path = PurePosixPath(rel) if isinstance(rel, str) else None
    copy = (recording / "files" / f"{rel}.gz").resolve() if path else None
    if (
        path is None
        or not rel
        or path.is_absolute()
        or ".." in path.parts
        or "\\" in rel
        or re.match(r"[A-Za-z]:", rel)
        or not copy.is_relative_to(recording.resolve())
    ):
        raise RecordingDamaged(
            f"{show_path(recording / RECORDING_NAME)}: file {rel!r} is not a path inside the run "
            f"folder (relative, without '..'): the recording is damaged or was edited; replay "
            f"refuses to write outside the run folder. Record the run again (make record)"
        )
    return rel


def _recorded_error(spec: dict, record: RunRecord) -> Exception:
    cls = _ERRORS[spec["type"]]
    message = spec["message"].replace(_RUN_DIR_MARK, record.relative_dir())
    if "rank" in spec:
        return cls(message, record, spec["rank"], spec["exit_code"], spec["last_lines"])
    return cls(message, record)


def recorded_traces(experiment: str) -> Path:
    """The folder of trace files of the series' recorded run of ``experiment`` (for example
    ``"ddp-straggler"``, lesson 4's): traces to try a tool on without launching anything. A
    :class:`RecordingMissing` lists the experiments there are."""
    found = {}
    for path in sorted(RECORDINGS_ROOT.glob(f"*/{RECORDING_NAME}")):
        found.setdefault(json.loads(path.read_text())["key"]["experiment"], path.parent)
    if experiment not in found:
        raise RecordingMissing(f"no recorded run of {experiment!r}; recorded: {sorted(found)}")
    return found[experiment] / "files"
