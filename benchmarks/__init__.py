"""How fast tasktape is, measured side by side: ``python -m benchmarks --help``."""
