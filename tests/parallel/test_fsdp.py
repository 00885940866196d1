"""``parallel.shard`` (FSDP2) under a real ``torchrun`` on CPU (gloo): training equals the single-process
run in float64 (losses and final weights), HSDP too; sharded DCP checkpoints resume on the same world,
on one process (2 -> 1) and from a single-process checkpoint (1 -> 2); a corrupt piece is refused; a
run refused for memory on one process trains sharded; ``export`` gathers a sharded run.

Every launch costs seconds, so runs are shared within a test where they can be.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from te_assembly.formats.checkpoint import list_checkpoints, model_state
from tests.parallel.test_torchrun import _losses, _ok, single, torchrun

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

# Two block uses (two FSDP2 units) plus a root holding the final norm and head.
MODEL = ["model=dense_transformer", "model.dims.hidden=32", "model.dims.ffn=64", "model.dims.heads=2"]
COMMON = ["engine=reference", "dtype=float64", "seed=3"]
TRAIN = [
    "train.steps=6",
    "train.batch_tokens=128",
    "train.seq_len=16",
    "train.checkpoint_every=3",
    "train.keep_checkpoints=4",
    "train.plot=false",
    "train.warmup_steps=2",
]
TOL = {"rtol": 1e-9, "atol": 1e-11}


def _train(out: str, *extra: str) -> list[str]:
    return ["train", *MODEL, *COMMON, *TRAIN, f"train.out_dir={out}", *extra]


def _weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    path = dict(list_checkpoints(run))[step]
    # TE's ops carry quantization metadata (``_extra_state``) that no other engine has.
    return {k: v for k, v in model_state(path)[1].items() if not k.endswith("._extra_state")}


def _same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        torch.testing.assert_close(a[name], b[name], **TOL, msg=lambda m, n=name: f"{n}: {m}")


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The single-process run every sharded run must reproduce."""
    root = tmp_path_factory.mktemp("fsdp")
    _ok(single(_train("single"), root))
    return root / "single"


def test_sharded_training_equals_one_process_and_resumes_on_one_process(
    baseline: Path, tmp_path: Path
) -> None:
    full = torchrun(_train("sharded", "parallel.shard=2"), tmp_path)
    _ok(full)
    assert "data 1 x shard 2 x tensor 1 x expert 1 = 2 process(es)" in full.stdout
    run = tmp_path / "sharded"
    torch.testing.assert_close(_losses(run), _losses(baseline), **TOL)
    # DCP directories, one safetensors file per rank and the manifest; no pickle anywhere.
    dirs = sorted(p.name for p in run.iterdir() if p.name.endswith(".dcp"))
    assert dirs == ["ckpt-0000003.dcp", "ckpt-0000006.dcp"]
    files = sorted(p.name for p in (run / dirs[-1]).iterdir())
    assert files == [
        "checkpoint.json",
        "shard-00001-model-00001-of-00001.safetensors",
        "shard-00002-model-00001-of-00001.safetensors",
    ]
    _same_weights(_weights(run, 6), _weights(baseline, 6))

    # 2 -> 1: a sharded run stopped at step 3, resumed by one process, gives the uninterrupted steps 4-6.
    half = tmp_path / "half"
    _ok(torchrun(_train("half", "parallel.shard=2", "train.stop_after=3"), tmp_path))
    resumed = single(_train("half", "train.resume=true"), tmp_path)
    _ok(resumed)
    assert "resumed from half/ckpt-0000003.dcp (step 3)" in resumed.stdout
    assert "another FSDP2 layout (parallel.shard: checkpoint 2, now 1)" in resumed.stdout
    torch.testing.assert_close(_losses(half), _losses(baseline), **TOL)
    _same_weights(_weights(half, 6), _weights(baseline, 6))

    # export gathers the sharded checkpoint into a plain pretrained directory.
    exported = single(["export", str(run), str(tmp_path / "pretrained")], tmp_path)
    _ok(exported)
    from te_assembly import from_pretrained

    model = from_pretrained(tmp_path / "pretrained", "reference")
    _same_weights({k: v.double() for k, v in model.state_dict().items()}, _weights(baseline, 6))


def test_one_process_checkpoint_resumes_sharded_and_hsdp_equals_one_process(
    baseline: Path, tmp_path: Path
) -> None:
    # 1 -> 2: a single-process safetensors checkpoint, resharded by DCP onto two FSDP2 ranks.
    _ok(single(_train("grow", "train.stop_after=3"), tmp_path))
    grown = torchrun(_train("grow", "parallel.shard=2", "train.resume=true"), tmp_path)
    _ok(grown)
    assert "another FSDP2 layout (parallel.shard: checkpoint 1, now 2)" in grown.stdout
    torch.testing.assert_close(_losses(tmp_path / "grow"), _losses(baseline), **TOL)
    _same_weights(_weights(tmp_path / "grow", 6), _weights(baseline, 6))

    # HSDP: shard within pairs of ranks, replicate across the two pairs.
    hsdp = torchrun(_train("hsdp", "parallel.shard=2", "parallel.data=2"), tmp_path, nproc=4, timeout=300)
    _ok(hsdp)
    torch.testing.assert_close(_losses(tmp_path / "hsdp"), _losses(baseline), **TOL)
    _same_weights(_weights(tmp_path / "hsdp", 6), _weights(baseline, 6))


def test_same_world_resume_is_exact_and_a_corrupt_piece_is_refused(baseline: Path, tmp_path: Path) -> None:
    _ok(torchrun(_train("r", "parallel.shard=2", "train.stop_after=3"), tmp_path))
    piece = tmp_path / "r" / "ckpt-0000003.dcp" / "shard-00002-model-00001-of-00001.safetensors"
    original = piece.read_bytes()
    flipped = bytearray(original)
    flipped[-5] ^= 0x01
    piece.write_bytes(bytes(flipped))
    refused = torchrun(
        _train("r", "parallel.shard=2", "train.resume=true", "train.resume_from=ckpt-0000003.dcp"), tmp_path
    )
    assert refused.returncode != 0
    assert "shard-00002-model-00001-of-00001.safetensors does not match its checksum" in refused.stderr
    piece.write_bytes(original)
    resumed = torchrun(_train("r", "parallel.shard=2", "train.resume=true"), tmp_path)
    _ok(resumed)
    assert "another FSDP2 layout" not in resumed.stdout  # same layout: each rank's RNG state restored
    torch.testing.assert_close(_losses(tmp_path / "r"), _losses(baseline), **TOL)
    _same_weights(_weights(tmp_path / "r", 6), _weights(baseline, 6))


def test_a_model_refused_for_memory_on_one_process_trains_sharded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's "done when": the refusal names the shard count that fits; two ranks train under the
    same per-process limit; one process resumes from the sharded checkpoint (with activation
    checkpointing, which also fits)."""
    big = ["model=dense_transformer", "model.dims.hidden=256", "model.dims.ffn=1024", "model.dims.layers=4"]
    args = ["train", *big, "engine=reference", "train.steps=2", "train.plot=false", "train.out_dir=big"]
    monkeypatch.setenv("TE_ASSEMBLY_MEMORY_LIMIT", str(80 * 2**20))  # per process: 89.7 MiB needed
    refused = single(args, tmp_path)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    message = " ".join(refused.stderr.split())
    assert "it fits with parallel.shard=2 (torchrun --nproc_per_node=2) or " in message
    assert "train.activation_checkpointing=blocks" in message
    assert not (tmp_path / "big").exists() or not list_checkpoints(tmp_path / "big")
    _ok(torchrun([*args, "parallel.shard=2", "train.stop_after=1"], tmp_path))
    resumed = single([*args, "train.resume=true", "train.activation_checkpointing=blocks"], tmp_path)
    _ok(resumed)
    assert "resumed from big/ckpt-0000001.dcp (step 1)" in resumed.stdout
    assert [step for step, _ in list_checkpoints(tmp_path / "big")] == [1, 2]


def test_run_under_fsdp2_says_what_it_cannot_record_and_equals_one_process(tmp_path: Path) -> None:
    """``run`` shows each channel's gradient from a flat forward; a sharded model runs in units, so it
    says so instead of failing, and its loss and gradient norm are one process's."""
    import re

    args = ["run", *MODEL, *COMMON, "run.tokens=64", "run.seq_len=16", "run.steps=2"]
    one, two = single(args, tmp_path), torchrun([*args, "parallel.shard=2"], tmp_path)
    _ok(one)
    _ok(two)
    assert "channel gradients are not recorded" in two.stdout
    summary = re.compile(r"engine reference: loss (\S+), parameter-gradient norm (\S+),")
    found = [summary.search(" ".join(r.stdout.split())) for r in (one, two)]
    assert all(found) and found[0].groups() == found[1].groups()  # type: ignore[union-attr]


@pytest.mark.te
def test_te_fusers_train_sharded_equal_to_one_process(baseline: Path, tmp_path: Path) -> None:
    """TE's real fusers (``kernels=reference``) under FSDP2: each fuser takes the gathered parameters
    (``TEModel.configure(sharded=True)``); without that its gradients would miss the FSDP2 reduction and
    the losses would drift from step 2 on."""
    pytest.importorskip("transformer_engine.pytorch", reason="needs Transformer Engine")
    args = [a for a in _train("te", "parallel.shard=2") if a != "engine=reference"]
    _ok(torchrun([*args, "engine=te", "kernels=reference"], tmp_path, timeout=300))
    torch.testing.assert_close(_losses(tmp_path / "te"), _losses(baseline), **TOL)
    _same_weights(_weights(tmp_path / "te", 6), _weights(baseline, 6))


@pytest.mark.te
def test_te_fusers_train_sharded_in_bfloat16(tmp_path: Path) -> None:
    """bf16 parameters through TE's fusers under FSDP2 (gathered in bf16, reduced in float32): the
    checkpoint holds bf16 weights, and losses and weights follow one process's bf16 run to bf16
    rounding (a couple of units in the last place after 6 AdamW steps)."""
    pytest.importorskip("transformer_engine.pytorch", reason="needs Transformer Engine")
    te = ["engine=te", "kernels=reference", "dtype=bfloat16", "seed=3"]

    def args(out: str, *extra: str) -> list[str]:
        return ["train", *MODEL, *te, *TRAIN, f"train.out_dir={out}", *extra]

    _ok(single(args("one"), tmp_path))
    _ok(torchrun(args("two", "parallel.shard=2"), tmp_path, timeout=300))
    torch.testing.assert_close(_losses(tmp_path / "two"), _losses(tmp_path / "one"), rtol=1e-3, atol=0)
    one, two = _weights(tmp_path / "one", 6), _weights(tmp_path / "two", 6)
    assert sorted(one) == sorted(two) and {v.dtype for v in two.values()} == {torch.bfloat16}
    for name in one:
        torch.testing.assert_close(
            two[name], one[name], rtol=2e-2, atol=4e-3, msg=lambda m, n=name: f"{n}: {m}"
        )


def test_kill_9_during_a_sharded_save_leaves_the_last_checkpoint(tmp_path: Path) -> None:
    from te_assembly.formats.checkpoint import remove_stale_temp, verify
    from te_assembly.jobs.train.run_dir import resume_point
    from tests.parallel._fsdp_worlds import save_then_die
    from tests.parallel._worlds import spawn_world

    with pytest.raises(Exception, match="SIGKILL"):
        spawn_world(2, save_then_die, str(tmp_path), timeout=120)
    entries = sorted(p.name for p in tmp_path.iterdir())
    assert entries[1:] == ["ckpt-0000001.dcp"], entries
    assert entries[0].startswith(".ckpt-0000002.dcp.") and entries[0].endswith(".tmp")
    assert (tmp_path / entries[0] / "checkpoint.json").is_file()  # complete, but never renamed into place
    assert verify(tmp_path / "ckpt-0000001.dcp").step == 1
    assert [step for step, _ in list_checkpoints(tmp_path)] == [1]
    path, _ = resume_point(tmp_path)
    assert path == tmp_path / "ckpt-0000001.dcp"
    assert remove_stale_temp(tmp_path) == [tmp_path / entries[0]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-0000001.dcp"]


MOE = ["model=moe_block", "model.dims.hidden=16", "model.dims.ffn=16"]
MOE_TRAIN = ["train.steps=6", "train.batch_tokens=64", "train.checkpoint_every=3", "train.plot=false"]


def _moe_train(out: str, *extra: str) -> list[str]:
    return ["train", *MOE, *COMMON, *MOE_TRAIN, "train.warmup_steps=2", f"train.out_dir={out}", *extra]


def _grad_norms(run: Path) -> list[float]:
    from te_assembly.jobs.train.metrics import read_records

    return [float(r["grad_norm"]) for r in read_records(run / "metrics.jsonl")]


def test_fsdp2_with_expert_parallelism_trains_resumes_and_reshards(tmp_path: Path) -> None:
    """``parallel.shard=2 parallel.expert=2`` on four processes equals ``parallel.data=2
    parallel.expert=2`` (the same four row shards, so the same per-shard router losses): losses, gradient
    norms and final weights. Its DCP checkpoints hold every expert under its global name, so a stopped
    sharded run resumes exactly on its own layout and onto the unsharded one, and exports whole."""
    import shutil

    _ok(torchrun(_moe_train("dp", "parallel.data=2", "parallel.expert=2"), tmp_path, nproc=4, timeout=300))
    sharded = ["parallel.shard=2", "parallel.expert=2"]
    cut = torchrun(_moe_train("fsdp", *sharded, "train.stop_after=3"), tmp_path, nproc=4, timeout=300)
    _ok(cut)
    assert "data 1 x shard 2 x tensor 1 x expert 2 = 4 process(es)" in cut.stdout
    assert "returned a view tensor" not in cut.stderr
    shutil.copytree(tmp_path / "fsdp", tmp_path / "moved")
    resumed = torchrun(_moe_train("fsdp", *sharded, "train.resume=true"), tmp_path, nproc=4, timeout=300)
    _ok(resumed)
    assert "another FSDP2 layout" not in resumed.stdout
    dp = tmp_path / "dp"
    torch.testing.assert_close(_losses(tmp_path / "fsdp"), _losses(dp), **TOL)
    torch.testing.assert_close(_grad_norms(tmp_path / "fsdp"), _grad_norms(dp), **TOL)
    _same_weights(_weights(tmp_path / "fsdp", 6), _weights(dp, 6))

    moved = torchrun(
        _moe_train("moved", "parallel.data=2", "parallel.expert=2", "train.resume=true"),
        tmp_path,
        nproc=4,
        timeout=300,
    )
    _ok(moved)
    assert "parallel.shard: checkpoint 2, now 1" in moved.stdout
    torch.testing.assert_close(_losses(tmp_path / "moved"), _losses(dp), **TOL)
    _same_weights(_weights(tmp_path / "moved", 6), _weights(dp, 6))

    _ok(single(["export", str(tmp_path / "fsdp"), str(tmp_path / "pretrained")], tmp_path))
    from te_assembly import from_pretrained

    model = from_pretrained(tmp_path / "pretrained", "reference")
    _same_weights({k: v.double() for k, v in model.state_dict().items()}, _weights(dp, 6))


def test_compiled_units_under_fsdp2_train_as_one_process(
    baseline: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``compile=true`` compiles each FSDP2 unit (a block use) on every rank: the same losses and weights.
    RoPE's float32 tables are cast in another order by inductor, hence a looser tolerance than above.
    A cache of its own shows that inductor compiled (and makes every run of this test a cold one)."""
    cache = tmp_path / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    args = _train("compiled", "parallel.shard=2", "compile=true", "train.stop_after=3")
    _ok(torchrun(args, tmp_path, timeout=400))
    assert any(cache.rglob("*.py")), "inductor generated no code: nothing was compiled"
    loose = {"rtol": 1e-6, "atol": 1e-8}
    torch.testing.assert_close(_losses(tmp_path / "compiled"), _losses(baseline)[:3], **loose)
    weights, expected = _weights(tmp_path / "compiled", 3), _weights(baseline, 3)
    assert sorted(weights) == sorted(expected)
    for name in weights:
        torch.testing.assert_close(weights[name], expected[name], **loose, msg=lambda m, n=name: f"{n}: {m}")
