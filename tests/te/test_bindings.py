"""The TE engine's binding plan, as data: runs without TE. Expected calls are read off the YAML files."""

from __future__ import annotations

import pytest

from te_assembly.analysis.pipeline import load
from te_assembly.engines.te import SET_INPUT, SET_OUTPUT, BindingCall, binding_calls, gpu_only_steps
from te_assembly.engines.te.routing import rerouted_input_slots


def _in(step: str, slot: int, channel: str) -> BindingCall:
    return BindingCall(step, SET_INPUT, slot, channel)


def _out(step: str, slot: int, channel: str, to_caller: bool) -> BindingCall:
    return BindingCall(step, SET_OUTPUT, slot, channel, to_caller)


def test_moe_block_binding_plan() -> None:
    # configs/model/moe_block.yaml; slot indices in TE/catalog order (router: probs, routing_map,
    # aux_loss; dispatch in: probs, routing_map; dispatch out: split_sizes, row_probs, row_map).
    assert binding_calls(load("moe_block").checked_plan()) == [
        _out("residual", 0, "residual", False),
        _out("router", 0, "probs", False),
        _out("router", 1, "routing_map", False),
        _out("router", 2, "aux_loss", True),
        _in("dispatch", 0, "probs"),
        _in("dispatch", 1, "routing_map"),
        _out("dispatch", 0, "split_sizes", False),
        _out("dispatch", 1, "row_probs", False),
        _out("dispatch", 2, "row_map", False),
        _in("fc1", 0, "split_sizes"),
        _in("act", 0, "row_probs"),
        _in("fc2", 0, "split_sizes"),
        _in("fc2", 1, "row_probs"),  # scale_bias: fc2's bias is scaled by the router probability
        _in("combine", 0, "row_map"),
        _in("add_residual", 0, "residual"),
    ]


def test_two_stage_binding_plan() -> None:
    # configs/model/two_stage.yaml: bias_in's addend stays unbound (a public input, no call), the
    # Tanh module has no slots, stage2_in is both consumed and returned.
    assert binding_calls(load("two_stage").checked_plan()) == [
        _out("res1", 0, "res1", False),
        _in("add_res1", 0, "res1"),
        _out("stage2_in", 0, "stage2_in", True),
        _in("add_stage2_in", 0, "stage2_in"),
    ]


def test_binding_calls_cover_every_bound_slot_of_every_shipped_model() -> None:
    from te_assembly.config import available_models

    for name in available_models():
        plan = load(name).checked_plan()
        # A consumer of a channel rerouted from an earlier fuser stays unbound in TE (a public input
        # of its own fuser, fed by the engine).
        rerouted = rerouted_input_slots(plan)
        bound = {
            (s.name, kind, i, ch)
            for s in plan.steps
            for kind, chans in ((SET_INPUT, s.input_channels), (SET_OUTPUT, s.output_channels))
            for i, ch in enumerate(chans)
            if ch is not None and not (kind == SET_INPUT and (s.index, i) in rerouted)
        }
        calls = binding_calls(plan)
        assert {(c.step, c.method, c.slot_index, c.channel) for c in calls} == bound, name
        assert len(calls) == len(bound), name


@pytest.mark.parametrize(
    ("model", "kernels", "expected"),
    [
        (
            "moe_block",
            "te",
            ["norm (RMSNorm)", "fc1 (GroupedLinear)", "act (ScaledSwiGLU)", "fc2 (GroupedLinear)"],
        ),
        ("moe_block", "reference", []),
        ("channel_demo", "te", []),
        ("two_stage", "te", ["fc1 (Linear)", "fc2 (Linear)"]),
    ],
)
def test_gpu_only_steps(model: str, kernels: str, expected: list[str]) -> None:
    assert gpu_only_steps(load(model).checked_plan(), kernels) == expected


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def set_extra_input_channel(self, index: int, channel: str) -> None:
        self.calls.append(("in", index, channel))

    def set_extra_output_channel(self, index: int, channel: str, *, output_to_caller: bool) -> None:
        self.calls.append(("out", index, channel, output_to_caller))


def test_binding_call_apply_calls_te_setter_signature() -> None:
    rec = _Recorder()
    _in("a", 1, "ch").apply(rec)
    _out("a", 2, "o", False).apply(rec)
    assert rec.calls == [("in", 1, "ch"), ("out", 2, "o", False)]
