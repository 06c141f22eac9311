"""A CUDA memory snapshot read safely: the blocks of the caching allocator, where its reserved
memory went, the learner's line that allocated each, and every hostile or damaged file refused
with its name.

The snapshot here is built in the shape that ``torch.cuda.memory._snapshot``'s docstring gives
(the installed torch's), with the frames a recorded history holds: C++ first, then torch's
Python, then the learner's, so that each case is small and known. Real snapshots, recorded on an
H200, are read in ``test_gpu_memory.py``.
"""

from __future__ import annotations

import json
import pickle

import pytest

from helpers import TraceError, load_memory_snapshot, snapshot_summary
from helpers.traces import snapshot as snapshot_module

MIB = 2**20
TRAIN = "/srv/job/train.py"


def frames(line: int) -> list[dict]:
    """A recorded stack: C++, torch's Python, then the learner's line, innermost first."""
    return [
        {"filename": "??", "line": 0, "name": "c10::cuda::CUDACachingAllocator::malloc"},
        {"filename": "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py",
         "line": 134, "name": "forward"},
        {"filename": TRAIN, "line": line, "name": "forward"},
        {"filename": TRAIN, "line": 90, "name": "main"},
    ]  # fmt: skip


def block(address: int, mib: float, state: str, line: int | None = None, asked=None) -> dict:
    size = int(mib * MIB)
    return {
        "address": address,
        "size": size,
        "requested_size": size if asked is None else int(asked * MIB),
        "state": state,
        "frames": frames(line) if line else [],
    }


def a_snapshot() -> dict:
    """Two segments on GPU 0 (20 and 2 MiB) and one on GPU 1 (2 MiB): 12.5 MiB in use (0.5 of
    it rounding), 1 MiB awaiting another stream, 8.5 MiB free in pieces of at most 6 MiB."""
    big = 0x7F0000000000
    return {
        "segments": [
            {"device": 0, "address": big, "total_size": 20 * MIB, "stream": 0,
             "segment_type": "large", "segment_pool_id": (0, 0), "blocks": [
                 block(big, 8, "active_allocated", line=37, asked=7.5),
                 block(big + 8 * MIB, 6, "inactive"),
                 block(big + 14 * MIB, 4, "active_allocated", line=52),
                 block(big + 18 * MIB, 2, "inactive"),
             ]},
            {"device": 0, "address": big + 64 * MIB, "total_size": 2 * MIB, "stream": 7,
             "segment_type": "small", "segment_pool_id": (0, 0), "blocks": [
                 block(big + 64 * MIB, 1, "active_awaiting_free"),
                 block(big + 65 * MIB, 0.5, "active_allocated"),
                 block(big + 65.5 * MIB, 0.5, "inactive"),
             ]},
            {"device": 1, "address": big, "total_size": 2 * MIB, "stream": 0,
             "segment_type": "small", "segment_pool_id": (0, 0), "blocks": []},
        ],
        "device_traces": [[{"action": "alloc", "addr": big, "size": 8 * MIB, "stream": 0,
                            "frames": frames(37)}], []],
    }  # fmt: skip


@pytest.fixture
def snapshot_file(tmp_path):
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(a_snapshot()))
    return path


def test_each_block_is_a_row_with_its_segment_state_and_size(snapshot_file):
    blocks = load_memory_snapshot(snapshot_file)
    assert len(blocks) == 8  # seven blocks, and a segment without blocks
    assert blocks.groupby("state")["bytes"].sum().to_dict() == {
        "active_allocated": int(12.5 * MIB),
        "active_awaiting_free": 1 * MIB,
        "inactive": int(10.5 * MIB),
    }
    assert blocks.groupby("device")["segment"].nunique().to_dict() == {0: 2, 1: 1}


def test_each_block_names_the_learners_innermost_line_past_cpp_and_torch(snapshot_file):
    blocks = load_memory_snapshot(snapshot_file)
    used = blocks[blocks["state"] == "active_allocated"]
    assert used["line"].tolist()[:2] == [f"{TRAIN}:37", f"{TRAIN}:52"]
    assert used["line"].isna().tolist() == [False, False, True]  # no history recorded
    assert used["frames"].tolist() == [4, 4, 0]


def test_the_summary_says_where_the_reserved_memory_went(snapshot_file):
    summary = snapshot_summary(load_memory_snapshot(snapshot_file)).set_index("device")
    assert summary.loc[0].to_dict() == {
        "reserved_mib": 22.0,
        "allocated_mib": 12.5,
        "rounding_mib": 0.5,
        "awaiting_mib": 1.0,
        "cached_free_mib": 8.5,
        "largest_free_mib": 6.0,
        "segments": 2,
    }
    assert summary.loc[1, "cached_free_mib"] == summary.loc[1, "reserved_mib"] == 2.0


def test_a_snapshot_written_as_json_reads_the_same(tmp_path, snapshot_file):
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps(a_snapshot()))
    assert load_memory_snapshot(path).equals(load_memory_snapshot(snapshot_file))


class Planted:
    """What a hostile snapshot would run when ``pickle.load`` read it: it writes a file."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_a_snapshot_that_would_run_code_is_refused_and_runs_nothing(tmp_path):
    planted = tmp_path / "planted"
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "x": Planted(planted)}))
    with pytest.raises(TraceError, match="refusing to load.*a CUDA memory snapshot") as caught:
        load_memory_snapshot(path)
    assert caught.value.path == path and not planted.exists()


@pytest.mark.parametrize(
    "data, problem",
    [
        (pickle.dumps(a_snapshot())[:200], "not a complete CUDA memory snapshot"),
        (b"", "is empty"),
        (pickle.dumps(["not", "a", "snapshot"]), "has no 'segments' list"),
        (pickle.dumps({"segments": [{"address": 1}]}), "a segment or block of the wrong shape"),
        (
            pickle.dumps({"segments": [{"address": 0, "total_size": 2, "blocks": [
                {"address": 0, "size": 2, "state": "os.system"}]}]}),
            "a block's state is 'os.system'",
        ),
        (b'{"segments": ' + b"[" * 100 + b"]" * 100 + b"}", "nests deeper than 12 levels"),
    ],
    ids=["truncated", "empty", "a list", "a segment without sizes", "an unknown state", "nested 100 deep"],
)  # fmt: skip
def test_a_file_that_is_not_a_snapshot_is_an_error_naming_it(tmp_path, data, problem):
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(data)
    with pytest.raises(TraceError, match=problem) as caught:
        load_memory_snapshot(path)
    assert caught.value.path == path


def test_a_snapshot_larger_than_the_bound_is_refused_saying_what_to_raise(
    snapshot_file, monkeypatch
):
    monkeypatch.setattr(snapshot_module, "MAX_SNAPSHOT_BYTES", 100)
    with pytest.raises(TraceError, match="larger than 100 bytes.*MAX_SNAPSHOT_BYTES"):
        load_memory_snapshot(snapshot_file)
