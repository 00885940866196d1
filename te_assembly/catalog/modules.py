"""The allowlist of non-fusible torch modules a config may place between fusers.

Configs never import arbitrary Python objects: only names listed here are accepted.
"""

from __future__ import annotations

from te_assembly.catalog.spec import ModuleSpec, Param, Width

MODULES: tuple[ModuleSpec, ...] = (
    ModuleSpec("Identity", "torch.nn.Identity: ends the fuser, changes nothing.", "torch.nn:Identity"),
    ModuleSpec(
        "Dropout",
        "torch.nn.Dropout.",
        "torch.nn:Dropout",
        params=(Param("p", float, 0.5, bounds=(0.0, 1.0)),),
    ),
    ModuleSpec("GELU", "torch.nn.GELU (erf).", "torch.nn:GELU"),
    ModuleSpec("ReLU", "torch.nn.ReLU.", "torch.nn:ReLU"),
    ModuleSpec("SiLU", "torch.nn.SiLU.", "torch.nn:SiLU"),
    ModuleSpec("Tanh", "torch.nn.Tanh.", "torch.nn:Tanh"),
    ModuleSpec(
        "Linear",
        "torch.nn.Linear.",
        "torch.nn:Linear",
        params=(Param("in_features", int), Param("out_features", int), Param("bias", bool, True)),
        width=Width(in_arg="in_features", out_arg="out_features"),
        param_shapes=lambda a: {
            "weight": (a["out_features"], a["in_features"]),
            **({"bias": (a["out_features"],)} if a.get("bias", True) else {}),
        },
    ),
    ModuleSpec(
        "LayerNorm",
        "torch.nn.LayerNorm over the last dimension.",
        "torch.nn:LayerNorm",
        params=(Param("normalized_shape", int), Param("eps", float, 1e-5)),
        width=Width(in_arg="normalized_shape"),
        param_shapes=lambda a: {"weight": (a["normalized_shape"],), "bias": (a["normalized_shape"],)},
    ),
)
