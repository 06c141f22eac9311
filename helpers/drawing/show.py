"""A figure shown in a notebook with the words that describe it."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

__all__ = ["show_figure"]


def show_figure(fig: Figure, alt: str) -> None:
    """Show ``fig`` in the notebook with ``alt``, a sentence that says what it shows, kept in
    the output's metadata as the image's alternative text (read by screen readers and written
    into the HTML of ``make run``); the figure is then closed, so that it is shown once."""
    from IPython.display import display  # a notebook's; the tests call it too

    if not alt.strip():
        raise ValueError("show_figure: say in alt what the figure shows")
    display(fig, metadata={"image/png": {"alt": " ".join(alt.split())}})
    plt.close(fig)
