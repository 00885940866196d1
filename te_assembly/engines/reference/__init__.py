"""The pure-PyTorch reference engine: same plan, same catalog, TE's channel semantics."""
