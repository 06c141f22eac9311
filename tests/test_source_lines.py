"""Which line of the training script the ops came from (traces made with ``with_stack=True``)."""

from __future__ import annotations

import pytest

from conftest import REPO
from helpers import load_run, load_trace, time_by_source_line


def _frame(name, call_from, ts, dur):
    return {"ph": "X", "cat": "python_function", "name": name, "pid": 1, "tid": 1, "ts": ts,
            "dur": dur, "args": {"CallFrom": call_from}}  # fmt: skip


def _op(name, ts, dur):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}


@pytest.fixture
def stacked(write, tmp_path):
    events = [
        _frame("train.py(10): main", "train.py:40", 0, 1000),
        _frame("module.py(1775): _call_impl", "train.py:21", 10, 300),  # model(images)
        _op("aten::conv2d", 20, 200),
        _op("aten::convolution", 30, 150),  # nested in conv2d: counted once
        _frame("_tensor.py(600): backward", "train.py:22", 400, 500),  # loss.backward()
        _frame("graph.py(800): _engine_run", "_tensor.py:630", 410, 480),  # not the script
        _op("aten::convolution_backward", 420, 400),
        _op("aten::add_", 950, 10),  # only inside main: charged to main's own caller
    ]
    return load_trace(write(tmp_path / "rank0.json", {"traceEvents": events})).events


def test_each_op_is_charged_to_the_script_line_that_called_into_it(stacked):
    table = time_by_source_line(stacked, "train.py").set_index("line")
    assert table.loc["train.py:21", "ms"] == pytest.approx(0.2)  # 200 µs, nesting counted once
    assert table.loc["train.py:21", "ops"] == 2
    assert table.loc["train.py:22", "ms"] == pytest.approx(0.4)
    assert table.loc["train.py:40", "ms"] == pytest.approx(0.01)


def test_the_heaviest_line_comes_first(stacked):
    assert time_by_source_line(stacked, "train.py")["line"].tolist()[0] == "train.py:22"


def test_a_trace_without_stacks_says_to_record_with_stack(write, kineto, tmp_path):
    events = load_trace(write(tmp_path / "rank0.json", kineto(0))).events
    with pytest.raises(ValueError, match="with_stack=True"):
        time_by_source_line(events, "train.py")


def test_traces_without_call_sites_say_which_torch_records_them():
    # lesson 3's with_stack run recorded by the GPU rehearsal under torch 2.11: no CallFrom
    (run,) = (REPO / "recordings" / "gpu").glob("ddp-stack-*")
    events = load_run(run / "files", cache=False).events
    with pytest.raises(ValueError, match="'CallFrom': torch 2.14.1 records it"):
        time_by_source_line(events, "train_ddp.py")
