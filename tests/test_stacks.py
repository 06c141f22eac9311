"""Python stacks as a table: faulthandler's format parsed, the last dump of a renewed file, and
the line of a script each rank's main thread is on."""

import faulthandler
import threading

from helpers import lines_in_script, load_stack_dumps
from helpers.hangs.stacks import stack_frames

DUMP = """Thread 0x00007f2bdffff6c0 (most recent call first):
  File "{script}", line 60 in renew
  File "/usr/lib/python3.11/threading.py", line 982 in run

Thread 0x00007f2ca4680b80 (most recent call first):
  File "/venv/torch/distributed/distributed_c10d.py", line 3913 in all_reduce
  File "{script}", line 92 in step
  File "{script}", line 118 in main
  File "{script}", line 127 in <module>
"""


def test_a_dump_becomes_one_row_per_frame_innermost_first(tmp_path):
    rows = stack_frames(3, DUMP.format(script=tmp_path / "hang.py"))
    main = [r for r in rows if r["thread"] == "0x00007f2ca4680b80"]
    assert [(r["depth"], r["function"]) for r in main] == [
        (0, "all_reduce"), (1, "step"), (2, "main"), (3, "<module>")
    ]  # fmt: skip
    assert all(r["rank"] == 3 for r in rows)


def test_the_script_line_is_the_main_threads_not_a_helper_threads(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text("\n".join(f"line {n}" for n in range(1, 130)))
    (tmp_path / "stacks_0.txt").write_text(DUMP.format(script=script))
    where = lines_in_script(load_stack_dumps(tmp_path), "hang.py")
    assert where.loc[0, "line"] == 92 and where.loc[0, "function"] == "step"
    assert where.loc[0, "code"] == "line 92"


def test_a_file_that_faulthandler_appended_to_is_read_at_its_last_dump(tmp_path):
    script = tmp_path / "hang.py"
    first = DUMP.format(script=script).replace("line 92 in step", "line 80 in step")
    text = f"Timeout (0:00:01)!\n{first}\nTimeout (0:00:01)!\n{DUMP.format(script=script)}"
    (tmp_path / "stacks_1.txt").write_text(text)
    stacks = load_stack_dumps(tmp_path)
    assert set(stacks["rank"]) == {1}
    assert lines_in_script(stacks, "hang.py").loc[1, "line"] == 92


def test_a_real_faulthandler_dump_is_read(tmp_path):
    done = threading.Event()
    worker = threading.Thread(target=done.wait, name="waiting")
    worker.start()
    try:
        with (tmp_path / "stacks_2.txt").open("w") as f:
            faulthandler.dump_traceback(f, all_threads=True)
    finally:
        done.set()
        worker.join()
    stacks = load_stack_dumps(tmp_path)
    assert stacks["thread"].nunique() >= 2
    assert "test_a_real_faulthandler_dump_is_read" in set(stacks["function"])


def test_a_path_made_relative_to_the_repository_still_shows_its_code():
    relative = (
        'Thread 0x1 (most recent call first):\n  File "helpers/hangs/stacks.py", line 1 in f\n'
    )
    (row,) = stack_frames(0, relative)
    assert row["code"].startswith('"""Python stacks'), "read from the repository, not the cwd"
