"""Pre-flight check of a machine before a workshop: ``make doctor`` (or ``python -m helpers.doctor``).

Prints one PASS / WARN / FAIL line per check and a verdict line, and exits non-zero when the
machine cannot run the live lessons (it can then still follow them in recorded mode). Checks:
the Python version, the pinned packages (importable, at the pinned versions), cores, memory
and free disk for traces, ``torch.distributed`` with gloo and ``torch.distributed.rpc``, a free
port on localhost, a real 2-rank gloo job under torchrun and what it listened on (loopback only,
measured from the socket table while it ran), lesson 9's debug server (it starts on loopback and
answers), the GPUs and NCCL where there are GPUs.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .jobs.kineto_noise import hide_kineto_noise
from .jobs.recorded import use_recorded_runs
from .jobs.runs import REPO_ROOT, TRACES_ROOT, usable_cores

__all__ = ["Check", "run_checks", "main"]

MIN_PYTHON = (3, 10)
MIN_CORES = 2
MIN_MEMORY_GB = 4.0
MIN_DISK_GB = 2.0
REQUIREMENTS = REPO_ROOT / "requirements.txt"  # the pins the series is tested with


@dataclass
class Check:
    """One line of the report: ``status`` is PASS, WARN or FAIL (a FAIL stops the live lessons)."""

    name: str
    status: str
    detail: str

    def line(self) -> str:
        return f"{self.status:4s}  {self.name:22s} {self.detail}"


def _python() -> Check:
    version = sys.version_info[:3]
    ok = version[:2] >= MIN_PYTHON
    return Check(
        "Python",
        "PASS" if ok else "FAIL",
        f"{'.'.join(map(str, version))} (the series is tested with 3.11; needs "
        f"{'.'.join(map(str, MIN_PYTHON))} or newer)",
    )


def _pins(requirements: Path) -> dict[str, str]:
    pins = {}
    for line in requirements.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name.strip()] = version.strip()
    return pins


#: The pins whose module is not named as the package is (the rest import under their names).
_MODULE_OF = {"pytest-xdist": "xdist"}
#: The pins the lessons do without: the tests', the site's and the Dask example's.
NOT_FOR_THE_LESSONS = {
    "dask", "distributed", "nbval", "pytest", "pytest-xdist", "hypothesis", "ruff", "sphinx",
    "myst-nb", "sphinx-book-theme", "pydata-sphinx-theme", "sphinx-copybutton", "selenium",
}  # fmt: skip


def _packages(requirements: Path) -> Check:
    missing, other = [], []
    pins = _pins(requirements)
    for name, version in pins.items():
        try:
            installed = importlib.metadata.version(name)
            importlib.import_module(_MODULE_OF.get(name, name.replace("-", "_")))
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
            continue
        except Exception as err:  # installed but broken
            missing.append(f"{name} (does not import: {type(err).__name__})")
            continue
        if installed.split("+")[0] != version:
            other.append(f"{name} {installed} (pinned {version})")
    install = "run make install (or the offline install in docs/INSTRUCTORS.md)"
    needed = [m for m in missing if m.split()[0] not in NOT_FOR_THE_LESSONS]
    if needed:
        return Check("packages", "FAIL", f"not installed: {', '.join(needed)}; {install}")
    if missing:
        return Check(
            "packages",
            "WARN",
            f"the lessons' packages import; missing or broken, used only by the tests, the "
            f"site and the Dask example: {', '.join(missing)}; {install}",
        )
    if other:
        return Check("packages", "WARN", f"other versions than pinned: {', '.join(other)}")
    return Check("packages", "PASS", f"all {len(pins)} pinned packages import")


def _cores_memory_disk() -> list[Check]:
    import psutil

    cores = usable_cores()
    memory_gb = psutil.virtual_memory().total / 1e9
    TRACES_ROOT.mkdir(exist_ok=True)
    disk_gb = shutil.disk_usage(TRACES_ROOT).free / 1e9
    return [
        Check(
            "cores",
            "PASS" if cores >= MIN_CORES else "FAIL",
            f"{cores} (the lessons are timed on 2; 1 core runs them very slowly)",
        ),
        Check(
            "memory",
            "PASS" if memory_gb >= MIN_MEMORY_GB else "FAIL",
            f"{memory_gb:.1f} GB (4 ranks of ResNet-18 need about 3 GB)",
        ),
        Check(
            "disk for traces",
            "PASS" if disk_gb >= MIN_DISK_GB else "FAIL",
            f"{disk_gb:.1f} GB free in traces/ (a full run of the series writes up to about 200 MB)",
        ),
    ]


def _distributed() -> list[Check]:
    import torch.distributed as dist
    import torch.distributed.rpc as rpc

    checks = [
        Check(
            "torch.distributed",
            "PASS" if dist.is_available() and dist.is_gloo_available() else "FAIL",
            "available, with gloo"
            if dist.is_available()
            else "not available in this build of PyTorch",
        )
    ]
    checks.append(
        Check(
            "torch.distributed.rpc",
            "PASS" if rpc.is_available() else "FAIL",
            "available"
            if rpc.is_available()
            else "not available (PyTorch on Windows has no RPC: use WSL2); lessons 5-6 need it",
        )
    )
    return checks


def _port() -> Check:
    from .jobs import free_port

    try:
        port = free_port()
    except OSError as err:
        return Check("localhost ports", "FAIL", f"cannot open a port on 127.0.0.1 ({err})")
    return Check("localhost ports", "PASS", f"a free port was found ({port}); runs pick their own")


_TINY_JOB = """
import os
import torch
import torch.distributed as dist
backend = os.environ.get("DIST_BACKEND", "gloo")
if backend == "nccl":  # nccl reduces GPU tensors only: one GPU per rank
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group(backend)
x = torch.ones(4, device="cuda" if backend == "nccl" else "cpu")
dist.all_reduce(x)
assert x.tolist() == [float(dist.get_world_size())] * 4
dist.destroy_process_group()
"""


def _two_rank_job(cpu: bool = True) -> tuple[Check, set]:
    """The check of a real 2-rank job, and the sockets its processes listened on."""
    from .jobs import LaunchError, ListenerWatch, launch

    name = "2-rank gloo job" if cpu else "2-rank nccl job"
    with tempfile.TemporaryDirectory(prefix="doctor-") as folder:
        script = Path(folder) / "tiny_job.py"
        script.write_text(_TINY_JOB)
        t0 = time.monotonic()
        try:
            with ListenerWatch(Path(folder) / "traces") as watch:
                launch(
                    script,
                    2,
                    experiment="doctor",
                    echo=False,
                    timeout=120,
                    cpu=cpu,
                    traces_root=Path(folder) / "traces",
                )
        except (LaunchError, OSError) as err:
            first = str(err).splitlines()[0]
            return Check(name, "FAIL", f"did not finish: {first}"), watch.seen
    return Check(
        name, "PASS", f"started, all-reduced and finished in {time.monotonic() - t0:.1f} s"
    ), watch.seen


def _debug_server() -> Check:
    """Lesson 9's debug server: PyTorch's worker server starts on loopback and answers."""
    from .live.debug_server import ask_server, start_worker_server

    name = "debug server"
    try:
        server, address = start_worker_server("127.0.0.1")
    except Exception as err:  # a torch without it, or one that changed the private class
        return Check(name, "FAIL", f"cannot start ({type(err).__name__}: {err}); lesson 9 needs it")
    try:
        answer = (ask_server(address, "ping", 10, 1000) or b"").decode(errors="replace").strip()
    except OSError as err:
        answer = f"no answer ({err})"
    finally:
        server.shutdown()
    if answer != "pong":
        return Check(name, "FAIL", f"started on {address} but answered {answer!r} to ping")
    return Check(name, "PASS", f"a rank's debug server started on {address} and answered")


def _gpus() -> list[Check]:
    import torch
    import torch.distributed as dist

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n == 0:
        return [Check("GPUs", "PASS", "none: the lessons run on the CPU with gloo")]
    names = ", ".join(sorted({torch.cuda.get_device_name(i) for i in range(n)}))
    checks = [
        Check(
            "GPUs",
            "PASS",
            f"{n} ({names}); "
            + ("one rank per GPU with nccl" if n >= 2 else "1 GPU: the DDP lessons use the CPU"),
        )
    ]
    checks.append(
        Check(
            "nccl",
            "PASS" if dist.is_nccl_available() else "FAIL",
            "available" if dist.is_nccl_available() else "not in this build",
        )
    )
    if n >= 2 and dist.is_nccl_available():
        job, listeners = _two_rank_job(cpu=False)
        checks += [job, _network_exposure(listeners, "nccl")]
    return checks


def _network_exposure(seen: set, job: str = "gloo") -> Check:
    """What the 2-rank ``job`` listened on, measured while it ran: loopback only, or more."""
    name = "network exposure" + ("" if job == "gloo" else f" ({job})")
    exposed = sorted(f"{s.process} {s.address}:{s.port}" for s in seen if not s.loopback)
    if exposed:
        return Check(
            name,
            "WARN",
            f"the 2-rank {job} job listened beyond loopback ({', '.join(exposed)}): on a shared "
            f"network anyone nearby can connect while a run goes. See README.md, Security",
        )
    if not seen:
        return Check(name, "WARN", f"no listening socket of the 2-rank {job} job was seen")
    agents = sum(s.process == "torchrun agent" for s in seen)
    return Check(
        name,
        "PASS",
        f"the 2-rank {job} job listened on loopback only ({agents} torchrun stores, "
        f"{len(seen) - agents} sockets of its ranks). torchrun typed by hand listens on every "
        f"interface for the whole run (README.md, Security)",
    )


def run_checks(requirements: Path = REQUIREMENTS) -> list[Check]:
    """Every check, in order; later checks are skipped when the packages are missing."""
    checks = [_python(), _packages(requirements)]
    checks += _cores_memory_disk()
    if checks[1].status == "FAIL":
        return checks
    job, listeners = _two_rank_job()
    checks += _distributed() + [_port(), job, _network_exposure(listeners), _debug_server()]
    checks += _gpus()
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m helpers.doctor", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--requirements",
        type=Path,
        default=REQUIREMENTS,
        help="the pinned requirements to check (default: the series')",
    )
    opts = parser.parse_args(argv)
    hide_kineto_noise()  # the debug server logs its start and stop to stderr
    use_recorded_runs(False)  # the doctor checks live launching, whatever PDP_RECORDED says,
    os.environ.pop("PDP_RECORD", None)  # and its tiny job is never saved as a recording
    checks = run_checks(opts.requirements)
    for check in checks:
        print(check.line(), flush=True)
    failed = [c for c in checks if c.status == "FAIL"]
    if failed:
        print(
            f"\nNOT READY: this machine cannot run the live lessons ({', '.join(c.name for c in failed)}). "
            f"Fix the lines above, or follow the lessons in recorded mode: make lab RECORDED=1"
        )
        return 1
    warned = [c.name for c in checks if c.status == "WARN"]
    print(
        "\nREADY: this machine can run the live lessons"
        + (f" (read the warnings: {', '.join(warned)})" if warned else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
