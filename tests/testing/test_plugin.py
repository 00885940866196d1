"""te_assembly's pytest plugin in a user's own project (pytester): one test per model, block and
recipe of their config folder, failures shown as te_assembly's diagnostics, expectations and override
sets declared next to the configs, and the deeper levels."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from te_assembly.engines import te_available

MLP = """\
name: {name}
in_features: 32
dims: {{hidden: 32, ffn: 64}}
ops:
  - name: residual
    op: MakeExtraOutput
    extra_outputs:
      out: {{channel: residual, public: false}}
  - name: up
    op: Linear
    args: {{in_features: "${{model.dims.hidden}}", out_features: "${{mul:2,${{model.dims.ffn}}}}"}}
  - name: act
    op: SwiGLU
  - name: down
    op: Linear
    args: {{in_features: "${{model.dims.ffn}}", out_features: "${{model.dims.hidden}}"}}
  - name: add
    op: AddExtraInput
    extra_inputs: {{addend: {addend}}}
"""

BLOCK = """\
name: my_mlp
dims: {hidden: 32, ffn: 64}
ops:
  - name: residual
    op: MakeExtraOutput
    extra_outputs:
      out: {channel: residual, public: false}
  - name: up
    op: Linear
    args: {in_features: "${block.dims.hidden}", out_features: "${mul:2,${block.dims.ffn}}"}
  - name: act
    op: SwiGLU
  - name: down
    op: Linear
    args: {in_features: "${block.dims.ffn}", out_features: "${block.dims.hidden}"}
  - name: add
    op: AddExtraInput
    extra_inputs: {addend: residual}
"""

RECIPE = "kind: DelayedScaling\nname: my_fp8\namax_history_len: 16\n"


def _project(pytester: pytest.Pytester, ini: str = "", **files: str) -> Path:
    """A user's repository: ``configs/`` with ``files`` (``model/x.yaml`` -> text) and a pyproject."""
    for name, text in files.items():
        path = pytester.path / "configs" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    pytester.makepyprojecttoml(f'[tool.pytest.ini_options]\nte_configs = ["configs"]\n{ini}')
    return pytester.path / "configs"


def _good(name: str = "my_mlp") -> str:
    return MLP.format(name=name, addend="residual")


def _bad(name: str = "my_bad") -> str:
    return MLP.format(name=name, addend="residul")


def test_inert_unless_asked_for(pytester: pytest.Pytester) -> None:
    (pytester.path / "configs" / "model").mkdir(parents=True)
    (pytester.path / "configs" / "model" / "my_mlp.yaml").write_text(_good())
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("-q", "--co")
    assert "my_mlp.yaml" not in result.stdout.str()
    result.assert_outcomes()  # --co: nothing run
    assert "1 test collected" in result.stdout.str()


def test_one_test_per_config_and_recipe_pairing(pytester: pytest.Pytester) -> None:
    _project(
        pytester, **{"model/my_mlp.yaml": _good(), "block/my_mlp.yaml": BLOCK, "recipe/my_fp8.yaml": RECIPE}
    )
    result = pytester.runpytest_subprocess("-v", "-p", "no:cacheprovider")
    out = result.stdout.str()
    for node in (
        "configs/model/my_mlp.yaml::validate PASSED",
        "configs/block/my_mlp.yaml::validate PASSED",
        "configs/recipe/my_fp8.yaml::validate PASSED",
        "configs/recipe/my_fp8.yaml::with[my_mlp] PASSED",
    ):
        assert node in out, out
    result.assert_outcomes(passed=4)


def test_a_broken_config_fails_with_the_diagnostic_not_a_traceback(pytester: pytest.Pytester) -> None:
    folder = _project(pytester, **{"model/my_bad.yaml": _bad()})
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    line = next(n for n, text in enumerate(_bad().splitlines(), 1) if "residul" in text)
    assert f"{folder / 'model' / 'my_bad.yaml'}:{line}: error: model.ops[4].extra_inputs.addend" in out, out
    assert "has no producer (did you mean 'residual'?)" in out
    assert "Traceback" not in out and "def runtest" not in out


def test_an_invalid_model_is_reported_once_not_again_with_each_recipe(pytester: pytest.Pytester) -> None:
    _project(pytester, **{"model/my_bad.yaml": _bad(), "recipe/my_fp8.yaml": RECIPE})
    result = pytester.runpytest_subprocess("-v", "-rs", "-p", "no:cacheprovider")
    out = result.stdout.str()
    assert "configs/model/my_bad.yaml::validate FAILED" in out, out
    assert "configs/recipe/my_fp8.yaml::with[my_bad] SKIPPED" in out, out
    assert "my_bad.yaml is itself invalid (its own validate item reports it)" in out
    assert out.count("has no producer") == 1, out
    result.assert_outcomes(passed=1, failed=1, skipped=1)


def test_a_recipe_that_breaks_an_invalid_model_further_still_fails(pytester: pytest.Pytester) -> None:
    bad_recipe = "kind: DelayedScaling\nname: my_fp8\namax_history_len: 0\n"
    _project(pytester, **{"model/my_bad.yaml": _bad(), "recipe/my_fp8.yaml": bad_recipe})
    result = pytester.runpytest_subprocess("-v", "-p", "no:cacheprovider")
    out = result.stdout.str()
    assert "configs/model/my_bad.yaml::validate FAILED" in out, out
    assert "configs/recipe/my_fp8.yaml::validate FAILED" in out, out
    assert "configs/recipe/my_fp8.yaml::with[my_bad] FAILED" in out, out
    assert "error(s) the recipe adds" in out and "amax_history_len" in out, out


def test_expected_diagnostics_met_missing_and_extra(pytester: pytest.Pytester) -> None:
    expect_met = "diagnostics:\n  - {code: dangling-input, path: 'model.ops[4].extra_inputs.addend'}\n"
    expect_wrong = "diagnostics:\n  - {code: dangling-inptu, path: 'model.ops[4].extra_inputs.addend'}\n"
    _project(
        pytester,
        **{
            "model/met.yaml": _bad("met"),
            "model/met.expect.yaml": expect_met,
            "model/wrong.yaml": _bad("wrong"),
            "model/wrong.expect.yaml": expect_wrong,
            "model/clean.yaml": _good("clean"),
            "model/clean.expect.yaml": expect_met,
        },
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA")
    result.assert_outcomes(passed=1, failed=2)
    out = result.stdout.str()
    assert "PASSED configs/model/met.yaml::validate" in out
    # wrong: the expected one is missing (a typo of a real code: did-you-mean), the real one is extra
    assert "error dangling-inptu at model.ops[4].extra_inputs.addend (did you mean 'dangling-input'?)" in out
    assert "reported, not expected:" in out and "'residul' consumed by step 'add' has no producer" in out
    # clean: nothing reported, one expected
    assert "expected, not reported:" in out


def test_override_sets_are_tests_of_their_own(pytester: pytest.Pytester) -> None:
    ini = 'te_configs_overrides = ["-", "model.dims.hidden=48", "model.dims.ffn=40 model.dims.hidden=40"]\n'
    sidecar = "overrides:\n  - [model.dims.ffn=16]\n  - []\n"
    _project(
        pytester,
        ini,
        **{"model/a.yaml": _good("a"), "model/b.yaml": _good("b"), "model/b.expect.yaml": sidecar},
    )
    result = pytester.runpytest_subprocess("-v", "-p", "no:cacheprovider")
    out = result.stdout.str()
    for node in (
        "configs/model/a.yaml::validate[as written] PASSED",
        "configs/model/a.yaml::validate[model.dims.hidden=48] FAILED",  # in_features stays 32
        "configs/model/a.yaml::validate[model.dims.ffn=40 model.dims.hidden=40] FAILED",
        "configs/model/b.yaml::validate[model.dims.ffn=16] PASSED",
        "configs/model/b.yaml::validate[as written] PASSED",
    ):
        assert node in out, out
    assert "width-mismatch" in out or "width" in out
    result.assert_outcomes(passed=3, failed=2)


def test_a_yaml_syntax_error_is_one_failing_item_with_its_line(pytester: pytest.Pytester) -> None:
    broken = _good("broken").replace("  - name: act\n", "  - name: act\n   op: [\n")
    folder = _project(pytester, **{"model/broken.yaml": broken})
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert f"{folder / 'model' / 'broken.yaml'}:" in out and "Traceback" not in out
    assert "yaml" in out.lower() or "syntax" in out.lower()


def test_a_bad_sidecar_is_reported_as_such(pytester: pytest.Pytester) -> None:
    _project(pytester, **{"model/a.yaml": _good("a"), "model/a.expect.yaml": "diagnostic: []\n"})
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    assert "a.expect.yaml: diagnostic: unknown key" in result.stdout.str()


def test_deeper_levels_have_their_markers(pytester: pytest.Pytester) -> None:
    ini = 'te_configs_levels = ["build", "smoke", "te"]\n'
    _project(pytester, ini, **{"model/my_mlp.yaml": _good(), "model/my_bad.yaml": _bad()})
    result = pytester.runpytest_subprocess("-v", "-p", "no:cacheprovider", "-m", "build or smoke", "-rs")
    out = result.stdout.str()
    assert (
        "configs/model/my_mlp.yaml::build PASSED" in out and "configs/model/my_mlp.yaml::smoke PASSED" in out
    )
    assert "configs/model/my_bad.yaml::build FAILED" in out  # a model that does not validate cannot build
    result = pytester.runpytest_subprocess("-v", "-p", "no:cacheprovider", "-m", "te", "-rs")
    out = result.stdout.str()
    if te_available():
        assert "configs/model/my_mlp.yaml::te PASSED" in out, out
    else:
        assert "Transformer Engine does not import here" in out, out


def test_memory_target(pytester: pytest.Pytester) -> None:
    huge = _good("huge").replace("dims: {hidden: 32, ffn: 64}", "dims: {hidden: 32, ffn: 4000000000}")
    _project(pytester, **{"model/small.yaml": _good("small"), "model/huge.yaml": huge})
    result = pytester.runpytest_subprocess(
        "-v", "-p", "no:cacheprovider", "--te-configs-target", "h100", "-k", "fits"
    )
    out = result.stdout.str()
    assert "configs/model/small.yaml::fits[h100] PASSED" in out
    assert "configs/model/huge.yaml::fits[h100] FAILED" in out
    assert "does not fit a H100 SXM" in out and "parameters" in out, out
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--te-configs-target", "h1000", "-k", "fits"
    )
    assert "unknown memory target 'h1000'" in result.stdout.str()


def test_a_folder_with_symlink_loops_is_walked_once_with_the_reader_s_rules(
    pytester: pytest.Pytester,
) -> None:
    """Links to folders above (two of them, which would make the walk exponential) are not walked; a
    model that is a link out of the folder fails with the reader's refusal; a link inside it is read."""
    folder = _project(pytester, **{"model/my_mlp.yaml": _good(), "block/my_mlp.yaml": BLOCK})
    (folder / "model" / "up").symlink_to("..")
    (folder / "block" / "again").symlink_to("../model")
    (folder / "model" / "loop").symlink_to("loop")  # a link to itself
    elsewhere = pytester.path / "elsewhere.yaml"
    elsewhere.write_text(_good("theirs"))
    (folder / "model" / "theirs.yaml").symlink_to(elsewhere)
    (folder / "model" / "same.yaml").symlink_to("my_mlp.yaml")
    result = pytester.runpytest_subprocess("-v", "-p", "no:cacheprovider", timeout=120)
    out = result.stdout.str()
    assert "configs/model/my_mlp.yaml::validate PASSED" in out
    assert "configs/model/same.yaml::validate PASSED" in out
    assert "configs/model/theirs.yaml::read FAILED" in out and "outside" in out
    result.assert_outcomes(passed=3, failed=1)  # my_mlp, same, the block; theirs refused
