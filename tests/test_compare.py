"""Two runs compared (``compare_runs``): the step's shift and its interval, where on the critical
path the change came from, the ops added, removed and changed, a what-if against the second run,
and the cautions where the runs do not line up. Checked on the lessons' recorded runs (lesson
11's straggler against its normal run; the overlap job with and without work hidden behind a
wait) and on the real H200 pair (``../shared/real-traces/h200``)."""

from __future__ import annotations

import shutil
import warnings

import numpy as np
import pandas as pd
import pytest

from conftest import REAL_TRACES, complete_event, trace_doc, write_doc
from helpers import RUN_NOISE, compare_runs, load_run, step_shift, what_if, within_noise
from helpers.analysis.shift import _mann_whitney_k
from helpers.jobs.recorded import RECORDINGS_ROOT
from helpers.report.__main__ import main
from helpers.report.compare import are_two_runs


def _recorded(name: str) -> pd.DataFrame:
    folder = next(RECORDINGS_ROOT.glob(f"{name}-*/files"))
    return load_run(folder, cache=False).events


@pytest.fixture(scope="module")
def recorded() -> dict[str, pd.DataFrame]:
    names = ("ddp-normal", "ddp-straggler", "overlap-0", "overlap-40")
    return {name: _recorded(name) for name in names}


@pytest.fixture(scope="module")
def h200() -> dict[str, pd.DataFrame]:
    if not REAL_TRACES.is_dir():
        pytest.skip("../shared/real-traces is not here")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return {
            case: load_run(REAL_TRACES / "h200" / case, cache=False).events
            for case in ("base-1", "gpuslow-1")
        }


@pytest.mark.parametrize(
    "n, m, k",
    [(4, 4, 1), (5, 5, 3), (6, 6, 6), (7, 7, 9), (8, 8, 14), (10, 10, 24), (6, 9, 11)],
    ids=["4x4", "5x5", "6x6", "7x7", "8x8", "10x10", "6x9"],
)
def test_the_intervals_rank_is_the_mann_whitney_tables_critical_value_plus_one(n, m, k):
    # the published two-sided 5 % critical values of U (e.g. 5 for 6 and 6 steps)
    assert _mann_whitney_k(n, m, 0.05) == k


@pytest.mark.parametrize(
    "before, after, expected",
    [
        ([1, 2, 3, 4, 5, 6], [11, 12, 13, 14, 15, 16], (10.0, 7.0, 13.0)),
        ([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6], (0.0, -3.0, 3.0)),
        ([10, 11, 12, 13, 14, 15], [5, 6, 7, 8, 9, 10], (-5.0, -8.0, -2.0)),
    ],
    ids=["ten-later", "the-same", "five-earlier"],
)
def test_a_shift_is_the_median_of_the_differences_with_its_interval(before, after, expected):
    assert step_shift(before, after) == pytest.approx(expected)


@pytest.mark.parametrize(
    "before, after, says",
    [([1.0], [2.0, 3.0], "at least 2 steps"), ([1.0, 2.0, 3.0], [4.0, 5.0, 6.0], "too few")],
    ids=["one-step", "three-and-three"],
)
def test_too_few_steps_for_an_interval_are_refused_with_what_to_do(before, after, says):
    with pytest.raises(ValueError, match=says):
        step_shift(before, after)


@pytest.mark.parametrize(
    "low, high, noise, within",
    [
        (3.0, 16.2, 0.0, False),
        (3.0, 16.2, 11.7, True),
        (-5.0, 5.0, 0.0, True),
        (12.1, 42.3, 11.7, False),
    ],  # fmt: skip
    ids=["past-the-steps-spread", "within-the-runs-noise", "holds-0", "past-both"],
)
def test_a_shift_is_noise_when_its_interval_widened_by_the_noise_between_runs_holds_0(
    low, high, noise, within
):
    assert within_noise(pd.Series({"low_ms": low, "high_ms": high, "noise_ms": noise})) is within


def test_the_noise_between_runs_is_a_share_of_the_first_runs_median_step(recorded):
    compared = compare_runs(recorded["overlap-40"], recorded["overlap-0"])
    noise = compared.steps.loc["change", "noise_ms"]
    assert noise == pytest.approx(RUN_NOISE * compared.steps.loc["before", "median_ms"])
    assert f"±{noise:.1f} ms between runs" in compared.verdict


def test_the_interval_holds_the_true_shift_in_about_95_percent_of_samples():
    rng = np.random.default_rng(0)
    held = [
        low <= 20 <= high
        for low, high in (
            step_shift(rng.normal(200, 15, 6), rng.normal(220, 15, 6))[1:] for _ in range(2000)
        )
    ]
    assert 0.94 <= np.mean(held) <= 0.99  # 6 and 6 steps: 95.9 % by construction


def test_the_fixed_straggler_is_a_change_held_by_its_slow_batch(recorded):
    compared = compare_runs(recorded["ddp-straggler"], recorded["ddp-normal"])
    change = compared.steps.loc["change"]
    assert change["high_ms"] < 0  # the step fell beyond the noise
    assert change["low_ms"] <= -150 <= change["high_ms"] + 30  # about the 150 ms delay
    top = compared.held.iloc[0]
    assert (top["rank"], top["kind"]) == (1, "data loading")
    assert top["change_ms"] / change["mean_ms"] >= 0.8
    assert compared.verdict.startswith("The steps fell by")
    assert (
        "largest change on the critical path is rank 1's enumerate(DataLoader)" in compared.verdict
    )
    assert "(most of it)" in compared.verdict


def test_work_hidden_behind_a_wait_and_removed_is_no_change_beyond_the_noise(recorded):
    compared = compare_runs(recorded["overlap-40"], recorded["overlap-0"])
    assert compared.verdict.startswith("No change beyond the noise")
    removed = compared.ops[(compared.ops["rank"] == 0) & (compared.ops["name"] == "overlapped")]
    assert removed["before_ms"].iloc[0] > 35 and removed["after_ms"].iloc[0] < 1


@pytest.mark.parametrize(
    "before, after", [("ddp-straggler", "ddp-normal"), ("overlap-40", "overlap-0")]
)
def test_the_paths_differences_add_up_to_the_change_in_the_mean_step(recorded, before, after):
    compared = compare_runs(recorded[before], recorded[after])
    change = compared.steps.loc["change", "mean_ms"]
    assert compared.held["change_ms"].sum() == pytest.approx(change, abs=0.01)


def test_a_what_if_is_set_beside_the_run_without_the_change(recorded):
    slow = recorded["ddp-straggler"]
    predicted = what_if(slow, rank=1, name="DataLoader")
    compared = compare_runs(slow, recorded["ddp-normal"], prediction=predicted)
    row = compared.prediction.iloc[0]
    assert row["predicted_ms"] == pytest.approx(predicted.median())
    assert row["low_ms"] <= row["shift_ms"] <= row["high_ms"]
    assert f"The what-if predicted {row['predicted_ms']:.1f} ms" in compared.verdict


def test_a_rank_missing_from_one_run_is_a_caution(recorded):
    after = recorded["ddp-normal"]
    compared = compare_runs(recorded["ddp-straggler"], after[after["rank"] == 0])
    assert any("different world sizes as traced: 2 ranks before, 1 after" in c for c in compared.cautions)  # fmt: skip


def test_runs_of_different_step_counts_are_a_caution(recorded):
    after = recorded["ddp-normal"]
    compared = compare_runs(recorded["ddp-straggler"], after[after["step"] != after["step"].max()])
    assert any("different numbers of steps (6 before, 5 after)" in c for c in compared.cautions)


def test_a_folder_without_steps_is_named(tmp_path, recorded):
    write_doc(tmp_path / "rank0.json", trace_doc([complete_event("aten::mm", 0, 10)]))
    with pytest.raises(ValueError, match=f"the after run \\({tmp_path}\\) has no profiler steps"):
        compare_runs(recorded["ddp-normal"], tmp_path)


def test_the_h200_fix_is_put_on_rank_1s_slow_op_kernels(h200):
    compared = compare_runs(h200["gpuslow-1"], h200["base-1"])
    change = compared.steps.loc["change"]
    assert change["low_ms"] <= change["median_ms"] <= change["high_ms"] < 0
    kernels = compared.held[(compared.held["rank"] == 1) & (compared.held["kind"] == "gpu kernel")]
    assert kernels["change_ms"].sum() / change["mean_ms"] >= 0.8
    slow_op = compared.ops[(compared.ops["rank"] == 1) & (compared.ops["name"] == "slow_op")]
    assert set(slow_op["status"]) == {"removed"}


def test_the_report_of_two_run_folders_compares_them(tmp_path, capsys):
    before, after = (next(RECORDINGS_ROOT.glob(f"{n}-*/files")) for n in ("ddp-straggler", "ddp-normal"))  # fmt: skip
    out = tmp_path / "compared.html"
    assert main([str(before), str(after), "--out", str(out)]) == 0
    page = out.read_text()
    assert "The steps fell by" in page and "Where the change came from" in page
    assert 'alt="Bars of the change in time held on the critical path' in page
    assert "two runs compared" in capsys.readouterr().out


def test_two_folders_of_different_ranks_are_one_runs_nodes(tmp_path):
    files = next(RECORDINGS_ROOT.glob("ddp-normal-*/files"))
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    for node, rank in zip(nodes, (0, 1)):
        node.mkdir()
        for f in files.glob(f"rank{rank}_*"):
            shutil.copy(f, node)
    assert not are_two_runs(nodes)
    assert are_two_runs([files, files])


def test_two_runs_of_too_few_steps_for_an_interval_end_in_a_message(tmp_path, capsys):
    # lesson 3's run (experiment "ddp", 3 steps), not "ddp-after-the-fix"
    run = next(RECORDINGS_ROOT.glob("ddp-" + "[0-9a-f]" * 8 + "/files"))
    assert main([str(run), str(run), "--out", str(tmp_path / "r.html")]) == 2
    said = capsys.readouterr().err
    assert "3 and 3 steps are too few for a 95% interval: profile more steps" in said
    assert not (tmp_path / "r.html").exists()
