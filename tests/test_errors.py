"""One error tree: every exception class tasktape defines sits under TasktapeError, lives
in tasktape.errors, is drawn in its docstring, is exported from tasktape, and goes through
pickle whole."""

from __future__ import annotations

import ast
import builtins
import inspect
import pickle

import pytest
from package_modules import modules, source_files

import tasktape
from tasktape import errors


def defined_errors() -> list[type[BaseException]]:
    found = {}
    for module in modules():
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__.startswith("tasktape"):
                found[value.__qualname__] = value
    return sorted(found.values(), key=lambda c: c.__name__)


def test_every_error_is_in_the_tree() -> None:
    classes = defined_errors()
    assert len(classes) >= 19
    for cls in classes:
        assert issubclass(cls, tasktape.TasktapeError), cls
        assert cls.__module__ == "tasktape.errors", f"{cls.__name__} is defined in {cls.__module__}"
        drawn = f"── {cls.__name__}" in errors.__doc__ or cls is tasktape.TasktapeError
        assert drawn, f"{cls.__name__} is not drawn in the tree"
        assert getattr(tasktape, cls.__name__) is cls
        assert cls.__name__ in tasktape.__all__


def test_the_drawing_names_only_real_classes_with_their_second_bases() -> None:
    for line in errors.__doc__.splitlines():
        if "── " not in line:
            continue
        name, *rest = line.split("── ", 1)[1].split()
        cls = getattr(errors, name)
        if rest and rest[0].startswith("("):
            base = getattr(builtins, rest[0].strip("()"))
            assert issubclass(cls, base), (name, base)


def test_a_class_outside_the_tree_would_be_caught() -> None:
    """The check above sees classes wherever they are defined."""

    class Stray(ValueError):
        pass

    Stray.__module__ = "tasktape.somewhere"
    assert not issubclass(Stray, tasktape.TasktapeError)


# What Python itself asks for: a module's __getattr__ raises AttributeError.
PROTOCOL = {"AttributeError", "NotImplementedError", "SystemExit"}


def _builtin_raises(tree: ast.AST) -> list[ast.Raise]:
    """``raise ValueError("...")`` and the like, outside pydantic validators (pydantic wants
    a ValueError there and turns it into its own ValidationError)."""
    found = []
    validators = {  # functions made validators by a call: field_validator("x")(check)
        ast.unparse(node.args[0])
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and "validator" in ast.unparse(node.func).lower() and node.args
    }
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef) or node.name in validators:
            continue
        names = {ast.unparse(d).split("(")[0].split(".")[-1] for d in node.decorator_list}
        if names & {"model_validator", "field_validator"}:
            continue
        for inner in ast.walk(node):
            exc = getattr(inner, "exc", None)
            if isinstance(inner, ast.Raise) and isinstance(exc, ast.Call) and exc.args:
                name = ast.unparse(exc.func)
                if isinstance(getattr(builtins, name, None), type) and name not in PROTOCOL:
                    found.append(inner)
    return found


@pytest.mark.parametrize("path", source_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_builtin_exception_is_raised_with_a_message(path) -> None:
    """A message meant for the user comes in a TasktapeError (a bare ``raise ValueError``
    caught on the next lines is control flow, not an error of tasktape's)."""
    raises = _builtin_raises(ast.parse(path.read_text()))
    assert not raises, [f"{path.name}:{r.lineno}: {ast.unparse(r)}" for r in raises]


def test_errors_keep_the_bases_callers_already_catch() -> None:
    assert issubclass(tasktape.UsageError, ValueError)
    assert issubclass(tasktape.FaultError, tasktape.UsageError)
    assert issubclass(tasktape.UnknownExchange, KeyError)
    assert str(tasktape.UnknownExchange("no exchange 7 in x.db")) == "no exchange 7 in x.db"
    assert issubclass(tasktape.NotCancelable, tasktape.A2AError)
    assert tasktape.NotCancelable("done").http == 409


# What an error's own __init__ asks for, by name (the others take a message alone).
SAMPLES = {"http": 404, "rpc": -32001, "message": "task t1 not found"}


def made(cls: type[BaseException]) -> BaseException:
    try:
        names = list(inspect.signature(cls).parameters)
    except ValueError:  # (no signature: the builtin base's __init__, which takes a message)
        names = ["message"]
    return cls(*(SAMPLES[name] for name in names))


@pytest.mark.parametrize("cls", defined_errors(), ids=lambda cls: cls.__name__)
def test_every_error_goes_through_pickle_whole(cls: type[BaseException]) -> None:
    """A2AError could not be unpickled (its args are the message alone, its __init__ takes
    the codes too): one raised in a worker process never reached the parent."""
    error = made(cls)
    error.detail = "kept"  # (an attribute set after it was made goes with it too)
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is cls
    assert (str(back), vars(back)) == (str(error), vars(error))
