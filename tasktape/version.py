"""The tasktape version, recorded with every capture (and the package's: pyproject.toml
reads it from here). A constant, not the installed metadata: looking that up takes every
process that starts (a recorder and its log writer each) about 13 ms."""

__version__ = "0.1.0"
