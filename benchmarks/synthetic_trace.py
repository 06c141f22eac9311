"""Write large Kineto-format traces for the benchmarks: the shape of a real CPU DDP trace
(steps, nested aten ops with shapes and args, gloo collectives on their own thread),
repeated until the file reaches the size asked for."""

from __future__ import annotations

import json
import random
from pathlib import Path

OPS = [
    "aten::conv2d",
    "aten::convolution",
    "aten::_convolution",
    "aten::mkldnn_convolution",
    "aten::batch_norm",
    "aten::relu_",
    "aten::add_",
    "aten::mm",
    "aten::empty",
    "aten::as_strided",
    "aten::t",
    "aten::addmm",
    "autograd::engine::evaluate_function: ConvolutionBackward0",
    "ConvolutionBackward0",
    "aten::convolution_backward",
]


def write_trace(path: Path, rank: int, world_size: int, target_bytes: int, seed: int = 0) -> int:
    """Write one rank's trace of about ``target_bytes``; returns the number of complete events."""
    rng = random.Random(seed + rank)
    base_ns = 1_790_000_000_000_000_000
    pid, gloo_tid = 10_000 + rank, 20_000 + rank
    out = path.open("w")
    out.write(
        '{"schemaVersion": 1, "deviceProperties": [], "distributedInfo": {"backend": "gloo", '
        f'"rank": {rank}, "world_size": {world_size}, "pg_count": 1, "pg_config": []}}, '
        f'"baseTimeNanoseconds": {base_ns}, "traceEvents": [\n'
    )
    written, events, t, step, ev_idx = 0, 0, 5_000_000.0, 1, 0
    while written < target_bytes:
        step_start = t
        chunk = []
        for _ in range(400):
            name = rng.choice(OPS)
            dur = round(rng.uniform(1, 80), 3)
            ev_idx += 1
            chunk.append(
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": name,
                    "pid": pid,
                    "tid": pid,
                    "ts": round(t, 3),
                    "dur": dur,
                    "args": {
                        "External id": ev_idx,
                        "Record function id": 0,
                        "Ev Idx": ev_idx,
                        "Sequence number": ev_idx // 3,
                        "Fwd thread id": 0,
                        "Input Dims": [[8, 64, 32, 32], [64, 64, 3, 3], []],
                        "Input type": ["float", "float", ""],
                        "Concrete Inputs": ["", "", "[1, 1]"],
                    },
                }
            )
            t += dur + rng.uniform(0.5, 5)
        for i in range(4):
            chunk.append(
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": "gloo:all_reduce",
                    "pid": pid,
                    "tid": gloo_tid,
                    "ts": round(step_start + i * 900, 3),
                    "dur": 700.0,
                    "args": {"External id": ev_idx + i + 1},
                }
            )
        chunk.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{step}",
                "pid": pid,
                "tid": pid,
                "ts": round(step_start, 3),
                "dur": round(t - step_start, 3),
                "args": {"External id": 0},
            }
        )
        text = ",\n".join(json.dumps(e) for e in chunk)
        out.write(("" if events == 0 else ",\n") + text)
        written += len(text) + 2
        events += len(chunk)
        step += 1
    out.write(
        f',\n{{"ph": "M", "name": "thread_name", "pid": {pid}, "tid": {gloo_tid}, "args": '
        f'{{"name": "thread {gloo_tid} (pt_gloo_runloop)"}}}}\n], "traceName": "{path.name}"}}\n'
    )
    out.close()
    return events
