"""The project's modules import each other without cycles. Each module's imports are read with ast (those Python
runs when the module is imported: at module level, in classes and if/try blocks; an import inside a function runs
later, when called, and one under `if TYPE_CHECKING:` never runs) and mapped to the project's modules, package
__init__ files included: importing a.b.c runs a/__init__.py and a/b/__init__.py first."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("launcher", "recipes", "data_prep", "common")


def project_modules(root: Path, packages=PACKAGES) -> dict[str, Path]:
    modules = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _run_at_import(tree: ast.Module):
    """The import statements of a module that run when it is imported."""
    pending = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif _type_checking_only(node):
            pending.extend(node.orelse)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            pending.extend(ast.iter_child_nodes(node))


def _type_checking_only(node: ast.AST) -> bool:
    """`if TYPE_CHECKING:` (or typing.TYPE_CHECKING): its body is read by type checkers only."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _executed(name: str, modules: dict[str, Path]) -> set[str]:
    """The project modules that importing `name` runs: each package on the way, then the module itself."""
    parts = name.split(".")
    return {m for m in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if m in modules}


def module_imports(name: str, modules: dict[str, Path]) -> set[str]:
    path = modules[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _run_at_import(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found |= _executed(alias.name, modules)
            continue
        base = node.module or ""
        if node.level:  # relative: from . import x, from ..a import b
            anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join(anchor + ([node.module] if node.module else []))
        found |= _executed(base, modules)
        for alias in node.names:  # from package import module
            found |= _executed(f"{base}.{alias.name}", modules)
    found.discard(name)
    return found


def import_graph(root: Path, packages=PACKAGES) -> dict[str, set[str]]:
    modules = project_modules(root, packages)
    return {name: module_imports(name, modules) for name in modules}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or through others (Tarjan's strongly connected
    components of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_project_has_no_import_cycles():
    graph = import_graph(REPO)
    assert {"launcher.cli", "recipes.trainer.loop", "data_prep.pipeline", "common.plan"} <= set(graph)
    assert "recipes.trainer.cadence" in graph["recipes.trainer.loop"]
    assert cycles(graph) == []


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_cycles_are_found_through_relative_imports_and_package_inits(tmp_path):
    write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg import b\n",
            "pkg/b.py": "import pkg.c\n",
            "pkg/c.py": "try:\n    from . import a\nexcept ImportError:\n    pass\n",
            "pkg/d.py": "import other.leaf\n",  # importing other.leaf runs other/__init__.py ...
            "other/__init__.py": "from pkg.d import x\n",  # ... which imports pkg.d
            "other/leaf.py": "",
            "pkg/late.py": "def f():\n    import pkg.a\n",  # runs when called, not when imported
            "pkg/typed.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\nelse:\n    import pkg.b\n"
            ),
        },
    )
    graph = import_graph(tmp_path, ("pkg", "other"))
    assert graph["pkg.d"] == {"other", "other.leaf"} and graph["pkg.late"] == set()
    assert graph["pkg.typed"] == {"pkg", "pkg.b"}
    assert cycles(graph) == [["other", "pkg.d"], ["pkg.a", "pkg.b", "pkg.c"]]


def test_a_package_init_importing_a_module_that_imports_the_package_is_a_cycle(tmp_path):
    # util reads the package while its __init__ is still running: whatever __init__ defines after the import
    # is not there yet.
    write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg import util\n",
            "pkg/util.py": "from pkg import other\n",
            "pkg/other.py": "",
            "pkg/alone.py": "from pkg import other\n",
        },
    )
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg"] == {"pkg.util"} and graph["pkg.alone"] == {"pkg", "pkg.other"}
    assert cycles(graph) == [["pkg", "pkg.util"]]


def imports_into(graph: dict[str, set[str]], room: str) -> dict[str, list[str]]:
    """Modules of the other rooms (sub-packages) of `room`'s package that import `room`: a room below importing
    up. Modules at the package's top (entry points such as recipes.train) stand above every room and may."""
    package = room.rpartition(".")[0]
    rooms = {name for name in graph if name.count(".") == package.count(".") + 1 and name.startswith(package + ".")}
    rooms = {r for r in rooms if any(other.startswith(r + ".") for other in graph)}

    def in_room(name: str, r: str) -> bool:
        return name == r or name.startswith(r + ".")

    found = {}
    for module, imports in graph.items():
        if any(in_room(module, r) for r in rooms - {room}):
            up = sorted(i for i in imports if in_room(i, room))
            if up:
                found[module] = up
    return found


def test_no_room_of_the_gpu_side_imports_up_into_the_trainer():
    graph = import_graph(REPO)
    assert imports_into(graph, "recipes.trainer") == {}
    # The runtime room is below all the others: it imports none of them.
    below = {
        m: sorted(i for i in graph[m] if i.startswith("recipes.") and not i.startswith("recipes.runtime"))
        for m in graph
        if m.startswith("recipes.runtime")
    }
    assert below == {m: [] for m in below} and "recipes.runtime.callbacks" in below


def test_an_upward_import_is_found(tmp_path):
    write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/main.py": "from pkg.core import loop\n",  # an entry point above the rooms: allowed
            "pkg/core/__init__.py": "",
            "pkg/core/loop.py": "from pkg.extras import tool\n",
            "pkg/extras/__init__.py": "",
            "pkg/extras/tool.py": "",
            "pkg/extras/hook.py": "from pkg.core.loop import x\n",
        },
    )
    graph = import_graph(tmp_path, ("pkg",))
    assert imports_into(graph, "pkg.core") == {"pkg.extras.hook": ["pkg.core", "pkg.core.loop"]}


def imported_names(path: Path) -> set[str]:
    """Every module a file imports anywhere (module level, functions, type-checking blocks)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_the_gpu_side_reads_the_run_directory_without_hydra_omegaconf_or_the_launcher():
    forbidden = ("hydra", "omegaconf", "launcher")
    found = {
        str(path.relative_to(REPO)): sorted(n for n in imported_names(path) if n.split(".")[0] in forbidden)
        for path in (REPO / "recipes").rglob("*.py")
    }
    assert {path: names for path, names in found.items() if names} == {}
    assert "torch" in imported_names(REPO / "recipes" / "trainer" / "steps.py")  # the walk sees real imports


def test_the_plan_and_the_jobs_never_import_the_platforms():
    """The platforms stand above the plan and the jobs: what those need of a platform the caller passes in
    (launcher/cli.py), so no folder below imports back (the registry imports the platform a run uses by name)."""
    below = ("launcher/plan", "launcher/jobs")
    found = {
        str(path.relative_to(REPO)): sorted(n for n in imported_names(path) if n.startswith("launcher.platforms"))
        for folder in below
        for path in (REPO / folder).rglob("*.py")
    }
    assert {path: names for path, names in found.items() if names} == {}
    assert "launcher.platforms.base" in imported_names(REPO / "launcher" / "platforms" / "registry.py")
