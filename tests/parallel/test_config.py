"""The ``parallel:`` section at config time: values, launch, divisibility with key paths, tensor-parallel
regions, expert rules, ``explain``'s per-rank view. No process group, no torch (checked)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import yaml

from te_assembly import load
from te_assembly.analysis.parallel.checks import launch_diagnostics, parallel_diagnostics, tokens_diagnostics
from te_assembly.analysis.parallel.launch import Launch, current_launch
from te_assembly.analysis.parallel.settings import ParallelSettings
from te_assembly.analysis.plan import Plan
from te_assembly.catalog import MODULE_ALLOWLIST, OPS
from te_assembly.catalog.sharding import EXPERT_ROLES, MODULE_SHARDING, SHARDING, TENSOR_ROLES
from tests.conftest import REPO_ROOT

SINGLE = Launch(0, 1, 0, under_torchrun=False)


def shipped(name: str, *overrides: str) -> Plan:
    return load(name, overrides).checked_plan()


def inline(text: str) -> Plan:
    # The model's own plan: no settings sections, so the layout checks are findings()'s alone.
    return load(yaml.safe_load(textwrap.dedent(text)), sections={}).checked_plan()


def findings(plan: Plan | None, **raw: Any) -> list[tuple[str, str]]:
    _, diags = parallel_diagnostics(raw, plan, launch=SINGLE)
    return [(d.path, d.code) for d in diags if d.is_error]


def messages(plan: Plan | None, **raw: Any) -> str:
    _, diags = parallel_diagnostics(raw, plan, launch=SINGLE)
    return "\n".join(d.format() for d in diags)


# ------------------------------------------------------------------------------------------ the section


def test_defaults_are_one_process() -> None:
    s = ParallelSettings()
    assert (s.world_size, s.is_parallel, s.row_shards) == (1, False, 1)
    assert ParallelSettings(data=2, tensor=3, expert=2).world_size == 12
    assert ParallelSettings(tensor=2, sequence=2).world_size == 2  # sequence reuses the tensor ranks


@pytest.mark.parametrize(
    ("raw", "path", "words"),
    [
        ({"dat": 2}, "parallel.dat", "did you mean 'data'"),
        ({"data": 0}, "parallel.data", "data must be positive, got 0"),
        ({"tensor": True}, "parallel.tensor", "tensor must be int, got bool (true)"),
        ({"backend": "mpi"}, "parallel.backend", "auto, gloo, nccl"),
        ({"timeout_s": -1}, "parallel.timeout_s", "timeout_s must be > 0"),
        ({"sequence": 2}, "parallel.sequence", "set parallel.tensor=2 too"),
        ({"data": 2, "fail_on_rank": 2}, "parallel.fail_on_rank", "only 2 rank"),
    ],
)
def test_bad_values_are_config_errors_at_their_key(raw: dict[str, Any], path: str, words: str) -> None:
    _, diags = parallel_diagnostics(raw, None, launch=SINGLE)
    assert [d.path for d in diags] == [path]
    assert words in diags[0].format()


def test_the_launch_must_match_the_sizes() -> None:
    s = ParallelSettings(data=2, expert=2)
    under = launch_diagnostics(s, Launch(0, 2, 0, under_torchrun=True))
    assert [d.code for d in under] == ["parallel-world-size"]
    assert "torchrun started 2 process(es)" in under[0].message and "need 4" in under[0].message
    alone = launch_diagnostics(s, SINGLE, command="train")
    assert [d.code for d in alone] == ["parallel-not-launched"]
    assert "torchrun --nproc_per_node=4 -m te_assembly train" in alone[0].format()
    assert launch_diagnostics(s, Launch(3, 4, 1, under_torchrun=True)) == []
    assert launch_diagnostics(ParallelSettings(), SINGLE) == []


def test_torchrun_environment_is_read() -> None:
    assert current_launch({}) == SINGLE
    launch = current_launch({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"})
    assert (launch.rank, launch.world_size, launch.local_rank, launch.is_main) == (3, 4, 1, False)
    assert launch.tag == "[rank 3/4] "


def test_batches_must_split_evenly_between_the_row_readers() -> None:
    assert tokens_diagnostics(ParallelSettings(data=2, expert=2), 64, "train.batch_tokens") == []
    bad = tokens_diagnostics(ParallelSettings(data=3), 64, "train.batch_tokens")
    assert [d.path for d in bad] == ["train.batch_tokens"] and "multiple of 3" in bad[0].format()
    # Sequence parallelism cuts each shard again between the tensor ranks; plain tensor parallelism does not.
    assert tokens_diagnostics(ParallelSettings(tensor=2), 3, "run.tokens") == []
    assert tokens_diagnostics(ParallelSettings(tensor=2, sequence=2), 3, "run.tokens") != []


# ------------------------------------------------------------------------------------------ divisibility


def test_tensor_divisibility_names_the_exact_keys() -> None:
    plan = shipped(
        "residual_mlp"
    )  # fc1 (ops[2]) column 64 -> 256 (SwiGLU halves), fc2 (ops[4]) row 128 -> 64
    assert findings(plan, tensor=2) == []
    assert findings(plan, tensor=3) == [
        ("model.ops[2].args.out_features", "parallel-indivisible"),
        ("model.ops[4].args.in_features", "parallel-indivisible"),
    ]
    # 12 features in 2 interleaved halves, each cut in 2: 12 % 4 == 0; fc2's 6 input features split in 2.
    assert findings(shipped("residual_mlp", "model.dims.ffn=6"), tensor=2) == []
    # 2 x 5 = 10 features in 2 GLU halves: each half (5) cannot be cut in two.
    odd = findings(shipped("residual_mlp", "model.dims.ffn=5"), tensor=2)
    assert ("model.ops[2].args.out_features", "parallel-indivisible") in odd
    assert "divisible by 4" in messages(shipped("residual_mlp", "model.dims.ffn=5"), tensor=2)


def test_expert_divisibility_names_every_expert_count() -> None:
    plan = shipped("moe_block")  # 4 experts
    assert findings(plan, expert=2) == [] and findings(plan, expert=4) == []
    assert findings(plan, expert=3) == [
        ("model.ops[3].args.num_experts", "parallel-indivisible"),
        ("model.ops[4].args.num_groups", "parallel-indivisible"),
        ("model.ops[6].args.num_groups", "parallel-indivisible"),
    ]


def test_the_cli_reports_layout_errors_with_file_and_line(run_cli: Any) -> None:
    done = run_cli(["validate", "parallel.expert=3"])
    assert done.returncode == 2
    assert "moe_block.yaml:" in done.stderr and "model.ops[4].args.num_groups" in done.stderr
    ok = run_cli(["validate", "model=residual_mlp", "parallel.tensor=2"])
    assert ok.returncode == 0, ok.stderr
    assert "launch torchrun --nproc_per_node=2" in ok.stdout


def test_work_commands_need_the_launch_their_sizes_ask_for(run_cli: Any) -> None:
    done = run_cli(["run", "parallel.data=2"])
    assert done.returncode == 2
    assert "torchrun --nproc_per_node=2 -m te_assembly run" in done.stderr


# ------------------------------------------------------------------------------------------ regions


REGION_BASE = """
name: regions
in_features: 8
ops:
{ops}
"""


def region(*ops: str) -> Plan:
    return inline(REGION_BASE.format(ops="\n".join(f"  - {op}" for op in ops)))


COL = "{name: up, op: Linear, args: {in_features: 8, out_features: 16, tensor_parallel_mode: column}}"
ROW = "{name: down, op: Linear, args: {in_features: 16, out_features: 8, tensor_parallel_mode: row}}"


@pytest.mark.parametrize(
    ("ops", "expected"),
    [
        ((COL, "{name: act, op: GELU}", ROW), []),
        (
            (ROW.replace("16", "8", 1),),
            [("model.ops[0].args.tensor_parallel_mode", "parallel-row-without-column")],
        ),
        (
            (COL, "{name: act, op: GELU}"),
            [("model.ops[0].args.tensor_parallel_mode", "parallel-unclosed-column")],
        ),
        (
            (COL, "{name: norm, op: LayerNorm, args: {normalized_shape: 16}}", ROW),
            [("model.ops[1].op", "parallel-needs-whole-features")],
        ),
        (
            (COL, "{name: mid, op: Linear, args: {in_features: 16, out_features: 16}}", ROW),
            [("model.ops[1].args.tensor_parallel_mode", "parallel-unmarked-linear")],
        ),
        (
            (
                COL,
                "{name: mid, op: Linear, "
                "args: {in_features: 16, out_features: 16, tensor_parallel_mode: column}}",
                ROW,
            ),
            [("model.ops[1].args.tensor_parallel_mode", "parallel-column-in-region")],
        ),
        ((COL, "{name: tanh, module: Tanh}", ROW), []),
        (
            (COL, "{name: lin, module: Linear, args: {in_features: 16, out_features: 16}}", ROW),
            [("model.ops[1].module", "parallel-needs-whole-features")],
        ),
    ],
)
def test_tensor_parallel_regions(ops: tuple[str, ...], expected: list[tuple[str, str]]) -> None:
    # Structure is checked at every size once a step is marked: a config is valid for all or for none.
    assert findings(region(*ops)) == expected
    assert findings(region(*ops), tensor=2) == expected


def test_a_channel_may_not_cross_into_a_tensor_parallel_region() -> None:
    plan = region(
        "{name: tap, op: MakeExtraOutput, extra_outputs: {out: {channel: skip, public: false}}}",
        "{name: up, op: Linear, args: {in_features: 8, out_features: 8, tensor_parallel_mode: column}}",
        "{name: add, op: AddExtraInput, extra_inputs: {addend: skip}}",
        "{name: down, op: Linear, args: {in_features: 8, out_features: 8, tensor_parallel_mode: row}}",
    )
    assert findings(plan, tensor=2) == [("model.ops[2].extra_inputs.addend", "parallel-channel-region")]


def test_a_public_output_may_not_be_a_feature_slice() -> None:
    plan = region(COL, "{name: tap, op: MakeExtraOutput}", ROW)
    assert findings(plan) == []  # nothing is split in one process
    assert findings(plan, tensor=2) == [("model.ops[1].extra_outputs.out", "parallel-public-split-features")]


def test_expert_rules() -> None:
    grouped = region(
        "{name: g, op: GroupedLinear, args: {num_groups: 2, in_features: 8, out_features: 8}}"
    )  # public split_sizes: groups that are not experts
    assert sorted(findings(grouped, expert=2)) == [
        ("model.ops[0].extra_inputs.split_sizes", "parallel-public-unsplittable"),
        ("model.ops[0].op", "parallel-experts-outside-dispatch"),
    ]
    assert findings(grouped) == []
    unpaired = region(
        "{name: d, op: Dispatch, args: {num_experts: 2, top_k: 1}, extra_outputs: "
        "{split_sizes: {channel: s, public: false}, row_probs: {channel: p, public: false}, "
        "row_map: {channel: m, public: false}}}",
        "{name: g, op: GroupedLinear, args: {num_groups: 2, in_features: 8, out_features: 8}, "
        "extra_inputs: {split_sizes: s}}",
        "{name: act, op: ScaledSwiGLU, extra_inputs: {scales: p}}",
        "{name: c, op: Combine, args: {top_k: 1}}",  # its row map from the caller, not from d
    )
    found = findings(unpaired, expert=2)
    assert ("model.ops[3].extra_inputs.row_map", "parallel-combine-unpaired") in found
    assert ("model.ops[0].extra_inputs.probs", "parallel-public-unsplittable") not in found


def test_tensor_size_without_marks_is_a_warning() -> None:
    _, diags = parallel_diagnostics({"tensor": 2}, shipped("moe_block"), launch=SINGLE)
    assert [(d.path, d.code, d.is_error) for d in diags] == [
        ("parallel.tensor", "parallel-nothing-split", False)
    ]


# ------------------------------------------------------------------------------------------ catalog, explain


def test_every_catalog_entry_says_how_it_shards() -> None:
    assert set(SHARDING) == set(OPS)
    assert set(MODULE_SHARDING) == set(MODULE_ALLOWLIST)
    for name, entry in [*SHARDING.items(), *MODULE_SHARDING.items()]:
        assert entry.tensor in TENSOR_ROLES and entry.expert in EXPERT_ROLES, name
        if entry.expert_count is not None and name in OPS:
            assert OPS[name].param(entry.expert_count) is not None, name
        for param, _dim in entry.split_params:
            assert name in OPS and param in OPS[name].param_shapes({"size": 4}), name


def test_explain_shows_each_ranks_slices(run_cli: Any) -> None:
    done = run_cli(["explain", "model=residual_mlp", "parallel.tensor=2"])
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "parallel layout: data 1 x tensor 2 x expert 1 = 2 process(es)" in out
    fc1 = next(line for line in out.splitlines() if "basic_ops.0.weight" in line and "256x64" in line)
    assert "128x64" in fc1 and "dim 0 split, 2 interleaved pieces" in fc1
    ranks = [line for line in out.splitlines() if line.strip().startswith("│    ") and "%" in line]
    # 64+64 (norm) + 128*64+128 (fc1 slice) + 64*64 (fc2 slice) + 64 (fc2 bias, whole) = 12,608 of 25,024
    assert len(ranks) == 2 and all("12,608" in line and "50%" in line for line in ranks), ranks
    experts = run_cli(["explain", "parallel.expert=2", "parallel.data=2"]).stdout
    assert "expert rank 1 as weight0" in experts
    assert experts.count("50,112") == 4
    assert "parameters per rank" not in run_cli(["explain"]).stdout


def test_config_time_checks_never_import_torch() -> None:
    script = textwrap.dedent(
        """
        import json, runpy, sys
        sys.argv = ["te_assembly", "explain", "model=residual_mlp", "parallel.tensor=2", "parallel.data=2"]
        try:
            runpy.run_module("te_assembly", run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            code = exc.code
        torch = sorted(m for m in sys.modules if m.split(".")[0] == "torch")[:3]
        print("RESULT " + json.dumps([code, torch]))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    assert json.loads(line.removeprefix("RESULT ")) == [0, []], proc.stderr
