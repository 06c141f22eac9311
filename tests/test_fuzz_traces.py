"""Fuzzing the trace loader (issue 19): real traces from other people's jobs and a generated
Kineto trace, truncated, with bytes flipped, fields of other types, values nested deep and
numbers enlarged, plain and gzip-compressed. Whatever the input, the loader either loads it
or raises TraceError, never anything else, within seconds and a bounded amount of memory.

Reproducible: Hypothesis draws the same examples on every run (``derandomize``, no example
database). The suite takes about a minute on two cores."""

from __future__ import annotations

import functools
import gzip
import json
import time
import tracemalloc
import warnings
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pytest
from fuzz_limits import address_space
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from helpers.traces import TraceError, load_run, load_trace, merge_traces

#: Real traces, each cut to its header and first events (their shapes, not their size).
REAL = [
    "cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    "rank_non_gpu/rank_non_gpu.json.gz",
    "trace_filter/sampled_rank-0.json.gz",
    "nccl_parser_config/nccl_data.json.gz",
    "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
]
EVENTS_KEPT = 300
SECONDS = 5  # the most one input may take (the machine is shared; a load takes ~20 ms)
MiB = 1024**2

FUZZ = settings(
    database=None,
    derandomize=True,
    deadline=timedelta(seconds=SECONDS),
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,  # the fixtures are factories and fixed paths
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)

PLACEHOLDER = "@@fuzz@@"
#: JSON numbers no double or int64 holds, and edge values of both.
BIG_NUMBERS = [
    "1e400",
    "-1e400",
    "1e-400",
    "1" + "0" * 400,
    "-" + "9" * 30,
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551616",
    "1180591620717411303424",
    "1.7976931348623157e308",
    "4.9e-324",
    "-0.0",
    "2147483648",
]
EVENT_KEYS = ["ph", "name", "cat", "pid", "tid", "ts", "dur", "args", "id"]
ARG_KEYS = [
    "Input Dims",
    "stream",
    "correlation",
    "External id",
    "Collective name",
    "name",
    "In msg nelems",
    "dtype",
    "Group size",
    "Seq",
    "Process Group Name",
]
HEADER_KEYS = ["distributedInfo", "baseTimeNanoseconds", "schemaVersion", "traceEvents"]
INFO_KEYS = ["rank", "world_size", "backend", "pg_config"]
MERGED_KEYS = ["mergedRanks", "world_size", "backend"]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


@functools.cache
def _excerpt(path: Path) -> dict:
    doc = json.loads(gzip.decompress(path.read_bytes()))
    doc["traceEvents"] = doc["traceEvents"][:EVENTS_KEPT]
    return doc


@pytest.fixture
def seeds(real_traces, kineto) -> list[dict]:
    """The documents every input is made from: excerpts of the real traces, a generated
    Kineto trace of a gloo rank, and a merged trace of two ranks (as merge_traces writes)."""
    generated = kineto(1, world=2, steps=3)
    merged = {
        "mergedRanks": [0, 1],
        "world_size": 2,
        "backend": "gloo",
        "baseTimeNanoseconds": 1_700_000_000_000_000_000,
        "traceEvents": [dict(e, pid=r) for r in (0, 1) for e in kineto(r)["traceEvents"]],
    }
    return [_excerpt(real_traces / "hta" / name) for name in REAL] + [generated, merged]


def _field(draw, doc: dict) -> tuple[dict, list, str]:
    """A copy of ``doc`` (shallow, but new along the path to the field) and the container and
    key of one field chosen in it: an event's, its args', the header's or distributedInfo's."""
    doc = dict(doc)
    where = draw(st.sampled_from(["event", "args", "header", "info", "merged"]))
    events = doc["traceEvents"] = list(doc.get("traceEvents") or [{}])
    if where in ("event", "args") and events:
        i = draw(st.integers(0, len(events) - 1))
        event = events[i] = dict(events[i]) if isinstance(events[i], dict) else {}
        if where == "event":
            return doc, event, draw(st.sampled_from(EVENT_KEYS))
        args = event["args"] = dict(event["args"]) if isinstance(event.get("args"), dict) else {}
        return doc, args, draw(st.sampled_from(ARG_KEYS))
    if where == "info":
        info = doc["distributedInfo"] = dict(doc.get("distributedInfo") or {})
        return doc, info, draw(st.sampled_from(INFO_KEYS))
    if where == "merged":
        return doc, doc, draw(st.sampled_from(MERGED_KEYS))
    return doc, doc, draw(st.sampled_from(HEADER_KEYS))


@st.composite
def hostile_files(draw, seeds: list[dict]) -> tuple[str, bytes]:
    """``(file name, its bytes)``: a seed document, changed in one way, written as JSON (in
    either form: an object, or the bare array of events) or gzip, and maybe damaged after."""
    doc = draw(st.sampled_from(seeds))
    change = draw(
        st.sampled_from(["none", "retype", "retype", "enlarge", "enlarge", "nest", "bare"])
    )
    raw = None  # JSON text to put in place of the placeholder
    if change in ("retype", "enlarge", "nest"):
        doc, container, key = _field(draw, doc)
        if change == "retype":
            container[key] = draw(json_values)
        else:
            container[key] = PLACEHOLDER
            if change == "enlarge":
                raw = draw(st.sampled_from(BIG_NUMBERS))
            else:
                depth = draw(st.sampled_from([2, 10, 100, 500, 1000, 5000, 100_000]))
                opener = draw(st.sampled_from(["[", '{"a":']))
                raw = opener * depth + "1" + ("]" if opener == "[" else "}") * depth
    text = json.dumps(doc["traceEvents"] if change == "bare" else doc, separators=(",", ":"))
    if raw is not None:
        text = text.replace(json.dumps(PLACEHOLDER), raw)
    data = text.encode()
    compressed = draw(st.sampled_from([False, False, True]))
    if compressed:
        data = gzip.compress(data, compresslevel=1)
    damage = draw(st.sampled_from(["none", "none", "none", "truncate", "flip"]))
    if damage == "truncate":
        data = data[: draw(st.integers(0, len(data)))]
    elif damage == "flip":
        data = bytearray(data)
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(0, len(data) - 1))
            data[i] ^= draw(st.integers(1, 255))
        data = bytes(data)
    rank = draw(st.sampled_from(["rank3", "trace", "rank" + "9" * 25]))
    return rank + (".json.gz" if compressed else ".json"), data


def loads_or_refuses(load, size: int) -> object:
    """What ``load()`` returns, or the TraceError it raises; fails the test on any other
    exception, on a load that takes more than SECONDS, one whose peak memory passes 16 MiB +
    40x the input, or one that asks for gigabytes (refused by an address-space limit, so the
    test fails instead of the machine running out of memory)."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings(), address_space():
            warnings.simplefilter("ignore")  # TraceWarning: loaded, not exactly as written
            result = load()
    except TraceError as err:
        result = err
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert time.perf_counter() - t0 < SECONDS
    assert "out of memory" not in str(result), "the loader asked for gigabytes"
    assert peak < 16 * MiB + 40 * size
    return result


@settings(FUZZ, max_examples=1200)
@given(data=st.data())
def test_any_damaged_trace_loads_or_raises_a_trace_error(tmp_path, seeds, data):
    name, content = data.draw(hostile_files(seeds))
    path = tmp_path / name
    path.write_bytes(content)

    result = loads_or_refuses(lambda: load_trace(path), len(content))

    event("loaded" if not isinstance(result, TraceError) else result.problem[:30])
    if isinstance(result, TraceError):
        assert result.path == path and result.problem
    else:
        events = result.events
        assert events["start_us"].is_monotonic_increasing
        assert (events["dur_us"] >= 0).all()


@settings(FUZZ, max_examples=200)
@given(data=st.data())
def test_a_lenient_run_with_a_damaged_file_loads_the_good_one_or_says_why_not(
    tmp_path, seeds, kineto, write, data
):
    name, content = data.draw(hostile_files(seeds))
    for old in tmp_path.iterdir():
        old.unlink()
    write(tmp_path / "rank7.json", kineto(7, world=8, pid=700))  # a rank no seed claims
    (tmp_path / name).write_bytes(content)

    run = loads_or_refuses(
        lambda: load_run(tmp_path, strict=False, cache=False, same_run=False), len(content)
    )

    if not isinstance(run, TraceError):
        assert 7 in run.ranks
        loaded = {Path(h.path).name for h in run.headers}
        skipped = {p.name for p, _ in run.skipped}
        assert loaded | skipped == {p.name for p in tmp_path.iterdir()}


@settings(FUZZ, max_examples=100)
@given(data=st.data())
def test_merging_a_damaged_trace_that_loaded_writes_a_trace_or_raises_a_trace_error(
    tmp_path, seeds, data
):
    name, content = data.draw(hostile_files(seeds))
    path = tmp_path / name
    path.write_bytes(content)
    out = tmp_path / "out" / "merged.json"

    def merge():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run = load_run([path], cache=False, same_run=False)
        return merge_traces(run, out)

    result = loads_or_refuses(merge, len(content))

    if not isinstance(result, TraceError):
        json.loads(out.read_text())  # valid JSON, whatever went in


@settings(FUZZ, max_examples=50)
@given(
    cut=st.floats(0, 1),
    flips=st.lists(st.tuples(st.floats(0, 1), st.integers(1, 255)), max_size=6),
)
def test_a_damaged_cache_never_changes_what_a_load_returns(tmp_path, kineto, write, cut, flips):
    for rank in (0, 1):
        write(tmp_path / f"rank{rank}.json", kineto(rank, pid=100 + rank))
    fresh = load_run(tmp_path, cache=False).events
    load_run(tmp_path)  # writes the cache
    for cache in (tmp_path / ".cache").glob("events-*.npz"):
        data = bytearray(cache.read_bytes())
        data = data[: max(1, int(len(data) * cut))] if cut < 1 else data
        for where, bits in flips:
            data[min(int(where * len(data)), len(data) - 1)] ^= bits
        cache.write_bytes(bytes(data))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TraceWarning: the cache was damaged and is rebuilt
        again = load_run(tmp_path)

    pd.testing.assert_frame_equal(again.events, fresh)
