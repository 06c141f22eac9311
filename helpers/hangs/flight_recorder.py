"""Flight Recorder dumps: what each rank's collectives were when a job hung.

PyTorch's Flight Recorder keeps, in every process, a ring buffer of the last collectives its
process groups ran (``TORCH_FR_BUFFER_SIZE`` entries, 2000 by default): a sequence number per
group, the operation (``gloo:all_reduce``), the tensor sizes, a state and a time.
``torch._C._distributed_c10d._dump_fr_trace()`` returns it as a pickle; the lesson's script
writes it to ``RUN_DIR/fr_<rank>``. PyTorch's own dumps are named by ``TORCH_FR_DUMP_TEMP_FILE``
and the rank (``nccl_trace_rank_0``, torchtitan's ``rank_0``): a prefix and the rank, as PyTorch's
analyser (``python -m torch.distributed.flight_recorder.fr_trace``) reads them. Every function here
takes the prefix the files of a folder share, or ``prefix=``.

- :func:`load_flight_records` reads every rank's dump into one DataFrame (one row per
  collective per rank); every missing or damaged dump is a :class:`FlightRecorderError` naming
  the file and the rank.
- :func:`first_mismatch` (in ``groups``, here too) compares each process group's members'
  sequences and names the collective where they first disagree.
- :func:`analyse_with_pytorch` (in ``analyser``) runs PyTorch's analyser on the same dumps and
  reads its verdict.

A dump is a pickle (``_dump_fr_trace``) or JSON (``_dump_fr_trace_json``, the same entries;
prefer it: reading JSON cannot run code). A pickle can run any code when it is loaded with
``pickle.load``, which is what PyTorch's analyser does. So every public function here reads a
dump with the series' own reader (``helpers._plaindata``), and nothing else ever reads it:

- the file holds at most :data:`MAX_DUMP_BYTES`; a pickle's instructions are checked before
  it is loaded: anything that would import or call (a class, a function, ``__reduce__``) is
  refused, dictionary keys must be strings, memo indices must be ones a pickler writes, and
  there are at most :data:`MAX_DUMP_ITEMS` instructions making at most
  :data:`MAX_DUMP_CONTAINERS` lists, dicts and tuples (JSON: as many values and containers);
- what was loaded must be plain data (dicts, lists, tuples, strings, numbers, None) nested at
  most :data:`MAX_DUMP_DEPTH` deep, with at most :data:`MAX_DUMP_ITEMS` values counted as the
  analysis would see them (a value referred to twice counts twice: a small file of shared
  references cannot expand into billions);
- :func:`analyse_with_pytorch` hands PyTorch's analyser fresh copies of that plain data, written
  into a private temporary folder, never the files themselves.

Every dump that fails a check is a :class:`FlightRecorderError` naming the file, within seconds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from .._plaindata import Bounds, Refused, read_plain_data
from ..jobs.runs import show_path

__all__ = [
    "DUMP_PREFIX",
    "MAX_DUMP_BYTES",
    "MAX_DUMP_ITEMS",
    "MAX_DUMP_CONTAINERS",
    "MAX_DUMP_DEPTH",
    "FlightRecorderError",
    "load_flight_records",
]

DUMP_PREFIX = "fr_"  # this series names its dumps fr_<rank>
# A dump's name: a prefix then the rank, as PyTorch's analyser reads it (its loader's pattern,
# ranks without leading zeros). PyTorch writes the path in TORCH_FR_DUMP_TEMP_FILE followed by
# the rank: nccl_trace_rank_<rank> in its tutorial, rank_<rank> in torchtitan's comm_traces.
_DUMP_NAME = re.compile(r"^([\w\-]*?)(0|[1-9][0-9]{0,8})$")

# The bounds of a dump, read at each read (raise them for a larger dump you trust). Measured: a
# full buffer of 2,000 gloo collectives with 29-frame stack traces is a pickle of 0.35 MB and
# 192,000 instructions, holds 292,000 values and nests 5 deep; as JSON (no stack traces) it is
# 0.9 MB. Within these bounds the worst file we made took 2 s and 170 MB to refuse.
MAX_DUMP_BYTES = 64 * 2**20
MAX_DUMP_ITEMS = 2_000_000  # values, counting every reference (and a pickle's instructions)
MAX_DUMP_CONTAINERS = 250_000  # lists, dicts and tuples made (18,000 in the dump above)
MAX_DUMP_DEPTH = 32  # containers inside containers


class FlightRecorderError(ValueError):
    """A Flight Recorder dump that cannot be used. ``path`` and ``rank`` name it."""

    def __init__(self, path: str | Path | None, problem: str, rank: int | None = None):
        self.path = None if path is None else Path(path)
        self.rank = rank
        self.problem = problem
        where = show_path(self.path) if self.path is not None else ""
        if rank is not None:
            where = f"{where} (rank {rank})" if where else f"rank {rank}"
        super().__init__(f"{where}: {problem}" if where else problem)


def _bounds() -> Bounds:
    """The bounds of a dump as they are now (read at each read, so that raising them works)."""
    return Bounds(
        MAX_DUMP_BYTES, MAX_DUMP_ITEMS, MAX_DUMP_CONTAINERS, MAX_DUMP_DEPTH,
        what="a Flight Recorder dump", settings="helpers.hangs.flight_recorder.MAX_DUMP_",
    )  # fmt: skip


def read_dump(path: Path, bounds: Bounds) -> dict:
    """The plain data of the dump at ``path``, read safely (:mod:`helpers._plaindata`), or
    :class:`~helpers._plaindata.Refused` saying why not."""
    dump = read_plain_data(path, bounds)
    if isinstance(dump, dict) and "entries" not in dump and "version" in dump:
        dump["entries"] = []  # torch writes no entries list when the rank recorded nothing
    if not isinstance(dump, dict) or not isinstance(dump.get("entries"), list):
        raise Refused(
            "has no 'entries' list: not a dump of torch._C._distributed_c10d._dump_fr_trace()"
        )
    return dump


def _read_dump(path: Path, rank: int) -> dict:
    """One dump read safely (see the module's docstring): its plain data, or an error naming
    the file and the rank."""
    try:
        return read_dump(path, _bounds())
    except Refused as err:
        raise FlightRecorderError(path, str(err), rank) from None


def _int64(value: Any) -> int:
    """An integer field of an entry, which must fit the DataFrame's int64 column."""
    if not isinstance(value, int) or not -(2**63) <= value < 2**63:
        raise ValueError(f"{value!r:.40} is not a 64-bit integer")
    return value


def _rows(dump: dict, path: Path, rank: int) -> list[dict]:
    rows = []
    for entry in dump["entries"]:
        try:
            group = entry.get("process_group") or ("", "")
            p2p_seq = entry.get("p2p_seq_id")
            rows.append(
                {
                    "rank": rank,
                    "seq": _int64(entry["collective_seq_id"]),
                    "op": str(entry["profiling_name"]),
                    "collective": str(entry["profiling_name"]).split(":")[-1],
                    "input_sizes": str(entry.get("input_sizes")),
                    "output_sizes": str(entry.get("output_sizes")),
                    "dtypes": ",".join(entry.get("input_dtypes") or []),
                    "state": entry.get("state"),
                    "retired": entry.get("retired"),
                    "group": str(group[0]),
                    "group_desc": str(group[1]),
                    "p2p": bool(entry.get("is_p2p")),
                    "p2p_seq": _int64(p2p_seq) if p2p_seq is not None else 0,
                    "created_ns": _int64(entry["time_created_ns"]),
                }
            )
        except KeyError as err:
            raise FlightRecorderError(
                path, f"an entry lacks {err}: the dump is damaged", rank
            ) from None
        except (TypeError, ValueError, AttributeError, IndexError) as err:
            raise FlightRecorderError(
                path, f"an entry has a field of the wrong type ({err}): the dump is damaged", rank
            ) from None
    return rows


def _dump_paths(
    folder: str | Path, expect_ranks: Iterable[int] | None = None, prefix: str | None = None
) -> dict[int, Path]:
    """``{rank: path}`` of the dumps ``<prefix><rank>`` in ``folder``, by rank. Without
    ``prefix``, the one prefix the folder's names share (``fr_`` where that is one of several,
    as this series names them); an error naming the folder when there are no dumps, when
    several prefixes leave it unclear which files are dumps, or when a rank of ``expect_ranks``
    has none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FlightRecorderError(folder, "no such folder")
    by_prefix: dict[str, dict[int, Path]] = {}
    for p in sorted(folder.iterdir()):
        if p.is_file() and (m := _DUMP_NAME.match(p.name)):
            by_prefix.setdefault(m.group(1), {})[int(m.group(2))] = p
    if prefix is None and len(by_prefix) > 1 and DUMP_PREFIX not in by_prefix:
        raise FlightRecorderError(
            folder,
            f"files named with {len(by_prefix)} prefixes "
            f"({', '.join(repr(k) for k in sorted(by_prefix))}): say which names the "
            f"Flight Recorder dumps with prefix=",
        )
    if prefix is None:
        prefix = DUMP_PREFIX if len(by_prefix) != 1 else next(iter(by_prefix))
    dumps = by_prefix.get(prefix, {})
    missing = sorted(set(expect_ranks or ()) - set(dumps))
    if missing:
        raise FlightRecorderError(
            folder,
            f"no Flight Recorder dump from rank "
            f"{', '.join(map(str, missing))} ({prefix}<rank>): did "
            f"that rank die before it could write one?",
        )
    if not dumps:
        raise FlightRecorderError(
            folder,
            f"no Flight Recorder dumps ({prefix}<rank>) here: PyTorch names them "
            f"TORCH_FR_DUMP_TEMP_FILE followed by the rank; give that prefix with prefix=",
        )
    return dict(sorted(dumps.items()))


def load_flight_records(
    folder: str | Path, expect_ranks: Iterable[int] | None = None, prefix: str | None = None
) -> pd.DataFrame:
    """Every rank's dump in ``folder`` (files ``<prefix><rank>``: ``fr_0``, or PyTorch's
    ``nccl_trace_rank_0``; without ``prefix``, the one the names share) as one DataFrame, one
    row per collective per rank, sorted by rank and sequence number.

    Columns: ``rank, seq, op`` (``gloo:all_reduce``), ``collective`` (``all_reduce``),
    ``input_sizes, output_sizes, dtypes, state, retired``, ``group`` (the process group's name:
    ``"0"`` for the default one; each group numbers its collectives apart), ``group_desc``
    (``default_pg``, ``mesh_tp``), ``p2p, p2p_seq`` (a send or receive, numbered apart),
    ``created_ns`` and ``created_ms`` (ms since the earliest entry of any rank); each rank's
    rows in the order it issued them.
    ``records.attrs`` keeps ``ranks`` (every rank with a dump, an empty one too),
    ``members`` (the groups' ranks as the dumps list them) and ``progress`` (``{(rank, group):
    (enqueued, completed)}``, the last collective each group of an NCCL dump issued and the last
    it completed), for :func:`first_mismatch`, and ``dumps`` (the folder and the names' prefix).
    expect_ranks: ranks whose dump must be there; a missing one is an error naming it.
    Each dump is read safely (see the module's docstring).
    """
    return load_records_and_dumps(folder, expect_ranks, prefix)[0]


def load_records_and_dumps(
    folder: str | Path, expect_ranks: Iterable[int] | None, prefix: str | None
) -> tuple[pd.DataFrame, dict[int, dict]]:
    """:func:`load_flight_records`' frame, and each rank's dump as read."""
    rows, members, dumps, progress = [], {}, {}, {}
    paths = _dump_paths(folder, expect_ranks, prefix)
    for rank, path in paths.items():
        dump = dumps[rank] = _read_dump(path, rank)
        rows += (mine := _rows(dump, path, rank))
        for group, counts in _progress(dump).items():
            progress[(rank, group)] = counts
        for group, ranks in _listed_members(dump, {row["group"] for row in mine}).items():
            members.setdefault(group, set()).update(ranks)
    records = pd.DataFrame(
        rows,
        columns=[
            "rank",
            "seq",
            "op",
            "collective",
            "input_sizes",
            "output_sizes",
            "dtypes",
            "state",
            "retired",
            "group",
            "group_desc",
            "p2p",
            "p2p_seq",
            "created_ns",
        ],
    )
    records = records.sort_values("rank", kind="stable", ignore_index=True)  # each in its order
    records["created_ms"] = (records["created_ns"] - records["created_ns"].min()) / 1e6
    records.attrs["ranks"] = sorted(paths)
    records.attrs["members"] = {g: sorted(r) for g, r in members.items()}
    records.attrs["progress"] = progress
    first = next(iter(paths.items()))
    records.attrs["dumps"] = (str(Path(folder)), first[1].name[: -len(str(first[0]))])
    return records, dumps


def _progress(dump: dict) -> dict[str, tuple[int, int]]:
    """``{group: (enqueued, completed)}``: the sequence numbers of the last collective each group
    of an NCCL dump issued and the last its watchdog saw complete (its ``pg_status``). Empty for
    gloo's dumps: torch 2.14's gloo says a collective completed when it timed out, and its
    entries stay "scheduled". ``pg_status`` is keyed by a number local to the process
    (:func:`_groups_by_pg_id` ties it to a group)."""
    status = dump.get("pg_status")
    nccl = [str(e.get("profiling_name", "")).startswith("nccl:") for e in dump["entries"]]
    if not isinstance(status, dict) or not (any(nccl) or (not nccl and "nccl_version" in dump)):
        return {}
    named, found = _groups_by_pg_id(dump), {}
    for pg_id, counts in status.items():
        try:
            enqueued = int(counts["last_enqueued_collective"])
            completed = int(counts["last_completed_collective"])
        except (KeyError, TypeError, ValueError):
            continue  # an older dump without them: the entries' states say what they can
        if str(pg_id) in named:
            found[named[str(pg_id)]] = (enqueued, completed)
    return found


def _groups_by_pg_id(dump: dict) -> dict[str, str]:
    """``{pg_id: group}`` for the process numbers of a dump's ``pg_status``: from its entries
    (each names both); for the rest, where the groups of ``pg_config`` are named by number and
    are as many as ``pg_status``'s, the one in the same place of both in order, if that agrees
    with every pair the entries give. torch names a group it is given no name for by a counter
    of the groups made, and numbers the ones a process is in as it makes them, so both orders
    are the order of making (on NVIDIA's 16-GPU dumps it agrees with the entries on all 16
    ranks); a rank whose entries all completed then still says how far it got."""
    named = {
        str(e["pg_id"]): str((e.get("process_group") or ("",))[0])
        for e in dump["entries"]
        if e.get("pg_id") is not None
    }
    config, status = dump.get("pg_config"), dump.get("pg_status")
    names = [str(g) for g in config] if isinstance(config, dict) else []
    if not all(n.isdigit() for n in names) or len(names) != len(status):
        return named
    ids = [str(i) for i in status if str(i).lstrip("-").isdigit()]
    if len(ids) != len(names):
        return named
    in_order = dict(zip(sorted(ids, key=int), sorted(names, key=int)))
    return in_order if all(in_order.get(k) == v for k, v in named.items()) else named


def _listed_members(dump: dict, groups: set[str]) -> dict[str, list[int]]:
    """``{group: ranks}`` from the dump's ``pg_config``, for the groups its entries name (torch
    2.14's gloo dumps list a group named "" of the first new group's ranks, and not the groups
    their entries are in: that is ignored)."""
    listed = {}
    config = dump.get("pg_config")
    for name, group in config.items() if isinstance(config, dict) else ():
        try:
            ranks = json.loads(group["ranks"]) if isinstance(group, dict) else None
        except (KeyError, TypeError, ValueError):
            continue
        if (
            str(name) in groups
            and isinstance(ranks, list)
            and all(isinstance(r, int) for r in ranks)
        ):
            listed[str(name)] = ranks
    return listed
