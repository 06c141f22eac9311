"""Derive the excerpt of a real 16-GPU hang that lesson 13 reads (its section on a real job).

    python data/nvrx-hang/make_excerpt.py ../shared/real-traces/nvrx-fr

The source is test data of NVIDIA's nvidia-resiliency-ext (``tests/attribution/unit/fr_traces/
gpu_error_1st``, Apache-2.0): the NCCL Flight Recorder dumps (pickles, version 2.9) of the 16
ranks of a Megatron job with tensor, pipeline, expert and data parallel groups, in which a GPU
error was injected on ranks 12 and 14. Each dump is read with the series' safe reader (a pickle
is never loaded with ``pickle``) and written as JSON, the same entries PyTorch's
``_dump_nccl_trace_json`` writes. What is kept of each: every entry with the fields the analyses
read (its group, sequence numbers, operation, sizes, dtypes, state and times), unchanged;
``pg_config`` (each group's ranks), ``pg_status`` (how far each group got) and the versions.
Left out: the entries' thread names and ids.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from helpers.hangs.flight_recorder import _bounds, read_dump  # noqa: E402

CASE = "gpu_error_1st"
ENTRY = ("record_id", "pg_id", "process_group", "collective_seq_id", "p2p_seq_id", "op_id",
         "profiling_name", "time_created_ns", "input_sizes", "input_dtypes", "output_sizes",
         "output_dtypes", "state", "time_discovered_started_ns", "time_discovered_completed_ns",
         "retired", "timeout_ms", "is_p2p")  # fmt: skip


def excerpt(dump: dict) -> dict:
    entries = [{k: e[k] for k in ENTRY if k in e} for e in dump["entries"]]
    return {**dump, "entries": entries}


def main(source: Path) -> None:
    case = source / CASE
    for rank in range(16):
        dump = read_dump(case / f"_dump_{rank}", _bounds())
        (HERE / f"nccl_trace_rank_{rank}").write_text(
            json.dumps(excerpt(dump), separators=(",", ":")) + "\n"
        )
    for name in ("fault_injection.log", "reference.txt"):
        shutil.copyfile(case / name, HERE / name)
    shutil.copyfile(source / "LICENSE.txt", HERE / "LICENSE.txt")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
