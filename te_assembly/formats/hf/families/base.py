"""What a Hugging Face family is to te_assembly: one class that owns every direction of it.

A family says which ``config.json`` fields it reads (``fields``, beyond ``COMMON_FIELDS``) or holds to a
value (``checked``), reads them into a ``HFSpec`` (``read``), builds its model from its blocks
(``block``, ``dims``), names its tensors both ways (``rules``), writes its ``config.json`` back
(``config``), recognises a te_assembly model as one of its own for export (``expresses``, ``from_plan``),
and tells ``verify`` what of transformers' model to restate in float64 (``router_islands``).

A family is assembled from an attention part (``attention.py``: packed q | k | v heads, or DeepSeek's
latent attention) and an MLP part (``mlp.py``: dense, routed experts, a shared expert...), as
transformers' ``modular_*.py`` files assemble theirs; what is its own alone lives in its file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from te_assembly.formats.hf.families.fields import COMMON_FIELDS
from te_assembly.formats.hf.names import Part, Rule

if TYPE_CHECKING:
    from te_assembly.analysis.plan import PlannedStep
    from te_assembly.formats.hf.reader import ConfigReader
    from te_assembly.formats.hf.spec import HFSpec

Check = tuple[Callable[[Any], bool], str]
"""A field held to a value: whether a value is accepted, and the accepted values in words."""


@dataclass(frozen=True)
class Shape:
    """The attention's shape as ``config.json`` gives it."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int


def one(te: str, hf: str, rows: int) -> Rule:
    """A te_assembly tensor that is one Hugging Face tensor."""
    return Rule(te, ((Part(hf, rows),),))


def args_of(step: PlannedStep) -> dict[str, Any]:
    return step.spec.with_defaults(step.args)


class Layer:
    """One decoder layer of a te_assembly model, as export reads it: its steps by type."""

    def __init__(self, steps: list[PlannedStep]) -> None:
        self.steps = steps
        self.types = {s.type for s in steps}
        self.by_type: dict[str, list[PlannedStep]] = {}
        for step in steps:
            self.by_type.setdefault(step.type, []).append(step)

    def args(self, type_: str, index: int = 0) -> dict[str, Any]:
        """The arguments (defaults filled in) of its ``index``-th step of ``type_`` (``KeyError`` or
        ``IndexError`` when it has none)."""
        return args_of(self.by_type[type_][index])

    def count(self, type_: str) -> int:
        return len(self.by_type.get(type_, ()))

    @property
    def routed(self) -> bool:
        """Whether its MLP routes tokens to experts (a dense layer does not)."""
        return "TopKRouter" in self.types


class Family:
    """The base of every family (module docstring). The attention and MLP parts fill in most of it."""

    architecture: ClassVar[str]
    model_type: ClassVar[str]
    own_fields: ClassVar[tuple[str, ...]] = ()
    """The ``config.json`` fields it reads beyond ``COMMON_FIELDS``."""
    checked: ClassVar[dict[str, Check]] = {}
    """Fields it alone meets, held to what te_assembly computes for it."""
    droppable: ClassVar[tuple[str, ...]] = ()
    """Fields it reads that ``import_hf.ignore_fields`` may still name: what they describe is left out
    on purpose (the multi-token prediction layers)."""
    block_name: ClassVar[str]
    """The shipped block of its layers (``configs/block/``)."""
    dense_block: ClassVar[str] = "hf_dense_layer"
    """The block of its first, dense, layers (where it has them)."""
    router_islands: ClassVar[tuple[str, ...]] = ()
    """transformers' router classes of this family that compute in float32 inside a float64 model
    (``verify`` restates them in the input's dtype)."""
    tied_by_default: ClassVar[bool] = False
    """``tie_word_embeddings`` when ``config.json`` does not say (its config class's default)."""
    norm_islands: ClassVar[tuple[str, ...]] = ()
    """transformers' (1 + w) RMSNorm classes of this family, float32 inside a float64 model (``verify``
    restates them in the input's dtype)."""
    attention_dims_names: ClassVar[tuple[str, ...]] = ()
    attention_linears: ClassVar[int] = 2
    rope_aliases: ClassVar[dict[str, str]] = {}
    """Older names of a RoPE type that the family's config class reads as another."""
    rotary_pairs: ClassVar[bool] = True
    """Its ``head_dim`` is turned by the rotary embedding, so it must be even."""

    @property
    def fields(self) -> tuple[str, ...]:
        return (*COMMON_FIELDS, *self.own_fields)

    # config.json -> HFSpec
    def read_rope(self, r: ConfigReader, data: Mapping[str, Any]) -> dict[str, Any]:
        """``HFSpec.rope``: its RoPE as ``rope_parameters`` or ``rope_theta`` + ``rope_scaling`` say."""
        from te_assembly.formats.hf.rope import read_rope

        return read_rope(r, data, partial="partial_rotary_factor" in self.fields, aliases=self.rope_aliases)

    def read(self, r: ConfigReader, data: Mapping[str, Any], shape: Shape) -> dict[str, Any]:
        """The ``HFSpec`` fields of its attention and MLP (and of anything else it has)."""
        return {**self.read_attention(r, data, shape), **self.read_mlp(r, data, shape)}

    def read_attention(self, r: ConfigReader, data: Mapping[str, Any], shape: Shape) -> dict[str, Any]:
        raise NotImplementedError

    def read_mlp(self, r: ConfigReader, data: Mapping[str, Any], shape: Shape) -> dict[str, Any]:
        raise NotImplementedError

    # HFSpec -> te_assembly model
    def block(self, dense: bool = False) -> str:
        return self.dense_block if dense else self.block_name

    def dims(self, spec: HFSpec) -> dict[str, Any]:
        """Its block's dims for ``spec`` (every one, so the model file shows them all)."""
        return {**self.attention_dims(spec), "ffn": spec.ffn, **self.mlp_dims(spec)}

    def attention_dims(self, spec: HFSpec) -> dict[str, Any]:
        raise NotImplementedError

    def mlp_dims(self, spec: HFSpec) -> dict[str, Any]:
        raise NotImplementedError

    # tensors, both ways
    def layer_rules(self, spec: HFSpec, te: str, hf: str, dense: bool) -> Iterator[Rule]:
        """One decoder layer's tensors: pre-norm attention and MLP (a family whose norms sit
        elsewhere says so in its own)."""
        yield one(f"{te}attn_norm.weight", f"{hf}input_layernorm.weight", spec.hidden)
        yield from self.attention_rules(spec, te, f"{hf}self_attn.")
        yield one(f"{te}mlp_norm.weight", f"{hf}post_attention_layernorm.weight", spec.hidden)
        if dense:
            yield from dense_mlp_rules(te, f"{hf}mlp.", spec.dense_ffn, spec.hidden, bias=False)
        else:
            yield from self.mlp_rules(spec, te, hf)

    def attention_rules(self, spec: HFSpec, te: str, attn: str) -> Iterator[Rule]:
        raise NotImplementedError

    def mlp_rules(self, spec: HFSpec, te: str, hf: str) -> Iterator[Rule]:
        raise NotImplementedError

    # HFSpec -> config.json
    def config(self, spec: HFSpec) -> dict[str, Any]:
        """Its own ``config.json`` fields for ``spec`` (beyond the common ones), each read back."""
        return {**self.attention_config(spec), **self.mlp_config(spec)}

    def attention_config(self, spec: HFSpec) -> dict[str, Any]:
        return {}

    def mlp_config(self, spec: HFSpec) -> dict[str, Any]:
        return {}

    # te_assembly model -> HFSpec (export)
    def expresses(self, layer: Layer) -> bool:
        """Whether a model's (last) decoder layer is one of this family's kind; whether the family
        expresses everything else is for the rebuilt model's comparison to say."""
        return self.has_attention(layer) and self.has_mlp(layer) and self.attention_matches(layer)

    def has_attention(self, layer: Layer) -> bool:
        raise NotImplementedError

    def has_mlp(self, layer: Layer) -> bool:
        raise NotImplementedError

    def attention_matches(self, layer: Layer) -> bool:
        """Its attention's own features (biases, q/k norms, windows) are what ``layer`` has."""
        return True

    def from_plan(self, layer: Layer, layers: list[Layer]) -> dict[str, Any]:
        """The ``HFSpec`` fields a model's first routed (or only) layer gives, as this family."""
        return {**self.attention_from_plan(layer), **self.mlp_from_plan(layer, layers)}

    def attention_from_plan(self, layer: Layer) -> dict[str, Any]:
        raise NotImplementedError

    def mlp_from_plan(self, layer: Layer, layers: list[Layer]) -> dict[str, Any]:
        raise NotImplementedError


def dense_mlp_rules(te: str, mlp: str, ffn: int, hidden: int, bias: bool) -> Iterator[Rule]:
    """A SwiGLU MLP: gate_proj | up_proj stacked as fc1, down_proj as fc2 (with their biases)."""
    kinds = (("basic_ops.0", "weight"), *((("basic_ops.1", "bias"),) if bias else ()))
    for op, kind in kinds:
        stacked = (Part(f"{mlp}gate_proj.{kind}", ffn), Part(f"{mlp}up_proj.{kind}", ffn))
        yield Rule(f"{te}fc1.{op}.{kind}", (stacked,))
        yield one(f"{te}fc2.{op}.{kind}", f"{mlp}down_proj.{kind}", hidden)


__all__ = ["Check", "Family", "Layer", "Shape", "args_of", "dense_mlp_rules", "one"]
