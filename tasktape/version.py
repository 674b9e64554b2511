"""The tasktape version, recorded with every capture (and the package's: pyproject.toml
reads it from here). A constant, not looked up in the installed metadata, which takes a
few milliseconds in every process that starts (a recorder and its log writer each)."""

__version__ = "0.2.0.dev0"
