"""``python -m tasktape``: the same as the ``tasktape`` command."""

from .cli import run

if __name__ == "__main__":  # not when a spawned child process imports it
    run()
