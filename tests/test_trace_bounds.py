"""Hostile and damaged input to the trace loader (issue 19): every file ends in a loaded trace or
a TraceError that names it and says what to do, within seconds and bounded memory; the cache
and gathering stay inside their folders."""

from __future__ import annotations

import gzip
import json
import os
import time
import tracemalloc
import warnings
from pathlib import Path

import pandas as pd
import pytest

from helpers.traces import (
    TraceError,
    TraceWarning,
    gather_traces,
    load_run,
    load_trace,
    merge_traces,
)
from helpers.traces import _cache as tracecache

MiB = 1024**2


def json_with(doc: dict, old: str, new: str) -> str:
    """The JSON text of ``doc`` with one piece of text replaced (for values json cannot write)."""
    text = json.dumps(doc)
    assert text.count(old) >= 1, old
    return text.replace(old, new, 1)


def gzip_of_spaces(mib: int) -> bytes:
    """A valid trace's opening, ``mib`` MiB of spaces and its end, gzip-compressed (a
    decompression bomb: about 1,000x smaller than what it expands to). Built from repeated
    gzip members, which is quick and still one valid gzip file."""
    member = gzip.compress(b" " * MiB, compresslevel=9)
    return gzip.compress(b'{"traceEvents": [') + member * mib + gzip.compress(b"]}")


# ------------------------------------------------------------------ size limits


def test_a_gzip_bomb_is_refused_after_little_memory_and_time(tmp_path):
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip_of_spaces(600))  # 600 MiB once expanded, as in the issue
    assert path.stat().st_size < 1 * MiB

    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(TraceError, match=r"rank0.json.gz: expands more than 200x.*bomb"):
            load_trace(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - t0 < 5
    assert peak < 100 * MiB  # it stopped near 64 MiB, not at 600


def test_the_expansion_limit_can_be_raised_for_a_trusted_file(tmp_path, monkeypatch):
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip_of_spaces(80))
    monkeypatch.setenv("PDP_MAX_GZIP_RATIO", "100000")

    with pytest.raises(TraceError, match="holds no events"):  # read to its end this time
        load_trace(path)


@pytest.mark.parametrize(
    "name, said",
    [
        ("rank0.json", r"rank0.json: is 0.\d MiB, over the limit of 0.0 MiB"),
        ("rank0.json.gz", r"rank0.json.gz: decompresses to more than"),
    ],
    ids=["json", "json.gz, refused while decompressing"],
)
def test_a_trace_over_the_size_limit_names_the_limit_and_how_to_raise_it(
    name, said, tmp_path, kineto, write, monkeypatch
):
    path = write(tmp_path / name, kineto(0, steps=200))
    monkeypatch.setenv("PDP_MAX_TRACE_MB", "0.01")

    with pytest.raises(TraceError, match=said) as refused:
        load_trace(path)
    assert "PDP_MAX_TRACE_MB" in str(refused.value)


def test_raising_the_size_limit_loads_the_trace(tmp_path, kineto, write, monkeypatch):
    path = write(tmp_path / "rank0.json.gz", kineto(0, steps=200))
    monkeypatch.setenv("PDP_MAX_TRACE_MB", "1")

    assert len(load_trace(path).events) == 600


def test_a_size_limit_that_is_not_a_number_is_a_clear_error(tmp_path, kineto, write, monkeypatch):
    path = write(tmp_path / "rank0.json", kineto(0))
    monkeypatch.setenv("PDP_MAX_TRACE_MB", "lots")

    with pytest.raises(TraceError, match="PDP_MAX_TRACE_MB='lots' is not a positive number"):
        load_trace(path)


def test_a_gzip_file_of_several_members_loads_whole(tmp_path, kineto):
    text = json.dumps(kineto(0, steps=3)).encode()
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip.compress(text[:100]) + gzip.compress(text[100:]) + b"\0" * 8)

    assert len(load_trace(path).events) == 9


def test_gzip_data_after_the_end_that_is_not_gzip_is_broken_data(tmp_path, kineto):
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(gzip.compress(json.dumps(kineto(0)).encode()) + b"trailing junk")

    with pytest.raises(TraceError, match="rank0.json.gz: broken gzip data"):
        load_trace(path)


def test_a_gzip_file_with_a_wrong_checksum_is_broken_data(tmp_path, kineto):
    data = bytearray(gzip.compress(json.dumps(kineto(0)).encode()))
    data[-8] ^= 0xFF  # the CRC-32 of the content
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(bytes(data))

    with pytest.raises(TraceError, match="rank0.json.gz: broken gzip data"):
        load_trace(path)


# ----------------------------------------------------- integers, depth, numbers


def test_a_pid_beyond_64_bits_loads_as_text(tmp_path, kineto, write):
    doc = kineto(0)
    for e in doc["traceEvents"]:
        e["pid"] = 2**70

    trace = load_trace(write(tmp_path / "rank0.json", doc))

    assert set(trace.events["pid"].astype(str)) == {str(2**70)}
    assert len(trace.events) == 6


def test_a_rank_beyond_int32_in_distributed_info_says_to_pass_the_rank(tmp_path, kineto, write):
    doc = kineto(0)
    doc["distributedInfo"]["rank"] = 2**40
    path = write(tmp_path / "trace.json", doc)

    with pytest.raises(
        TraceError, match=r"trace.json: its distributedInfo says rank 1099511627776"
    ):
        load_trace(path)
    assert load_trace(path, rank=1).header.rank == 1


def test_a_negative_rank_in_distributed_info_is_refused(tmp_path, kineto, write):
    doc = kineto(0)
    doc["distributedInfo"]["rank"] = -3

    with pytest.raises(TraceError, match="says rank -3, which is no rank"):
        load_trace(write(tmp_path / "trace.json", doc))


def test_a_rank_in_the_file_name_longer_than_int64_says_to_rename_or_pass_it(
    tmp_path, kineto, write
):
    doc = kineto(0)
    del doc["distributedInfo"]
    path = write(tmp_path / f"rank{'9' * 30}.json", doc)

    with pytest.raises(TraceError, match="rank in its file name has more digits.*rename"):
        load_trace(path)
    assert load_run({2: path}).ranks == [2]


def test_a_file_named_with_an_overlong_rank_is_not_read_when_other_ranks_are_asked_for(
    tmp_path, kineto, write
):
    write(tmp_path / "rank0.json", kineto(0))
    (tmp_path / f"rank{'7' * 200}.json").write_text("not even JSON")

    assert load_run(tmp_path, ranks=[0], cache=False).ranks == [0]


def test_a_rank_argument_that_is_no_rank_is_refused(tmp_path, kineto, write):
    path = write(tmp_path / "trace.json", kineto(0))
    with pytest.raises(TraceError, match=r"trace.json: rank=1e\+20 is not a rank"):
        load_trace(path, rank=1e20)


def test_a_merged_trace_with_a_pid_that_is_not_a_rank_says_to_load_the_originals(
    tmp_path, kineto, write
):
    doc = kineto(0)
    doc["mergedRanks"] = [0]
    doc["traceEvents"][0]["pid"] = "abc"

    with pytest.raises(TraceError, match=r"merged.json: is a merged trace.*'abc'.*per-rank"):
        load_trace(write(tmp_path / "merged.json", doc))


def test_json_nested_a_thousand_deep_is_refused_quickly(tmp_path, kineto):
    path = tmp_path / "rank0.json"
    deep = "[" * 1000 + "]" * 1000
    path.write_text(json_with(kineto(0), '"traceEvents"', f'"deep": {deep}, "traceEvents"'))

    t0 = time.perf_counter()
    with pytest.raises(TraceError, match="rank0.json: its JSON is nested too deeply"):
        load_trace(path)
    assert time.perf_counter() - t0 < 2


def test_deep_nesting_inside_an_event_is_refused(tmp_path, kineto):
    doc = kineto(0)
    doc["traceEvents"][1]["args"]["Input Dims"] = "DEEP"
    path = tmp_path / "rank0.json"
    path.write_text(json_with(doc, '"DEEP"', "[" * 5000 + "]" * 5000))

    with pytest.raises(TraceError, match="rank0.json: its JSON is nested too deeply"):
        load_trace(path)


def test_a_number_beyond_a_double_is_named_with_where_it_is(tmp_path, kineto):
    path = tmp_path / "rank0.json"
    path.write_text(json_with(kineto(0), '"dur": 300.0', '"dur": 1e400'))

    with pytest.raises(
        TraceError, match=r"rank0.json: holds a number too large.*traceEvents\[1\]\.dur"
    ):
        load_trace(path)


def test_a_base_time_beyond_64_bit_nanoseconds_is_a_damaged_header(tmp_path, kineto, write):
    doc = kineto(0)
    doc["baseTimeNanoseconds"] = 2**70

    with pytest.raises(TraceError, match="rank0.json: its baseTimeNanoseconds.*beyond"):
        load_trace(write(tmp_path / "rank0.json", doc))


def test_a_stream_id_beyond_64_bits_is_left_empty(tmp_path, kineto, write):
    doc = kineto(0)
    doc["traceEvents"][1]["args"]["stream"] = 2**70

    events = load_trace(write(tmp_path / "rank0.json", doc)).events

    assert events["stream"].isna().all()


def test_an_event_that_is_not_an_object_is_named(tmp_path, kineto, write):
    doc = kineto(0)
    doc["traceEvents"].insert(2, 17)

    with pytest.raises(TraceError, match=r"rank0.json: traceEvents\[2\] is not an event"):
        load_trace(write(tmp_path / "rank0.json", doc))


def test_bytes_that_are_not_utf8_in_a_trace_read_leniently_are_replaced(tmp_path, kineto):
    # Found by the fuzz suite: a field of an unexpected type before the bad byte sent the
    # file to the lenient decoder, which raised UnicodeDecodeError.
    doc = kineto(0)
    doc["traceEvents"][0]["name"] = 5
    doc["traceEvents"][3]["name"] = "aten::m\udcffm"
    path = tmp_path / "rank0.json"
    path.write_bytes(json.dumps(doc, ensure_ascii=False).encode("utf-8", "surrogateescape"))

    with pytest.warns(TraceWarning, match="not valid UTF-8"):
        names = set(load_trace(path).events["name"].astype(str))

    assert {"5", "aten::m\ufffdm"} <= names


def test_merging_a_trace_with_bytes_that_are_not_utf8_replaces_them(tmp_path, kineto):
    text = json.dumps(kineto(0)).replace("aten::mm", "aten::m\udcffm")
    (tmp_path / "rank0.json").write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.warns(TraceWarning):
        run = load_run(tmp_path, cache=False)

    merged = merge_traces(run, tmp_path / "out" / "merged.json")

    assert "aten::m\ufffdm" in {
        e.get("name") for e in json.loads(merged.read_text())["traceEvents"]
    }


def test_header_fields_of_odd_types_are_dropped(tmp_path, kineto, write):
    doc = kineto(0)
    doc["distributedInfo"]["world_size"] = "two"
    doc["distributedInfo"]["backend"] = {"name": "gloo"}
    doc["distributedInfo"]["pg_config"] = json.loads("[" * 40 + "]" * 40)
    doc["run_id"] = ["not", "a", "run id"]

    header = load_trace(write(tmp_path / "rank0.json", doc)).header

    assert (header.world_size, header.backend, header.run_id) == (None, None, None)


def test_a_run_with_deeply_nested_header_values_is_cached_and_read_back(tmp_path, kineto, write):
    doc = kineto(0)
    doc["distributedInfo"]["pg_config"] = json.loads("[" * 40 + "]" * 40)
    write(tmp_path / "rank0.json", doc)

    first = load_run(tmp_path)

    assert list((tmp_path / ".cache").glob("events-*.npz"))
    assert load_run(tmp_path).headers == first.headers


def test_an_unexpected_exception_while_reading_a_file_becomes_a_trace_error(
    tmp_path, kineto, write, monkeypatch
):
    import helpers.traces._file as tracefile

    path = write(tmp_path / "rank0.json", kineto(0))

    def broken(*args):
        raise KeyError("something the loader did not foresee")

    monkeypatch.setattr(tracefile, "columns_of", broken)
    with pytest.raises(TraceError, match="rank0.json: could not be read \\(KeyError"):
        load_trace(path)


# ---------------------------------------- lenient loads: one bad file never stops a run


def merged_with_text_pid(doc: dict) -> str:
    doc["mergedRanks"] = [1]
    doc["traceEvents"][0]["pid"] = "x"
    return json.dumps(doc)


def with_rank(rank: int):
    def damage(doc: dict) -> str:
        doc["distributedInfo"]["rank"] = rank
        return json.dumps(doc)

    return damage


def with_base_time(doc: dict) -> str:
    doc["baseTimeNanoseconds"] = 2**70
    return json.dumps(doc)


def nested_1000_deep(doc: dict) -> str:
    return json_with(doc, '"traceEvents"', f'"deep": {"[" * 1000 + "]" * 1000}, "traceEvents"')


def with_1e400(doc: dict) -> str:
    return json_with(doc, '"dur": 300.0', '"dur": 1e400')


def with_a_number_for_an_event(doc: dict) -> str:
    doc["traceEvents"].append(3)
    return json.dumps(doc)


HOSTILE = {
    "a text pid in a merged trace": merged_with_text_pid,
    "rank 2**40": with_rank(2**40),
    "rank 2**70": with_rank(2**70),
    "base time 2**70": with_base_time,
    "nested 1000 deep": nested_1000_deep,
    "1e400": with_1e400,
    "a number for an event": with_a_number_for_an_event,
}


@pytest.mark.parametrize("damage", sorted(HOSTILE))
def test_a_lenient_load_lists_a_hostile_file_and_loads_the_others(tmp_path, kineto, write, damage):
    write(tmp_path / "rank0.json", kineto(0))
    (tmp_path / "rank1.json").write_text(HOSTILE[damage](kineto(1, pid=200)))

    t0 = time.perf_counter()
    run = load_run(tmp_path, strict=False, cache=False)

    assert run.ranks == [0]
    assert [p.name for p, _ in run.skipped] == ["rank1.json"]
    assert time.perf_counter() - t0 < 5


def test_a_lenient_load_lists_a_file_that_failed_in_an_unforeseen_way(
    tmp_path, kineto, write, monkeypatch
):
    import helpers.traces._file as tracefile

    write(tmp_path / "rank0.json", kineto(0))
    write(tmp_path / "rank1.json", kineto(1, pid=200))
    real = tracefile.read_columns

    def fails_on_rank1(path, *args):
        if path.name == "rank1.json":
            raise OverflowError("an int too large for somewhere")
        return real(path, *args)

    monkeypatch.setattr(tracefile, "read_columns", fails_on_rank1)
    run = load_run(tmp_path, strict=False, cache=False)

    assert run.ranks == [0]
    assert [(p.name, "OverflowError" in why) for p, why in run.skipped] == [("rank1.json", True)]


def test_a_worker_process_that_dies_ends_in_a_trace_error_naming_its_file(
    tmp_path, kineto, write, monkeypatch
):
    import helpers.traces._file as tracefile

    for rank in range(4):
        write(tmp_path / f"rank{rank}.json", kineto(rank, world=4, pid=100 + rank))
    real = tracefile.read_columns

    def dies_on_rank2(path, *args):  # as a worker killed for its memory would
        if path.name == "rank2.json":
            os._exit(9)
        return real(path, *args)

    monkeypatch.setattr(tracefile, "read_columns", dies_on_rank2)  # forked workers inherit it

    with pytest.raises(TraceError, match="rank.\\.json: the worker process reading it stopped"):
        load_run(tmp_path, cache=False, workers=2)


# ------------------------------------------------------------------ merging


def test_merging_needs_little_memory_beyond_the_loaded_run(tmp_path, kineto, write):
    for rank in range(2):
        write(tmp_path / f"rank{rank}.json", kineto(rank, pid=100 + rank, steps=4000))
    run = load_run(tmp_path, cache=False)
    largest = max(p.stat().st_size for p in tmp_path.glob("rank*.json"))

    tracemalloc.start()
    try:
        merge_traces(run, tmp_path / "out" / "merged.json")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert peak < 4 * largest  # 2.7x; before issue 19, every event of every file as dicts: 10x
    assert len(load_trace(tmp_path / "out" / "merged.json").events) == len(run.events)


def test_a_merge_that_fails_leaves_no_temporary_file(tmp_path, kineto, write):
    write(tmp_path / "rank0.json", kineto(0))
    write(tmp_path / "rank1.json", kineto(1, pid=200))
    run = load_run(tmp_path, cache=False)
    (tmp_path / "rank1.json").write_text('{"traceEvents": [{"ph": "X", "ts": 1e400}]}')
    out = tmp_path / "out"

    with pytest.raises(TraceError, match="rank1.json: holds a number too large"):
        merge_traces(run, out / "merged.json.gz")
    assert list(out.iterdir()) == []


def test_merging_leaves_out_events_whose_time_is_not_finite(tmp_path, kineto, write):
    write(tmp_path / "rank0.json", kineto(0))
    run = load_run(tmp_path, cache=False)
    doc = kineto(0)
    doc["traceEvents"][1]["ts"] = "inf"
    write(tmp_path / "rank0.json", doc)  # changed since it was loaded

    merged = merge_traces(run, tmp_path / "merged.json")

    events = json.loads(merged.read_text())["traceEvents"]
    assert all(e["ts"] is not None for e in events if "ts" in e)
    assert sum(e["ph"] == "X" for e in events) == 5


# -------------------------------------------------------------------- the cache


@pytest.fixture
def cached_run(tmp_path, kineto, write):
    """A two-rank run folder that has been loaded once (so its cache is written)."""
    write(tmp_path / "rank0.json", kineto(0))
    write(tmp_path / "rank1.json", kineto(1, pid=200))
    load_run(tmp_path)
    return tmp_path


def test_the_cache_key_includes_the_loader_version(cached_run, monkeypatch):
    items = [(p, None) for p in sorted(cached_run.glob("rank*.json"))]
    before = tracecache.cache_file(cached_run, items, {})
    monkeypatch.setattr(tracecache, "LOADER_VERSION", tracecache.LOADER_VERSION + 1)

    assert tracecache.cache_file(cached_run, items, {}) != before


def test_the_cache_key_includes_the_loader_source(cached_run, monkeypatch):
    items = [(p, None) for p in sorted(cached_run.glob("rank*.json"))]
    before = tracecache.cache_file(cached_run, items, {})
    monkeypatch.setattr(tracecache, "_loader_fingerprint", lambda: "another release")

    assert tracecache.cache_file(cached_run, items, {}) != before


def test_a_cache_made_by_another_loader_version_is_not_read(cached_run, monkeypatch):
    from helpers.traces import load as traces

    monkeypatch.setattr(tracecache, "LOADER_VERSION", tracecache.LOADER_VERSION + 1)
    calls = []
    real = traces._load_files
    monkeypatch.setattr(traces, "_load_files", lambda *a: calls.append(1) or real(*a))

    load_run(cached_run)
    assert calls == [1]


def flip_compression_method(data: bytes) -> bytes:
    """The archive with its first member marked as compressed by a method zipfile lacks."""
    data = bytearray(data)
    data[8:10] = (99).to_bytes(2, "little")  # the local header's compression method
    central = data.rfind(b"PK\x01\x02")
    data[central + 10 : central + 12] = (99).to_bytes(2, "little")
    return bytes(data)


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],  # truncated
        lambda data: b"not a zip file at all",
        lambda data: data[:200] + bytes(b ^ 0x5A for b in data[200:400]) + data[400:],
        flip_compression_method,  # was NotImplementedError
    ],
    ids=["truncated", "garbage", "flipped_bytes", "unknown_compression"],
)
def test_a_damaged_cache_file_is_rebuilt_with_a_warning(cached_run, damage):
    (cache,) = (cached_run / ".cache").glob("events-*.npz")
    cache.write_bytes(damage(cache.read_bytes()))
    fresh = load_run(cached_run, cache=False).events

    with pytest.warns(TraceWarning, match="cached load could not be read.*removed"):
        again = load_run(cached_run)

    pd.testing.assert_frame_equal(again.events, fresh)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # rebuilt: the next load reads it without a word
        pd.testing.assert_frame_equal(load_run(cached_run).events, fresh)


def test_a_cache_file_whose_members_claim_more_than_the_file_is_not_read(cached_run):
    (cache,) = (cached_run / ".cache").glob("events-*.npz")
    data = bytearray(cache.read_bytes())
    central = data.rfind(b"PK\x01\x02")
    data[central + 24 : central + 28] = (2**31).to_bytes(4, "little")  # uncompressed size
    cache.write_bytes(bytes(data))

    with pytest.warns(TraceWarning, match="members larger than the file"):
        load_run(cached_run)


def test_stale_temporary_cache_files_are_removed_and_fresh_ones_kept(cached_run, kineto, write):
    cache_dir = cached_run / ".cache"
    stale = cache_dir / ".events-0123456789abcdef.npz.4242.tmp"
    stale_of_an_older_loader = cache_dir / "events-0123456789abcdef.npz.4242.tmp"
    fresh = cache_dir / ".events-fedcba9876543210.npz.4343.tmp"
    for tmp in (stale, stale_of_an_older_loader, fresh):
        tmp.write_bytes(b"half a cache")
    hour_ago = time.time() - 3600
    for tmp in (stale, stale_of_an_older_loader):
        os.utime(tmp, (hour_ago, hour_ago))

    write(cached_run / "rank1.json", kineto(1, pid=200, steps=3))  # a new load writes a cache
    load_run(cached_run)

    assert not stale.exists() and not stale_of_an_older_loader.exists() and fresh.exists()


def test_a_cache_that_cannot_be_written_leaves_nothing_and_fails_no_load(
    cached_run, kineto, write, monkeypatch
):
    import numpy as np

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", full_disk)
    write(cached_run / "rank1.json", kineto(1, pid=200, steps=3))  # a new load writes a cache

    assert load_run(cached_run).ranks == [0, 1]
    assert [p.name for p in (cached_run / ".cache").iterdir()] == [
        p.name for p in (cached_run / ".cache").glob("events-*.npz")
    ]
    assert len(list((cached_run / ".cache").glob("events-*.npz"))) == 1  # the first load's


# ---------------------------------------------------------------- gathering


def node_folders(tmp_path: Path, kineto, write) -> list[Path]:
    """Two nodes' folders with two ranks' traces each."""
    folders = []
    for node, ranks in {0: (0, 1), 1: (2, 3)}.items():
        folder = tmp_path / f"node{node}"
        folder.mkdir()
        for rank in ranks:
            write(folder / f"rank{rank}.json", kineto(rank, world=4, pid=100 + rank))
        folders.append(folder)
    return folders


def test_gathering_refuses_a_symlink_that_leads_out_of_the_node_folder(tmp_path, kineto, write):
    nodes = node_folders(tmp_path, kineto, write)
    secret = tmp_path / "elsewhere" / "secret.json"
    secret.parent.mkdir()
    secret.write_text('{"password": "hunter2"}')
    (nodes[1] / "rank9.json").symlink_to(secret)

    with pytest.raises(TraceError, match=r"rank9.json: is a symbolic link to .*secret.json"):
        gather_traces(nodes, tmp_path / "all")
    assert not (tmp_path / "all").exists()


def test_gathering_copies_a_symlink_that_stays_inside_the_node_folder(tmp_path, kineto, write):
    nodes = node_folders(tmp_path, kineto, write)
    (nodes[1] / "rank3.json").rename(nodes[1] / "kept.data")
    (nodes[1] / "rank3.json").symlink_to(nodes[1] / "kept.data")

    copies = gather_traces(nodes, tmp_path / "all")

    assert [p.name for p in copies] == ["rank0.json", "rank1.json", "rank2.json", "rank3.json"]
    assert not any(p.is_symlink() for p in copies)
    assert load_run(tmp_path / "all").ranks == [0, 1, 2, 3]


def test_gathering_never_writes_through_a_symlink_in_the_destination(tmp_path, kineto, write):
    nodes = node_folders(tmp_path, kineto, write)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "all").mkdir()
    (tmp_path / "all" / "rank0.json").symlink_to(victim)

    with pytest.raises(TraceError, match="rank0.json: is a symbolic link.*does not write through"):
        gather_traces(nodes, tmp_path / "all")
    assert victim.read_text() == "precious"
