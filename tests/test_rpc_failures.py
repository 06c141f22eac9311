"""RPC runs that go wrong end promptly with a clear error and leave no process behind."""

import time

import pytest

from helpers.jobs import RankFailed, launch, processes_of_run

RPC_SCRIPT = """
import os, sys, time, warnings
import torch.distributed.rpc as rpc

def broken():
    raise ValueError("the server could not serve this request")

def slow():
    time.sleep(30)

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
warnings.filterwarnings("ignore")
rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world,
             rpc_backend_options=rpc.TensorPipeRpcBackendOptions(rpc_timeout=2))
if rank == 0:
    rpc.rpc_sync("worker1", broken if sys.argv[1] == "raise" else slow)
rpc.shutdown()
"""


@pytest.fixture
def rpc_script(write_script):
    return write_script("rpc_job.py", RPC_SCRIPT)


def test_a_worker_that_raises_ends_the_run_with_its_error(rpc_script, tmp_path):
    with pytest.raises(RankFailed) as caught:
        launch(rpc_script, 2, args=["raise"], traces_root=tmp_path, echo=False, timeout=120)

    err = caught.value
    assert err.rank == 0
    assert "the server could not serve this request" in str(err)
    assert processes_of_run(err.record.run_id) == []


def test_a_call_past_its_timeout_ends_the_run_promptly(rpc_script, tmp_path):
    start = time.monotonic()
    with pytest.raises(RankFailed) as caught:
        launch(rpc_script, 2, args=["slow"], traces_root=tmp_path, echo=False, timeout=120)

    err = caught.value
    assert "RPC ran for more than set timeout" in str(err)
    assert time.monotonic() - start < 60, "ended by the 2 s call timeout, not the 30 s sleep"
    assert processes_of_run(err.record.run_id) == []
