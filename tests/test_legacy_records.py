"""The legacy profiler's raw records: kept while it parses them, and the RPC replies read from
them."""

from dataclasses import dataclass

import torch
from torch.autograd import profiler_legacy

from helpers import kept_legacy_records, server_replies


def test_the_raw_records_are_kept_and_the_profile_is_unchanged():
    parse = profiler_legacy._parse_legacy_records
    with kept_legacy_records() as kept, profiler_legacy.profile() as prof:
        torch.add(torch.ones(2), torch.ones(2))
    names = [e.name for e in prof.function_events]
    assert "aten::add" in names
    recorded = {r.name() for thread in kept["records"] for r in thread}
    assert "aten::add" in recorded and "__start_profile" in recorded
    assert profiler_legacy._parse_legacy_records is parse, "the private parser is put back"


def test_the_parser_is_put_back_when_the_block_fails():
    parse = profiler_legacy._parse_legacy_records
    try:
        with kept_legacy_records():
            raise RuntimeError("a call failed")
    except RuntimeError:
        pass
    assert profiler_legacy._parse_legacy_records is parse


@dataclass
class Record:
    """A stand-in for the profiler's record (the methods server_replies reads)."""

    name_: str
    handle_: int
    start: float = 0.0
    remote: bool = True
    thread: int = 7
    kind_: str = "push"

    def kind(self):
        return self.kind_

    def is_remote(self):
        return self.remote

    def name(self):
        return self.name_

    def handle(self):
        return self.handle_

    def thread_id(self):
        return self.thread

    def start_us(self):
        return self.start


def test_each_reply_says_its_request_thread_start_and_whether_its_records_came_twice():
    call = "rpc_async#udf(worker0 -> worker1)#remote_op: "
    records = [
        [Record("__start_profile", 0, remote=False)],  # the caller's own thread: no reply
        [Record(call + "server: udf call 1", 5, start=3000.0, thread=8)]
        + [Record(call + "server: udf call 1", 5, start=3000.0, thread=8)],
        [Record(call + "server: udf call 0", 4, start=1000.0), Record("x", 4, kind_="pop")],
    ]
    replies = server_replies(records, names=[call + "server: udf call 0"])
    assert replies == [
        {"request": "server: udf call 0", "server_thread": 7, "records_doubled": False,
         "in_profile": True, "start_ms": 0.0},
        {"request": "server: udf call 1", "server_thread": 8, "records_doubled": True,
         "in_profile": False, "start_ms": 2.0},
    ]  # fmt: skip
