"""A claim of lesson 6, measured: TensorPipe's default transport between processes on one host
keeps a thread busy in every idle RPC process; the TCP transport ("uv") does not.

Idle, the polling thread takes a whole core (0.98 and 1.00 here on 2026-12-04), the TCP transport
under a thousandth of one. Beside other work it gets its share only: 0.44 and 0.53 of a core on a
busy CI machine of 2 cores, so the bound is a fifth of a core, ten times the TCP one."""

import json

import pytest

from helpers.jobs import launch

IDLE_WORKER = """
import json, os, sys, time, warnings
import torch.distributed.rpc as rpc

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
warnings.filterwarnings("ignore")
options = rpc.TensorPipeRpcBackendOptions(**({"_transports": ["uv"]} if sys.argv[1] == "uv" else {}))
rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world, rpc_backend_options=options)
if rank == 0:
    rpc.rpc_sync("worker1", time.sleep, args=(0.01,))  # connect the pair
time.sleep(0.5)
cpu, wall = time.process_time(), time.monotonic()
time.sleep(2)  # idle: nothing is sent
busy = (time.process_time() - cpu) / (time.monotonic() - wall)
with open(os.path.join(os.environ["RUN_DIR"], f"busy{rank}.json"), "w") as f:
    json.dump(busy, f)
rpc.shutdown()
"""


@pytest.fixture
def idle_worker(write_script):
    return write_script("idle_worker.py", IDLE_WORKER)


def idle_cpu(idle_worker, tmp_path, transport: str) -> list[float]:
    run = launch(idle_worker, 2, args=[transport], traces_root=tmp_path, echo=False, timeout=120)
    return [json.loads(p.read_text()) for p in run.paths("busy*.json")]


def test_an_idle_rpc_process_on_the_default_transport_keeps_a_core_busy(idle_worker, tmp_path):
    busy = idle_cpu(idle_worker, tmp_path, "default")
    assert len(busy) == 2 and min(busy) > 0.2, f"cores busy while idle: {busy}"


def test_an_idle_rpc_process_on_the_tcp_transport_uses_no_cpu(idle_worker, tmp_path):
    busy = idle_cpu(idle_worker, tmp_path, "uv")
    assert len(busy) == 2 and max(busy) < 0.02, f"cores busy while idle: {busy}"
