"""Progress bars for long work: tqdm's auto bar, a widget in Jupyter (where ipywidgets is
installed; a text bar on stderr otherwise) and a text bar in a terminal.

By default a bar appears only where someone watches (a terminal, or a Jupyter kernel) and only
once the work has run for :data:`SHOW_AFTER_S`: short work prints nothing, and neither does work
whose stderr goes to a file or a pipe, nor any work while the environment variable
``PDP_NO_PROGRESS`` is set (to anything but ``0``). An explicit ``show=True`` or ``show=False``
overrides all of that.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

SHOW_AFTER_S = 2.0  # work that takes longer shows its bar (after this long)


def watched() -> bool:
    """Whether a default bar may appear: someone is likely to watch stderr (a terminal, or a
    Jupyter kernel), and ``PDP_NO_PROGRESS`` is not set."""
    if os.environ.get("PDP_NO_PROGRESS", "").strip() not in ("", "0"):
        return False
    if "ipykernel" in sys.modules:
        return True
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # no stderr, or a closed one
        return False


def progress_bar(total: int, what: str, unit: str, show: bool | None) -> Any:
    """A ``tqdm.auto.tqdm`` bar over ``total`` units of work, described as ``what``: shown from
    the start when ``show`` is True, never when it is False, and when it is None only where
    :func:`watched` and once the work has taken :data:`SHOW_AFTER_S` (nothing at all before).
    Call ``update()`` per unit done and ``close()`` at the end."""
    with warnings.catch_warnings():
        # in a kernel without ipywidgets, tqdm warns once on import and draws text instead
        warnings.simplefilter("ignore")
        from tqdm.auto import tqdm

    disable = not show if show is not None else not watched()
    delay = 0.0 if show else SHOW_AFTER_S
    return tqdm(total=total, desc=what, unit=unit, disable=disable, delay=delay, file=sys.stderr)
