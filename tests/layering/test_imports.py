"""The layers point one way (DESIGN.md §2), checked by walking imports with ``ast``.

foundations (``slts.errors``, ``slts.config``, ``slts.metadata``) <- bindings, journal
<- engine (``slts.storage``, ``slts.gc``) <- tools. Bindings import nothing of the core
but the errors; nothing imports the tools; the core imports no cloud SDK.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FOLDERS = {"slts": "slts", "bindings": "slts.bindings", "journal": "slts.journal", "tools": "slts.tools"}
SDKS = ("boto3", "botocore", "pyhdfs", "pyspark")


def modules() -> dict[str, list[str]]:
    """Module name -> absolute names it imports (relative imports resolved)."""
    result: dict[str, list[str]] = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in relative.parts if p != "__init__"]
            module = ".".join([package, *parts])
            is_package = path.name == "__init__.py"
            imported: list[str] = []
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    imported.extend(alias.name for alias in node.names)
                elif isinstance(node, ast.ImportFrom):
                    if node.level:
                        base = module.split(".")
                        base = base[: len(base) - node.level + (1 if is_package else 0)]
                        name = ".".join([*base, node.module] if node.module else base)
                    else:
                        name = node.module or ""
                    imported.append(name)
            result[module] = imported
    return result


MODULES = modules()


def test_the_tree_was_found() -> None:
    assert "slts.storage.chunked" in MODULES and "slts.bindings.base" in MODULES


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("slts.bindings")))
def test_bindings_import_only_errors_from_the_core(module: str) -> None:
    for name in MODULES[module]:
        if name.startswith("slts.") and not name.startswith("slts.bindings"):
            assert name == "slts.errors", f"{module} imports {name}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if not m.startswith("slts.tools")))
def test_nothing_imports_tools(module: str) -> None:
    assert not any(name.startswith("slts.tools") for name in MODULES[module]), module


@pytest.mark.parametrize(
    "module", sorted(m for m in MODULES if not m.startswith(("slts.bindings", "slts.tools")))
)
def test_core_imports_no_cloud_sdk(module: str) -> None:
    assert not any(name.split(".")[0] in SDKS for name in MODULES[module]), module


@pytest.mark.parametrize(
    "module", ["slts.errors", "slts.config", "slts.metadata.store", "slts.metadata.records"]
)
def test_foundations_import_no_engine(module: str) -> None:
    assert not any(name.startswith(("slts.storage", "slts.gc", "slts.journal")) for name in MODULES[module])


def test_importing_bindings_does_not_load_the_engine() -> None:
    import subprocess
    import sys

    code = (
        "import sys, slts.bindings, slts.journal; "
        "print(any(m.startswith('slts.storage') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
