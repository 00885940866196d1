"""One module per command; each exposes ``main(overrides, console) -> exit code``."""
