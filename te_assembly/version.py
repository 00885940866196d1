"""The package version, in one place (the package, run records and config headers read it)."""

__version__ = "0.1.0"
