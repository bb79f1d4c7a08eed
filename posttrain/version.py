"""The package version: one place, read by posttrain/__init__.py and by checkpoints (which
record the version that wrote them) without importing the package face above them."""

__version__ = "0.1.0"  # the same as pyproject.toml's project.version
