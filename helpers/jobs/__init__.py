"""Running jobs: start a script as real processes under torchrun, keep a record of the run,
stop it whole, and replay recorded runs where a machine cannot launch.

- ``launch``: :func:`launch` runs a script under ``python -m torch.distributed.run`` and
  returns a :class:`RunRecord`; :func:`launch_in_background` returns a :class:`BackgroundRun`
  (``background``) to look at while it goes.
- ``runs``: the run folder and its manifest (:class:`RunRecord`), the errors of a launch that
  did not end well, paths as a learner sees them.
- ``device``: CPU and gloo, or GPUs and nccl, and why (:func:`choose_device`).
- ``listeners``: the interface a run listens on, and what it measured listening.
- ``recorded``: recorded mode (``PDP_RECORDED=1``), and recording runs for it.
- ``lessons``: bring a script that an earlier lesson writes (:func:`script_from_lesson`).
- ``kineto_noise``: keep the profiler's harmless C++ log lines out of a notebook.
- private: ``_liverun`` (a launch followed to its end), ``_ranklogs`` (each rank's log
  files, read as they grow), ``_guard`` (stops a run whose launcher died).
"""

from .background import BackgroundRun
from .device import Device, choose_device
from .kineto_noise import hide_kineto_noise
from .launch import launch, launch_in_background, processes_of_run
from .lessons import script_from_lesson
from .listeners import (
    INTERFACE_VARIABLES,
    Listener,
    ListenerWatch,
    free_port,
    interface_address,
    loopback_interface,
)
from .recorded import (
    RECORDINGS_ROOT,
    RecordingMissing,
    recorded_traces,
    replay,
    use_recorded_runs,
)
from .runs import (
    CACHE_DIR,
    LaunchError,
    RankFailed,
    RendezvousTimedOut,
    RunInterrupted,
    RunRecord,
    RunTimedOut,
    new_run_dir,
    show_path,
    usable_cores,
)

__all__ = [
    "launch",
    "launch_in_background",
    "BackgroundRun",
    "processes_of_run",
    "choose_device",
    "Device",
    "RunRecord",
    "new_run_dir",
    "show_path",
    "usable_cores",
    "CACHE_DIR",
    "LaunchError",
    "RankFailed",
    "RunTimedOut",
    "RendezvousTimedOut",
    "RunInterrupted",
    "use_recorded_runs",
    "recorded_traces",
    "RecordingMissing",
    "RECORDINGS_ROOT",
    "replay",
    "INTERFACE_VARIABLES",
    "Listener",
    "ListenerWatch",
    "free_port",
    "interface_address",
    "loopback_interface",
    "script_from_lesson",
    "hide_kineto_noise",
]
