"""The floor plan (DESIGN.md §2, docs/architecture.md), checked by walking imports with ``ast``.

Every module of the package is in a *room* (a package or a module at the package root)
with a rank; a module imports modules of its own room and of rooms of a lower rank only,
never of a sibling room of the same rank nor of a higher one (``RANKS``). ``from P import
x`` counts as an import of ``P.x`` when that is a module (``from slts import storage``
imports the engine, not the package root). A new room gets its rank when it lands: a module without one
fails ``test_every_module_has_a_rank``. Bindings import nothing of the core but the errors;
the core imports no cloud SDK; nothing imports the source folders by their bare names (that
loads a second copy of every class in them); pyproject's package list names every folder
that holds an ``__init__.py`` (a forgotten one ships a broken wheel while editable installs
work).
"""

from __future__ import annotations

import ast
import pathlib
import tomllib
from collections.abc import Collection

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FOLDERS = {"slts": "slts", "bindings": "slts.bindings", "journal": "slts.journal", "tools": "slts.tools"}
SDKS = ("boto3", "botocore", "pyhdfs", "pyspark")


def _module_names() -> dict[str, pathlib.Path]:
    """Every module of the package (its dotted name -> its file)."""
    names: dict[str, pathlib.Path] = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT / folder).with_suffix("")
            names[".".join([package, *(p for p in relative.parts if p != "__init__")])] = path
    return names


def imports_of(module: str, source: str, is_package: bool, names: Collection[str]) -> list[str]:
    """The absolute names ``source`` (module ``module``) imports, relative imports
    resolved; ``from P import x`` names the module ``P.x`` when ``names`` has it, else ``P``."""
    imported: list[str] = []
    for node in ast.walk(ast.parse(source, module)):
        if isinstance(node, ast.Import):
            imported.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            for alias in node.names:
                imported.append(f"{name}.{alias.name}" if f"{name}.{alias.name}" in names else name)
    return imported


def modules() -> dict[str, list[str]]:
    """Module name -> absolute names it imports (``imports_of``)."""
    names = _module_names()
    return {
        module: imports_of(module, path.read_text(), path.name == "__init__.py", names)
        for module, path in names.items()
    }


MODULES = modules()

#: (a module, or a package and everything in it; its rank). No import goes up a rank.
RANKS: tuple[tuple[str, int], ...] = (
    ("slts", 0),  # the package itself: lazy names only
    ("slts.errors", 0),  # the error tree: imports nothing of the package
    ("slts.config", 1),  # the settings and their checks
    ("slts.limiter", 1),  # the priority rate limiter (traffic classes, buckets)
    ("slts.logs", 1),  # the logger tree's handler, JSON lines, credential redaction
    ("slts.chunk_names", 1),  # the unique part of chunk names
    ("slts.prices", 1),  # the rates the cost report prices with
    ("slts.transforms", 1),  # frames (zstd, AES-256-GCM) and keys: on the errors alone
    ("slts.config_sources", 2),  # the config file, SLTS_* variables, flags: on the settings
    ("slts.metadata", 3),  # stores, records, key layout, the index rules, ownership
    ("slts.bindings", 4),  # chunk storages: on the errors alone (checked below)
    ("slts.usage", 5),  # what a container asks of its chunk storage, metered and recorded
    ("slts.journal", 6),  # system segments: on bindings and metadata
    ("slts.gc", 7),
    ("slts.storage", 8),  # the engine
    ("slts.admin", 9),  # admin and repair, on the engine's public seam
    ("slts.remote", 9),  # tiered log storage for Kafka-style engines (KIP-405), on the engine
    ("slts.offload", 9),  # Pulsar-style ledger offload (PIP-17), on the engine
    ("slts.metrics", 9),  # Prometheus metrics of an instance, read at each scrape
    ("slts.cost", 9),  # the cost report: usage and layout, priced
    ("slts.tools", 10),  # CLI, demo, bench, simulator
)


def room_of(module: str) -> tuple[str, int] | None:
    """The most specific room holding ``module`` (None: not a module of the package)."""
    found = [(room, rank) for room, rank in RANKS if module == room or module.startswith(room + ".")]
    return max(found, key=lambda entry: len(entry[0])) if found else None


def test_from_a_package_import_a_module_is_an_import_of_that_module() -> None:
    """The guard's own holes, closed: ``from slts import storage`` and ``from . import x``
    name the module they load, so a lower room cannot reach a higher one that way; and a
    sibling room of the same rank is refused like a higher one."""
    names = {"slts", "slts.storage", "slts.storage.chunked", "slts.metadata", "slts.metadata.store"}
    assert imports_of("slts.metadata.store", "from slts import storage", False, names) == ["slts.storage"]
    assert imports_of("slts.metadata", "from .. import storage", True, names) == ["slts.storage"]
    assert imports_of("slts.metadata.store", "from . import index", False, names) == ["slts.metadata"]
    assert imports_of("slts.metadata.store", "from slts import open", False, names) == ["slts"]
    assert not goes_up("slts.storage.chunked", "slts.storage.context")  # its own room
    assert not goes_up("slts.storage.chunked", "slts.metadata.store")  # a lower room
    assert goes_up("slts.metrics", "slts.cost")  # a sibling room of the same rank
    assert goes_up("slts.metadata.store", "slts.storage")  # a higher room


def test_every_module_has_a_rank() -> None:
    assert not [module for module in MODULES if room_of(module) is None]


def goes_up(module: str, name: str) -> bool:
    """Whether ``module``'s import of ``name`` breaks the floor plan: ``name`` is in
    another room of the package whose rank is not lower."""
    room = room_of(module)
    target = room_of(name) if name.startswith("slts") else None
    assert room is not None, module
    return target is not None and target[0] != room[0] and target[1] >= room[1]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_down_the_ranks(module: str) -> None:
    wrong = [name for name in MODULES[module] if goes_up(module, name)]
    assert not wrong, f"{module} (room {room_of(module)}) imports {wrong} ({[room_of(n) for n in wrong]})"


def _all_imports(path: pathlib.Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.append(node.module or "")
    return names


@pytest.mark.parametrize("top", ["slts", "bindings", "journal", "tools", "tests"])
def test_no_import_of_a_bare_source_folder(top: str) -> None:
    bare = tuple(folder for folder in FOLDERS if folder != "slts")
    for path in sorted((ROOT / top).rglob("*.py")):
        for name in _all_imports(path):
            assert name.split(".")[0] not in bare, f"{path.relative_to(ROOT)} imports {name}: use slts.{name}"


def test_pyproject_lists_every_package() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {package: folder for folder, package in FOLDERS.items()}
    assert setuptools["package-dir"] == folders
    found = set()
    for package, folder in folders.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *relative.parts]))
    assert sorted(setuptools["packages"]) == sorted(found)


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


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("slts.tools.benchmarks.")))
def test_benchmark_suites_build_on_base_not_on_the_runner(module: str) -> None:
    # The runner (slts.tools.bench) imports the suites; they share types through base.
    assert "slts.tools.bench" not in MODULES[module], module


SUBCOMMAND_MODULES = sorted(m for m in MODULES if m.startswith("slts.tools.") and m.endswith("_cli"))


@pytest.mark.parametrize("module", ["slts.tools.command_line", *SUBCOMMAND_MODULES])
def test_subcommand_modules_share_command_line_not_each_other(module: str) -> None:
    """``slts.tools.cli`` (the parser) imports the modules that register subcommands;
    they and the shared ``command_line`` never import it or each other (no cycle, no
    private helpers reached across)."""
    others = {"slts.tools.cli", *SUBCOMMAND_MODULES} - {module}
    assert not [name for name in MODULES[module] if name in others], module
    assert SUBCOMMAND_MODULES, "no subcommand module found"
