"""The table of kinds: one definition that the loader, the analysis and the plots all use."""

import re

import pytest
from matplotlib.colors import to_rgb

from helpers.analysis import steps
from helpers.drawing import timeline
from helpers.traces.kinds import KIND_COLORS, KIND_NAMES, KINDS, event_kind


def test_every_kind_has_a_name_a_colour_a_layer_and_a_rule_in_words():
    for kind in KINDS:
        assert kind.name and kind.recognised_by
        to_rgb(kind.colour)  # a valid colour
        assert isinstance(kind.layer, int)
        assert kind.categories or kind.names or kind.name == "other", kind.name
        if kind.names:
            re.compile(kind.names)


def test_kinds_have_distinct_names_colours_and_layers():
    assert len({k.name for k in KINDS}) == len(KINDS)
    assert len({k.colour for k in KINDS}) == len(KINDS)
    assert len({k.layer for k in KINDS}) == len(KINDS)


def test_communication_is_drawn_on_top_and_containers_behind():
    layer = {k.name: k.layer for k in KINDS}
    assert layer["communication"] == max(layer.values())
    assert layer["step"] < layer["annotation"] < layer["compute"]


@pytest.mark.parametrize(
    "name, cat, kind",
    [
        ("ProfilerStep#3", "user_annotation", "step"),
        ("ProfilerStep#3", "gpu_user_annotation", "annotation"),  # its copy on a stream
        ("aten::mm", "cpu_op", "compute"),
        ("aten::rand", "", "compute"),  # the legacy profiler leaves the category out
        ("gloo:all_reduce", "user_annotation", "communication"),
        ("c10d::allreduce_", "cpu_op", "communication"),
        ("_c10d_functional::all_reduce", "cpu_op", "communication"),  # DTensor's, issued
        ("_c10d_functional::wait_tensor", "cpu_op", "communication"),  # and waited for
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", "communication"),
        ("rpc_async#udf(worker0 -> worker1)", "user_annotation", "communication"),
        ("rpc_async#udf(worker0 -> worker1)#remote_op: aten::mul", "", "compute"),
        ("rpc_async#udf(worker0 -> worker1)#remote_op: server: udf call 0", "", "annotation"),
        ("Optimizer.step#SGD.step", "user_annotation", "optimizer"),
        (
            "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
            "user_annotation",
            "data loading",
        ),
        ("DistributedDataParallel.forward", "user_annotation", "annotation"),
        ("volta_sgemm_128x64_nn", "kernel", "gpu kernel"),
        ("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", "gpu memory"),
        ("cudaLaunchKernel", "cuda_runtime", "cuda runtime"),
        ("nn.Module: ResNet_0", "python_function", "python"),
        ("PyTorch Profiler (0)", "Trace", "other"),
    ],
)
def test_each_event_is_recognised_as_its_kind(name, cat, kind):
    assert event_kind(name, cat) == kind


def test_the_loader_the_analysis_and_the_plots_use_the_table(two_ranks):
    assert list(two_ranks["kind"].cat.categories) == KIND_NAMES
    assert timeline.KIND_COLORS is KIND_COLORS
    assert steps.KIND_NAMES is KIND_NAMES
