"""Command line: ``python -m te_assembly [command] [hydra overrides...]``."""
