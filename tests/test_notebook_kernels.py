"""The root conftest's start of a notebook's kernel under nbval: one more try where the kernel
died as it started, said with what it wrote; never a third."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import nbval.kernel
import pytest

REPO = Path(__file__).resolve().parents[1]
DIED = "Kernel died before replying to kernel_info"


@pytest.fixture
def root(monkeypatch):
    """The root conftest as a module of its own (loading it wraps nbval's function again: the
    wrapping is undone after the test)."""
    monkeypatch.setattr(nbval.kernel, "start_new_kernel", nbval.kernel.start_new_kernel)
    spec = importlib.util.spec_from_file_location("root_conftest", REPO / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kernel_that_dies(times: int, calls: list):
    """A stand-in for nbval's start that dies ``times`` times, writing to its stderr, then
    returns a manager and a client."""

    def start(*args, stderr, **kwargs):
        calls.append(stderr)
        if len(calls) <= times:
            stderr.write("zmq.error.ZMQError: Address already in use\n")
            stderr.flush()
            raise RuntimeError(DIED)
        return "manager", "client"

    return start


def test_a_kernel_that_dies_as_it_starts_is_started_again_with_what_it_wrote(root, monkeypatch):
    calls: list = []
    monkeypatch.setattr(root, "_start_new_kernel", kernel_that_dies(1, calls))
    with open(os.devnull, "w") as devnull, pytest.warns(UserWarning, match="Address already"):
        started = root.start_new_kernel(kernel_name="python", stderr=devnull)
    assert started == ("manager", "client")
    assert len(calls) == 2 and calls[1] is devnull  # the second start as nbval asked


def test_a_kernel_that_dies_twice_fails_the_notebook(root, monkeypatch):
    calls: list = []
    monkeypatch.setattr(root, "_start_new_kernel", kernel_that_dies(2, calls))
    with open(os.devnull, "w") as devnull, pytest.warns(UserWarning):
        with pytest.raises(RuntimeError, match=DIED):
            root.start_new_kernel(kernel_name="python", stderr=devnull)
    assert len(calls) == 2
