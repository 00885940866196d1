"""Pass 3a, per step: op or module known, arguments (through the shared field checker), slot names,
channel-name syntax. Returns each step sound enough to plan with, its slots and channels bound;
``fusers.py``, ``widths.py`` and ``channels.py`` add the rest, each returning new steps. Reads plain
data: mappings are dicts (``config/resolved.py`` makes sure)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from te_assembly.analysis.plan import PlannedStep
from te_assembly.catalog import MODULE_ALLOWLIST, OPS, ModuleSpec, OpSpec
from te_assembly.config.schema import StepConfig, is_step_name
from te_assembly.diagnostics import Diagnostic, closest, did_you_mean, error, warning
from te_assembly.fields import check_value


def check_step(index: int, raw: Any, seen: dict[str, int]) -> tuple[PlannedStep | None, list[Diagnostic]]:
    """Check one entry of ``model.ops``. Returns the step when it is sound enough to plan with."""
    path = f"model.ops[{index}]"
    if not isinstance(raw, dict):
        return None, []  # reported by the structural check
    out: list[Diagnostic] = []
    name = raw.get("name")
    if isinstance(name, str):
        # Any identifier, Unicode and keywords included: a name is a dict key and a string in both engines
        # and in state-dict keys, never Python syntax; public inputs are ``<step>_<slot>``, never a keyword.
        if not is_step_name(name):
            out.append(
                error(
                    f"{path}.name",
                    "bad-name",
                    f"step name {name!r} must be a Python identifier (letters, digits, _; not starting "
                    "with a digit), or such names and use numbers joined by dots (layers.3.norm)",
                )
            )
        elif name in seen:
            out.append(
                error(
                    f"{path}.name",
                    "duplicate-name",
                    f"duplicate step name {name!r} (first used at model.ops[{seen[name]}])",
                )
            )
        else:
            seen[name] = index
    spec, kind, spec_diags = _resolve_spec(raw, path)
    out.extend(spec_diags)
    if spec is None or not isinstance(name, str):
        return None, out
    args = raw.get("args") or {}
    if not isinstance(args, dict):
        return None, out
    arg_diags = _check_args(spec, args, f"{path}.args")
    out.extend(arg_diags)
    full_args = spec.with_defaults(args)
    common: dict[str, Any] = {
        "index": index,
        "name": name,
        "kind": kind,
        "type": spec.name,
        "args": full_args,
        "args_valid": not arg_diags,
        "tie_weight": _tie(raw),
    }
    if isinstance(spec, ModuleSpec):
        for key in ("extra_inputs", "extra_outputs"):
            if raw.get(key):
                out.append(
                    error(
                        f"{path}.{key}",
                        "module-slots",
                        f"module {spec.name!r} is not a fusible op and has no extra tensor slots",
                    )
                )
        return PlannedStep(**common), out
    slots, slot_diags = _bind_slots(spec, full_args, raw, path, args_ok=not arg_diags)
    out.extend(slot_diags)
    return PlannedStep(**common, **slots), out


def _tie(raw: Mapping[str, Any]) -> str | None:
    """``tie_weight`` when it is a string (another type is the structural check's to report)."""
    value = raw.get("tie_weight")
    return value if isinstance(value, str) else None


def scope_clashes(seen: Mapping[str, int]) -> list[Diagnostic]:
    """A step named ``a`` and one named ``a.b``: ``steps.a`` would be both a step and a scope of steps."""
    out: list[Diagnostic] = []
    for name, index in seen.items():
        parts = name.split(".")
        for cut in range(1, len(parts)):
            outer = ".".join(parts[:cut])
            if outer in seen:
                out.append(
                    error(
                        f"model.ops[{index}].name",
                        "step-name-scope",
                        f"step name {name!r} lies inside step {outer!r} (model.ops[{seen[outer]}]): "
                        "parameters are named steps.<step>.*, so no step name may begin with another "
                        "step's name and a dot",
                        "rename one of them",
                    )
                )
                break
    return out


_KINDS = ("op", "module", "block")
_BLOCK_KEYS = ("repeat", "uses", "dims")
_STEP_KEYS = {f.name for f in dataclasses.fields(StepConfig)}


def _resolve_spec(
    raw: Mapping[str, Any], path: str
) -> tuple[OpSpec | ModuleSpec | None, str, list[Diagnostic]]:
    op, module = raw.get("op"), raw.get("module")
    if raw.get("block") is not None:
        return None, "", []  # a block step left unexpanded: the expansion (config/blocks.py) said why
    misplaced = [k for k in _BLOCK_KEYS if raw.get(k) is not None]
    if misplaced:
        msg = f"{misplaced[0]!r} goes with 'block' (a step that uses a block), not with an op or module"
        return None, "", [error(f"{path}.{misplaced[0]}", "block-key", msg)]
    if op is None and module is None and any(closest(k, _KINDS) for k in raw if k not in _STEP_KEYS):
        return None, "", []  # a misspelled 'op'/'module' key: the structural check suggests the fix
    if (op is None) == (module is None):
        msg = "a step needs exactly one of 'op' (fusible), 'module' (non-fusible) or 'block' (a block's uses)"
        return None, "", [error(f"{path}.op", "op-or-module", msg)]
    if not isinstance(op if op is not None else module, str):
        return None, "", []  # not a name at all (a list, a number): the structural check reports it
    if op is not None:
        if op in OPS:
            return OPS[op], "op", []
        hint = did_you_mean(op, OPS)
        if hint is None and op in MODULE_ALLOWLIST:
            hint = f"{op!r} is an allowlisted module: write 'module: {op}'"
        return None, "", [error(f"{path}.op", "unknown-op", f"unknown op {op!r}", hint)]
    if module in MODULE_ALLOWLIST:
        return MODULE_ALLOWLIST[module], "module", []
    hint = did_you_mean(module, MODULE_ALLOWLIST)
    msg = f"module {module!r} is not in the allowlist ({', '.join(sorted(MODULE_ALLOWLIST))})"
    return None, "", [error(f"{path}.module", "unknown-module", msg, hint)]


def _check_args(spec: OpSpec | ModuleSpec, args: Mapping[str, Any], path: str) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    by_name = spec.params_by_name
    names = list(by_name)
    # A misspelled argument is reported once, with its suggestion, not also as the missing one it meant.
    meant = {closest(key, names) for key in args if key not in by_name}
    for key in args:
        if key not in by_name:
            known = ", ".join(names) or "none"
            out.append(
                error(
                    f"{path}.{key}",
                    "unknown-arg",
                    f"{spec.name} has no argument {key!r} (arguments: {known})",
                    did_you_mean(key, names),
                )
            )
    for param in spec.params:
        if param.name not in args:
            if param.required and param.name not in meant:
                out.append(
                    error(
                        f"{path}.{param.name}",
                        "missing-arg",
                        f"{spec.name} needs argument {param.name!r} ({param.type_name})",
                    )
                )
        else:
            out.extend(check_value(param.spec, args[param.name], f"{path}.{param.name}"))
    if not out and (spec.arg_rules or spec.multiples):
        full = spec.with_defaults(args)
        out.extend(_arg_order(spec, full, path))
        out.extend(_multiples(spec, full, path))
    if not out and isinstance(spec, OpSpec):
        for arg, message, hint in spec.arg_checks(spec.with_defaults(args)):
            out.append(error(f"{path}.{arg}", "bad-args", f"{spec.name}: {message}", hint))
    return out


def _multiples(spec: OpSpec | ModuleSpec, args: Mapping[str, Any], path: str) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    for rule in spec.multiples:
        if rule.when is not None and not args.get(rule.when):
            continue
        value = args.get(rule.arg)
        of = rule.of if isinstance(rule.of, int) else args.get(rule.of)
        if not isinstance(value, int) or not isinstance(of, int) or of <= 0 or value % of == 0:
            continue
        named = str(of) if isinstance(rule.of, int) else f"{rule.of}={of}"
        condition = f" when {rule.when} is true" if rule.when is not None else ""
        out.append(
            error(
                f"{path}.{rule.arg}",
                "not-a-multiple",
                f"{spec.name} needs {rule.arg} to be a multiple of {named}{condition}, got "
                f"{rule.arg}={value}: {rule.why}",
                f"use a multiple of {of}"
                if isinstance(rule.of, int)
                else f"make {rule.arg} a multiple of {of}",
            )
        )
    return out


def _arg_order(spec: OpSpec | ModuleSpec, args: Mapping[str, Any], path: str) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    for smaller, larger, why in spec.arg_rules:
        low, high = args.get(smaller), args.get(larger)
        if isinstance(low, (int, float)) and isinstance(high, (int, float)) and low > high:
            out.append(
                error(
                    f"{path}.{smaller}",
                    "arg-order",
                    f"{spec.name} needs {smaller} <= {larger}, got {smaller}={low} and "
                    f"{larger}={high}: {why}",
                    f"set {smaller} to at most {high}",
                )
            )
    return out


def _bind_slots(
    spec: OpSpec, args: Mapping[str, Any], raw: Mapping[str, Any], path: str, args_ok: bool
) -> tuple[dict[str, Any], list[Diagnostic]]:
    """The step's slots and the channel bound to each (the ``PlannedStep`` fields), and what is wrong
    with the bindings as written."""
    out: list[Diagnostic] = []
    input_slots = spec.input_slots(args) if args_ok else spec.inputs
    output_slots = spec.output_slots(args) if args_ok else spec.outputs
    inputs = raw.get("extra_inputs") or {}
    outputs = raw.get("extra_outputs") or {}
    if isinstance(inputs, dict):
        for key, channel in inputs.items():
            out.extend(_slot_name_error(spec, args, key, f"{path}.extra_inputs.{key}", "input"))
            out.extend(_channel_name_error(channel, f"{path}.extra_inputs.{key}"))
    if isinstance(outputs, dict):
        for key, binding in outputs.items():
            out.extend(_slot_name_error(spec, args, key, f"{path}.extra_outputs.{key}", "output"))
            if isinstance(binding, dict):
                out.extend(_output_binding_errors(binding, f"{path}.extra_outputs.{key}"))
    input_channels = tuple(
        _as_channel(inputs.get(s.name)) if isinstance(inputs, dict) else None for s in input_slots
    )
    bindings = [outputs.get(s.name) if isinstance(outputs, dict) else None for s in output_slots]
    output_channels = tuple(_as_channel(b.get("channel")) if isinstance(b, dict) else None for b in bindings)
    output_public = tuple(
        not (isinstance(b, dict) and b.get("public") is False and _as_channel(b.get("channel")))
        for b in bindings
    )
    if spec.in_place_arg and args.get("in_place") is True and (any(input_channels) or any(output_channels)):
        out.append(
            warning(
                f"{path}.args.in_place",
                "in-place-endpoint",
                "in_place=True at a channel endpoint aliases the channel tensor: an in-place add "
                "can silently overwrite the producer's tensor (for MakeExtraOutput, the activation itself)",
                "use in_place: false unless a fusion needs it",
            )
        )
    slots = {
        "input_slots": input_slots,
        "output_slots": output_slots,
        "input_channels": input_channels,
        "output_channels": output_channels,
        "output_public": output_public,
    }
    return slots, out


def _as_channel(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _slot_name_error(
    spec: OpSpec, args: Mapping[str, Any], key: Any, path: str, kind: str
) -> list[Diagnostic]:
    slots = spec.inputs if kind == "input" else spec.outputs
    slot = next((s for s in slots if s.name == key), None)
    if slot is None:
        names = [s.name for s in slots]
        listed = ", ".join(names) if names else "none"
        return [
            error(
                path,
                "unknown-slot",
                f"{spec.name} has no extra {kind} slot {key!r} (its {kind} slots: {listed})",
                did_you_mean(key, names),
            )
        ]
    if not slot.enabled(args):
        needs = " and ".join(f"{a}=true" for a in slot.enabled_if)
        return [error(path, "disabled-slot", f"{spec.name} has the {kind} slot {key!r} only when {needs}")]
    return []


def _channel_name_error(channel: Any, path: str) -> list[Diagnostic]:
    if channel is None:
        return []
    if not isinstance(channel, str) or not channel:
        return [
            error(
                path,
                "bad-channel-name",
                f"a channel name must be a non-empty string or null, got {channel!r}",
            )
        ]
    return []


def _output_binding_errors(binding: Mapping[str, Any], path: str) -> list[Diagnostic]:
    out = _channel_name_error(binding.get("channel"), f"{path}.channel")
    if binding.get("public") is False and binding.get("channel") is None:
        out.append(
            error(
                f"{path}.public",
                "hidden-unnamed-output",
                "an output without a channel is always returned to the caller "
                "(TE forces output_to_caller=True when channel is None)",
                "give it a channel name, or drop 'public: false'",
            )
        )
    return out
