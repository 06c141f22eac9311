"""Fuzzing the Flight Recorder reader (issue 19): real dumps that PyTorch wrote for lesson 8's
recordings, truncated, with bytes flipped, fields of other types, values nested deep, numbers
enlarged, shared references that expand, as pickles and as JSON. Whatever the input,
``load_flight_records`` either loads it or raises FlightRecorderError, never anything else,
within seconds and a bounded amount of memory.

Reproducible: Hypothesis draws the same examples on every run (``derandomize``, no example
database)."""

from __future__ import annotations

import gzip
import io
import json
import pickle
import struct
import time
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pytest
from fuzz_limits import address_space
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from helpers.hangs.flight_recorder import FlightRecorderError, load_flight_records

REPO = Path(__file__).resolve().parents[1]
RECORDED = REPO / "recordings" / "hang-8705b05d" / "files"  # a real 2-rank gloo hang
SECONDS = 10  # it may walk MAX_DUMP_ITEMS values: ~1 s, more on a busy machine
MiB = 1024**2
PLACEHOLDER = "@@fuzz@@"

FUZZ = settings(
    database=None,
    derandomize=True,
    deadline=timedelta(seconds=SECONDS),
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,  # tmp_path: one folder, rewritten per input
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


class _PlainData(pickle.Unpickler):
    """Reads the recorded dumps as plain data (no class, no function: nothing runs)."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing {module}.{name}")


def recorded_dumps() -> list[tuple[bytes, dict]]:
    """The recorded dumps, each as pickle bytes and as the plain data they hold. Lesson 8's
    hang.py writes PyTorch's JSON dump (older recordings hold PyTorch's pickle): the pickle
    of a JSON dump is made here from its data."""
    out = []
    for rank in (0, 1):
        data = gzip.decompress((RECORDED / f"fr_{rank}.gz").read_bytes())
        if data.lstrip()[:1] == b"{":
            plain = json.loads(data)
            out.append((pickle.dumps(plain), plain))
        else:
            out.append((data, _PlainData(io.BytesIO(data)).load()))
    return out


#: JSON numbers and pickled values beyond int64, beyond a double, or on their edges.
BIG_INTS = [2**63 - 1, 2**63, 2**64, 2**70, -(2**63) - 1, 10**400]
BIG_FLOATS = [float("inf"), float("-inf"), float("nan"), 1.7976931348623157e308, -0.0]
ENTRY_KEYS = [
    "collective_seq_id",
    "profiling_name",
    "time_created_ns",
    "input_sizes",
    "output_sizes",
    "input_dtypes",
    "process_group",
    "state",
    "retired",
    "is_p2p",
]
TOP_KEYS = ["entries", "version", "pg_config", "pg_status"]

plain_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.binary(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def deep_list_pickle(depth: int) -> bytes:
    """Pickle opcodes (protocol 2, no framing) that build lists nested ``depth`` deep without
    recursion: ``depth`` empty lists, each appended to the one below."""
    return b"]" * depth + b"a" * (depth - 1)


def shared_references(levels: int) -> list:
    """A list of two references to a list of two references ... : a few bytes pickled,
    ``2**levels`` values for a reader that walks it."""
    value: list = [0]
    for _ in range(levels):
        value = [value, value]
    return value


@st.composite
def hostile_dumps(draw, seeds: list[tuple[bytes, dict]]) -> bytes:
    """The bytes of a dump: a recorded one, changed in one way, as a pickle or as JSON, and
    maybe damaged after."""
    original, dump = draw(st.sampled_from(seeds))
    change = draw(st.sampled_from(["none", "retype", "enlarge", "nest", "shared", "json"]))
    if change == "none":
        data = original
    else:
        dump = dict(dump, entries=[dict(e) for e in dump["entries"]])
        if draw(st.booleans()) and dump["entries"]:
            container = dump["entries"][draw(st.integers(0, len(dump["entries"]) - 1))]
            key = draw(st.sampled_from(ENTRY_KEYS))
        else:
            container, key = dump, draw(st.sampled_from(TOP_KEYS))
        as_json = change == "json" or draw(st.integers(0, 3)) == 0
        splice = None
        if change == "retype":
            container[key] = draw(plain_values)
        elif change == "enlarge":
            container[key] = draw(st.sampled_from(BIG_INTS + ([] if as_json else BIG_FLOATS)))
        elif change == "nest":
            depth = draw(st.sampled_from([10, 33, 100, 1000, 100_000]))
            container[key] = PLACEHOLDER
            splice = ("[" * depth + "]" * depth).encode() if as_json else deep_list_pickle(depth)
        elif change == "shared":
            container[key] = shared_references(draw(st.sampled_from([10, 20, 40, 60])))
            as_json = False  # JSON cannot share; written out, it would be 2**levels long
        if as_json:
            text = json.dumps(dump, default=repr)
            if splice is not None:
                text = text.replace(json.dumps(PLACEHOLDER), splice.decode())
            data = text.encode()
        else:
            # protocol 4, as PyTorch writes; 2 (no frames, whose lengths a splice would break)
            data = pickle.dumps(dump, protocol=4 if splice is None else 2)
            if splice is not None:
                text = PLACEHOLDER.encode()
                marker = b"X" + struct.pack("<I", len(text)) + text  # BINUNICODE, protocol 2
                assert marker in data
                data = data.replace(marker, splice, 1)
    damage = draw(st.sampled_from(["none", "none", "truncate", "flip"]))
    if damage == "truncate":
        data = data[: draw(st.integers(0, len(data)))]
    elif damage == "flip" and data:
        data = bytearray(data)
        for _ in range(draw(st.integers(1, 6))):
            data[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
        data = bytes(data)
    return data


def _memory(key: str) -> int:
    """``VmRSS`` (now) or ``VmHWM`` (the peak) of this process, in bytes (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _reset_peak() -> bool:
    """Start a new peak of resident memory (Linux); False where that cannot be done."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def loads_or_refuses(folder: Path, size: int) -> pd.DataFrame | FlightRecorderError:
    """The records of ``folder``, or the FlightRecorderError saying why not; fails the test on
    any other exception, a read over SECONDS, resident memory growing by more than 64 MiB
    + 100x the input while it reads (measured where Linux lets a process reset its peak;
    tracemalloc would slow the reader's walk over millions of values tenfold), or an
    allocation of gigabytes (refused by an address-space limit, so the test fails instead of
    the machine running out of memory)."""
    measured = _reset_peak()
    before = _memory("VmRSS") if measured else 0
    t0 = time.perf_counter()
    try:
        with address_space():
            result = load_flight_records(folder)
    except FlightRecorderError as err:
        result = err
    assert time.perf_counter() - t0 < SECONDS
    assert "MemoryError" not in str(result), "the reader asked for gigabytes"
    if measured:
        assert _memory("VmHWM") - before < 64 * MiB + 100 * size
    return result


@pytest.fixture(scope="module")
def seeds() -> list[tuple[bytes, dict]]:
    if not RECORDED.is_dir():
        pytest.skip("the recorded Flight Recorder dumps are not here")
    return recorded_dumps()


@settings(FUZZ, max_examples=800)
@given(data=st.data())
def test_any_damaged_dump_loads_or_raises_a_flight_recorder_error(tmp_path, seeds, data):
    content = data.draw(hostile_dumps(seeds))
    (tmp_path / "fr_0").write_bytes(content)

    result = loads_or_refuses(tmp_path, len(content))

    event("loaded" if isinstance(result, pd.DataFrame) else result.problem[:40])
    if isinstance(result, FlightRecorderError):
        assert result.path == tmp_path / "fr_0" and result.rank == 0
    else:
        assert (result["rank"] == 0).all()


def test_a_memo_index_of_a_billion_is_refused_without_asking_for_the_memory(tmp_path):
    # Found by the test above: a flipped byte in a LONG_BINPUT. Python's unpickler grows its
    # memo table to the index it is given, about 15 GB here, from a 23-byte file.
    (tmp_path / "fr_0").write_bytes(
        b"\x80\x02}r" + struct.pack("<I", 963_741_210) + b"X\x07\x00\x00\x00entries]s."
    )

    result = loads_or_refuses(tmp_path, 23)

    assert isinstance(result, FlightRecorderError)
