"""A ``HFSpec`` as te_assembly YAML, and a te_assembly model's plan back as a ``HFSpec``.

Import writes a model of one of the shipped ``hf_*_layer`` blocks (``configs/block/``) with every
number and flag of the checkpoint as a dim, so the file reads like the ``config.json`` it came from and
a person can edit it. Export goes the other way and is exact: a model is exportable when the spec read
off its steps, written out again, gives the very same steps (types, arguments, channel wiring); the
first step that differs is named. So a model never exports as something it is not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from te_assembly.analysis.plan import Plan, PlannedStep
from te_assembly.errors import ArgumentError
from te_assembly.formats.hf.config import HFSpec
from te_assembly.formats.hf.families import FAMILIES, REGISTRY, Family
from te_assembly.formats.hf.families.attention import ROPE_KNOBS, rope_dims_of
from te_assembly.formats.hf.families.base import Layer, args_of


def block_of(spec: HFSpec, dense: bool = False) -> str:
    """The shipped block of ``spec``'s layers (``dense``: its first, dense, layers)."""
    return FAMILIES[spec.architecture].block(dense)


def layer_dims(spec: HFSpec) -> dict[str, Any]:
    """The block's dims for ``spec`` (every one of them, so the model file shows them all)."""
    return FAMILIES[spec.architecture].dims(spec)


def model_config(spec: HFSpec, name: str, description: str | None = None) -> dict[str, Any]:
    """The te_assembly model (what a ``model/<name>.yaml`` holds) for ``spec``."""
    head: dict[str, Any] = {
        "name": "head",
        "op": "Linear",
        "args": {"in_features": "${model.dims.hidden}", "out_features": "${model.dims.vocab}", "bias": False},
    }
    if spec.tied:
        head["tie_weight"] = "embed"
    layer = layer_dims(spec)
    layers = _layers_step(spec, layer)
    dims: dict[str, Any] = {"vocab": spec.vocab, "layers": spec.layers - spec.first_dense, **layer}
    if "uses" in layers:
        del dims["layers"]  # one use per layer, each with its window
    dims.update({f"local_{k}": v for k, v in _local_rope(spec).items()})
    dense: list[dict[str, Any]] = []
    if spec.first_dense:
        # The first layers are dense (GLM-4.5's first_k_dense_replace): their own block step, before the
        # MoE layers; the Hugging Face layer of layers.N is model.layers.{dense_layers + N}.
        dims = {"vocab": spec.vocab, "dense_layers": spec.first_dense, **dims, "dense_ffn": spec.dense_ffn}
        attention = FAMILIES[spec.architecture].attention_dims_names
        shared = {key: f"${{model.dims.{key}}}" for key in layer if key in attention}
        dense.append(
            {
                "name": "dense_layers",
                "block": block_of(spec, dense=True),
                "repeat": "${model.dims.dense_layers}",
                "dims": {**shared, "ffn": "${model.dims.dense_ffn}", "mlp_bias": False},
            }
        )
    norm_args: dict[str, Any] = {"normalized_shape": "${model.dims.hidden}", "eps": "${model.dims.eps}"}
    if spec.zero_centered:
        norm_args["zero_centered_gamma"] = True
    capped = [{"name": "logit_softcap", "op": "Softcap", "args": {"cap": spec.final_softcap}}]
    return {
        "name": name,
        "description": description or f"{spec.architecture} as te_assembly blocks ({block_of(spec)}).",
        "in_features": "${model.dims.vocab}",
        "input_layout": "token_ids",
        "dims": dims,
        "ops": [
            {
                "name": "embed",
                "module": "Embedding",
                "args": {
                    "num_embeddings": "${model.dims.vocab}",
                    "embedding_dim": "${model.dims.hidden}",
                    "init_std": spec.init_std,
                    **_padding(spec),
                },
            },
            *_before_layers(spec),
            *dense,
            layers,
            *_mtp_steps(spec, layers, norm_args),
            {"name": "final_norm", "op": "RMSNorm", "args": norm_args},
            head,
            *(capped if spec.final_softcap is not None else []),
        ],
    }


def _before_layers(spec: HFSpec) -> list[dict[str, Any]]:
    """What follows the embedding: Gemma's scaling; the embeddings kept for the MTP modules."""
    scaled = [{"name": "embed_scale", "op": "ConstantScale", "args": {"scale": spec.embed_scale}}]
    kept = [{"name": "embeds", "op": "MakeExtraOutput", "extra_outputs": {"out": {"channel": "embeds"}}}]
    return (scaled if spec.embed_scale is not None else []) + (kept if spec.mtp_modules else [])


MTP_PREFIX = "mtp"
"""The steps of the multi-token prediction modules: ``mtp_trunk``, then ``mtp<k>_*`` and the decoder
layer ``mtp<k>.0.*`` of each."""


def _mtp_steps(spec: HFSpec, layers: dict[str, Any], norm_args: dict[str, Any]) -> list[dict[str, Any]]:
    """DeepSeek-V3's multi-token prediction modules, after the last layer and before the final norm: the
    layers' output is kept (``mtp_trunk``); module k joins RMSNorm(its hidden input: the layers' output,
    or module k - 1's) after RMSNorm(the embeddings of the tokens k places on), projects them back to
    the hidden width (``eh_proj``), runs one decoder layer of the model's own block, normalises and
    projects onto the vocabulary with the model's head, and hands those logits to the caller
    (``AheadLogits``, depth k). The main path then resumes with the kept output."""
    if not spec.mtp_modules:
        return []
    layer = {"block": layers["block"], "repeat": 1, "dims": layers["dims"]}
    kept = {"name": "mtp_trunk", "op": "MakeExtraOutput", "extra_outputs": {"out": {"channel": "mtp_trunk"}}}
    return [kept] + [
        step
        for k in range(1, spec.mtp_modules + 1)
        for step in _mtp_module(k, k == spec.mtp_modules, layer, norm_args, "embed" if spec.tied else "head")
    ]


def _mtp_module(
    k: int, last: bool, layer: dict[str, Any], norm_args: dict[str, Any], head: str
) -> list[dict[str, Any]]:
    """Module ``k``'s steps (``_mtp_steps``); ``last``: the main path resumes with the layers' output after
    it, else with its own output (the next module's hidden input); ``head``: the step whose weight its
    vocabulary head shares."""
    hidden = "${model.dims.hidden}"
    resume = (
        []
        if last
        else [
            {
                "name": f"mtp{k}_out",
                "op": "MakeExtraOutput",
                "extra_outputs": {"out": {"channel": f"mtp{k}_out"}},
            }
        ]
    )
    return [
        {"name": f"mtp{k}_hnorm", "op": "RMSNorm", "args": norm_args},
        {
            "name": f"mtp{k}_embeds",
            "op": "SwapExtraInput",
            "args": {"value_features": hidden},
            "extra_inputs": {"value": "embeds"},
            "extra_outputs": {"out": {"channel": f"mtp{k}_hidden"}},
        },
        {"name": f"mtp{k}_shift", "op": "ShiftTokens", "args": {"by": k}},
        {"name": f"mtp{k}_enorm", "op": "RMSNorm", "args": norm_args},
        {
            "name": f"mtp{k}_concat",
            "op": "ConcatExtraInput",
            "args": {"in_features": hidden, "tail_features": hidden},
            "extra_inputs": {"tail": f"mtp{k}_hidden"},
        },
        {
            "name": f"mtp{k}_proj",
            "op": "Linear",
            "args": {"in_features": f"${{mul:2,{hidden}}}", "out_features": hidden, "bias": False},
        },
        {"name": f"mtp{k}", **layer},
        *resume,
        {"name": f"mtp{k}_norm", "op": "RMSNorm", "args": norm_args},
        {
            "name": f"mtp{k}_head",
            "op": "Linear",
            "args": {"in_features": hidden, "out_features": "${model.dims.vocab}", "bias": False},
            "tie_weight": head,
        },
        {
            "name": f"mtp{k}_logits",
            "op": "AheadLogits",
            "args": {"depth": k, "value_features": hidden},
            "extra_inputs": {"value": "mtp_trunk" if last else f"mtp{k}_out"},
            "extra_outputs": {"logits": {"channel": f"mtp{k}_logits", "public": True}},
        },
    ]


def _local_rope(spec: HFSpec) -> dict[str, Any]:
    """The rotary dims of the sliding-window layers that differ from the others' (Gemma 3's)."""
    if not spec.local_rope:
        return {}
    mine, theirs = rope_dims_of(spec.local_rope), rope_dims_of(spec.rope)
    return {k: v for k, v in mine.items() if theirs.get(k) != v}


def _padding(spec: HFSpec) -> dict[str, int]:
    """The embedding's ``padding_idx``: ``pad_token_id``, whose row transformers' ``nn.Embedding`` gives
    no gradient (every family builds its embedding so), when it is an id of the vocabulary."""
    pad = spec.metadata.get("pad_token_id")
    if isinstance(pad, int) and not isinstance(pad, bool) and 0 <= pad < spec.vocab:
        return {"padding_idx": pad}
    return {}


def _layers_step(spec: HFSpec, layer: dict[str, Any]) -> dict[str, Any]:
    """The model step of the (MoE or only) layers: ``repeat`` uses alike, or, when the layers' windows
    differ (GPT-OSS's ``layer_types``), one use per layer with its own ``sliding_window``."""
    step: dict[str, Any] = {"name": "layers", "block": block_of(spec)}
    windows = spec.layer_windows
    if len(set(windows)) < 2:
        step["repeat"] = "${model.dims.layers}"
        step["dims"] = {key: f"${{model.dims.{key}}}" for key in layer}
        return step
    step["dims"] = {key: f"${{model.dims.{key}}}" for key in layer if key != "sliding_window"}
    window = "${model.dims.sliding_window}"
    local = {k: f"${{model.dims.local_{k}}}" for k in _local_rope(spec)}
    step["uses"] = [
        {"dims": {"sliding_window": window, **local} if w is not None else {"sliding_window": None}}
        for w in windows
    ]
    return step


def _effective(step: PlannedStep) -> dict[str, Any]:
    """The arguments that change what the step computes: an Attention's qk_norm_eps without qk_norm,
    or a RoPE knob its rope_type does not read, is left out."""
    args = args_of(step)
    if step.type not in ("Attention", "LatentAttention"):
        return args
    unread = {"qk_norm_eps"} if not args.get("qk_norm") else set()
    used = ROPE_KNOBS.get(str(args.get("rope_type")), ())
    unread |= {k for knobs in ROPE_KNOBS.values() for k in knobs if k not in used}
    return {k: v for k, v in args.items() if k not in unread}


LAYER_STEP = re.compile(r"^(.+\.\d+)\.[^.]+$")
"""A decoder layer's step: ``<use>.<N>.<step>``."""


class Outline:
    """A model's steps as a Hugging Face causal LM has them: the embedding, what follows it before the
    first layer (Gemma's scaling), the decoder layers (by ``<use>.<N>.`` prefix), the multi-token
    prediction modules (``mtp``), the final norm, the head and what follows it (Gemma 2's
    soft-capping)."""

    def __init__(self, plan: Plan) -> None:
        steps = list(plan.steps)
        if len(steps) < 4 or steps[0].type != "Embedding":
            raise UnexportableError(plan, steps[0] if steps else None, "the first step must be an Embedding")
        at = [
            i
            for i, step in enumerate(steps)
            if LAYER_STEP.match(step.name) and not step.name.startswith(MTP_PREFIX)
        ]
        if not at:
            raise UnexportableError(plan, steps[1], "the model has no decoder layers")
        self.embed, self.before = steps[0], steps[1 : at[0]]
        self.layers: dict[str, list[PlannedStep]] = {}
        for step in steps[at[0] : at[-1] + 1]:
            match = LAYER_STEP.match(step.name)
            if match is None:
                raise UnexportableError(
                    plan,
                    step,
                    "between the embedding and the final norm a Hugging Face model has decoder layers "
                    "only (block uses, named <use>.<N>.<step>)",
                )
            self.layers.setdefault(match.group(1), []).append(step)
        after = steps[at[-1] + 1 :]
        self.mtp = [s for s in after if s.name.startswith(MTP_PREFIX)]
        """The multi-token prediction modules' steps (``_mtp_steps``)."""
        self.mtp_modules = sum(s.type == "AheadLogits" for s in self.mtp)
        after = [s for s in after if s not in self.mtp]
        norms, heads = [s for s in after if s.type == "RMSNorm"], [s for s in after if s.type == "Linear"]
        if len(after) < 2 or not norms or not heads:
            raise UnexportableError(plan, after[0] if after else steps[-1], "a final RMSNorm and head end it")
        self.norm, self.head, self.after = norms[0], heads[0], after

    def only(self, steps: list[PlannedStep], type_: str, arg: str) -> Any:
        """``arg`` of the step of ``type_`` among ``steps`` (None without one)."""
        found = [args_of(s)[arg] for s in steps if s.type == type_]
        return found[0] if found else None


class UnexportableError(ArgumentError):
    """A model with no Hugging Face equivalent; the message names the step that has none."""

    def __init__(self, plan: Plan, step: PlannedStep | None, why: str) -> None:
        where = f"step {step.name!r} ({step.type})" if step is not None else "the model"
        super().__init__(f"{plan.name} has no Hugging Face equivalent: {where}: {why}")
        self.step = step.name if step is not None else None


def families_of(plan: Plan, metadata: Mapping[str, Any] | None = None) -> list[Family]:
    """The families whose kind ``plan``'s layers are, the imported one first when it is among them,
    then in ``REGISTRY``'s order (``UnexportableError`` when none is)."""
    groups = list(Outline(plan).layers.values())
    layer = _first_routed(plan, [Layer(group) for group in groups])[0]
    try:
        candidates = [f for f in REGISTRY if f.expresses(layer)]
    except (KeyError, IndexError, ValueError) as exc:
        why = f"its layer is not a Hugging Face decoder layer ({exc})"
        raise UnexportableError(plan, groups[0][0], why) from None
    if not candidates:
        why = f"no Hugging Face family has a decoder layer of {', '.join(sorted(layer.types))}"
        raise UnexportableError(plan, groups[0][0], why)
    wanted = (metadata or {}).get("architectures")
    first = [f for f in candidates if isinstance(wanted, list) and wanted and f.architecture == wanted[0]]
    return first + [f for f in candidates if f not in first]


def _first_routed(plan: Plan, layers: list[Layer]) -> tuple[Layer, int]:
    """The layer a spec is read from, and how many dense layers come before it (GLM-4.5's and
    DeepSeek-V3's first_k_dense_replace)."""
    first_dense = 0
    while layers[-1].routed and first_dense < len(layers) and not layers[first_dense].routed:
        first_dense += 1
    return layers[first_dense], first_dense


def spec_of_plan(plan: Plan, family: Family, metadata: Mapping[str, Any] | None = None) -> HFSpec:
    """The ``HFSpec`` a model's plan expresses as ``family`` (one of ``families_of``'s); whether the
    family expresses every argument is for ``check_same_steps`` to say. ``metadata``: an imported
    checkpoint's own fields, kept."""
    outline = Outline(plan)
    groups = list(outline.layers.values())
    layers = [Layer(group) for group in groups]
    layer, first_dense = _first_routed(plan, layers)
    try:
        own = family.from_plan(layer, layers)
        dense_ffn = 0
        if first_dense:
            dense_linears = [args_of(s) for s in layers[0].steps if s.type == "Linear"]
            fits = len(dense_linears) == family.attention_linears + 2
            dense_ffn = dense_linears[-1]["in_features"] if fits else 0
        eps = float(layer.args("RMSNorm")["eps"])
    except (KeyError, IndexError, ValueError) as exc:
        raise UnexportableError(
            plan, groups[0][0], f"its layer is not a Hugging Face decoder layer ({exc})"
        ) from None
    embed_args = args_of(outline.embed)
    metadata = dict(metadata or {})
    if embed_args.get("padding_idx") is not None:  # the id whose row gets no gradient, said as Hub does
        metadata["pad_token_id"] = embed_args["padding_idx"]
    return HFSpec(
        architecture=family.architecture,
        vocab=embed_args["num_embeddings"],
        hidden=embed_args["embedding_dim"],
        layers=len(layers),
        eps=eps,
        tied=outline.head.tie_weight is not None,
        embed_scale=outline.only(outline.before, "ConstantScale", "scale"),
        zero_centered=bool(args_of(outline.norm)["zero_centered_gamma"]),
        final_softcap=outline.only(outline.after, "Softcap", "cap"),
        first_dense=first_dense,
        dense_ffn=dense_ffn,
        mtp_layers=outline.mtp_modules,
        mtp_modules=outline.mtp_modules,
        init_std=float(embed_args["init_std"]),
        metadata=metadata,
        **own,
    )


def check_same_steps(plan: Plan, rebuilt: Plan, architecture: str) -> dict[str, str]:
    """``UnexportableError`` unless ``rebuilt`` (the spec of ``plan`` written out again) has ``plan``'s
    steps one for one: type, every argument, the wiring of every channel (by producer position) and
    ties. Returns rebuilt step name -> ``plan``'s step name."""
    mine, theirs = list(plan.steps), list(rebuilt.steps)
    what = f"{architecture} of this size"
    for index in range(max(len(mine), len(theirs))):
        if index >= len(mine) or index >= len(theirs):
            step = mine[index] if index < len(mine) else mine[-1]
            raise UnexportableError(plan, step, f"a {what} has {len(theirs)} steps, this model {len(mine)}")
        a, b = mine[index], theirs[index]
        if a.type != b.type or a.kind != b.kind:
            raise UnexportableError(plan, a, f"a {what} has a {b.type} here")
        args_a, args_b = _effective(a), _effective(b)
        for key in sorted(set(args_a) | set(args_b)):
            if args_a.get(key) != args_b.get(key):
                raise UnexportableError(
                    plan, a, f"{key}={args_a.get(key)!r} where a {what} has {key}={args_b.get(key)!r}"
                )
    names = {b.name: a.name for a, b in zip(mine, theirs, strict=True)}
    for index, (wa, wb) in enumerate(zip(_wiring(plan), _wiring(rebuilt), strict=True)):
        if wa != wb:
            raise UnexportableError(plan, mine[index], f"its channels are wired unlike a {what}'s")
    if [(s.tie_weight is None) for s in mine] != [(s.tie_weight is None) for s in theirs]:
        raise UnexportableError(plan, mine[-1], f"its weight ties differ from a {what}'s")
    return names


def _wiring(plan: Plan) -> list[tuple[Any, ...]]:
    """Each step's inputs as (slot, producer step position, producer slot, public) and outputs' publicity."""
    producer: dict[str, tuple[int, int]] = {}
    for step in plan.steps:
        for slot, channel in enumerate(step.output_channels):
            if channel is not None:
                producer[channel] = (step.index, slot)
    out = []
    for step in plan.steps:
        inputs = tuple(producer.get(c) if c is not None else None for c in step.input_channels)
        out.append((inputs, tuple(step.output_public)))
    return out
