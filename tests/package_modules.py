"""Every module of the tasktape package, found from the build configuration (its subpackages
live in folders of their own, so walking ``tasktape.__path__`` alone would miss them)."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import tomllib
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
PACKAGES: list[str] = CONFIG["packages"]


def _folder(package: str) -> Path:
    """Where setuptools finds a package: its own package-dir entry, else its nearest
    parent's folder with the rest of its name as subfolders."""
    parts = package.split(".")
    for n in range(len(parts), 0, -1):
        mapped = CONFIG["package-dir"].get(".".join(parts[:n]))
        if mapped is not None:
            return ROOT.joinpath(mapped, *parts[n:])
    return ROOT.joinpath(*parts)


FOLDERS: dict[str, Path] = {p: _folder(p) for p in PACKAGES}
OPTIONAL = {"mitmproxy"}  # modules that need an extra are skipped where it is missing


def module_names() -> list[str]:
    names = []
    for package, folder in FOLDERS.items():
        names.append(package)
        names += [f"{package}.{m.name}" for m in pkgutil.iter_modules([str(folder)]) if not m.ispkg]
    return sorted(names)


def modules() -> list[ModuleType]:
    found = []
    for name in module_names():
        try:
            found.append(importlib.import_module(name))
        except ImportError as exc:
            if exc.name not in OPTIONAL:
                raise
    return found


def source_files() -> list[Path]:
    return sorted(path for folder in FOLDERS.values() for path in folder.glob("*.py"))
