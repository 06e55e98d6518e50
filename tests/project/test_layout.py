"""The package layout stays true: no import cycle inside `prompt_r1/`, imports only downward
between its subpackages, and nothing of Prefect, MLflow, `tasks/` or `flows/` in the library.

Every import statement counts, also those inside functions (a lazy import still ties two
modules together). The rule is stated once, as the ranks below, and checked over the source
text with `ast`; `test_the_checker_sees_*` check the checker on planted violations.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "prompt_r1"

# Subpackage -> rank: a module may import its own subpackage and those of lower rank only.
# `warehouse` sits above `core` (it stores the core's types) and below `data`. `cluster` (Ray) is
# below every role that runs as Ray actors: rollouts, the learner, evaluation engines; `planning`
# sizes the learner and the engines, and serves `training` and `evaluation` alike.
RANK = {
    "core": 0, "config": 1, "warehouse": 2, "data": 3, "models": 3, "env": 4, "policy": 4, "cluster": 4,
    "rollout": 5, "learner": 5, "planning": 6, "training": 7, "evaluation": 7, "serving": 8, "api": 9,
    "cli": 10, "__init__": 11,
}
FORBIDDEN = ("prefect", "mlflow", "tasks", "flows")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def library_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(LIB.rglob("*.py"))}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """Every module `path` imports (at any depth of the file), `from a import b` resolved to the
    submodule `a.b` when that is a module."""
    found: set[str] = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return found


def layer(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "warehouse":
        return "warehouse"
    return parts[1] if len(parts) > 1 else "__init__"


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Upward or sideways imports between layers, and forbidden imports, as readable lines."""
    out = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            top = target.split(".")[0]
            if top in FORBIDDEN and module.startswith("prompt_r1"):
                out.append(f"{module} imports {target}: the library knows nothing of {top}")
            if top not in ("prompt_r1", "warehouse") or layer(target) == layer(module):
                continue
            if RANK[layer(target)] >= RANK[layer(module)]:
                out.append(f"{module} ({layer(module)}) imports {target} ({layer(target)}): not below it")
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def import_graph() -> dict[str, set[str]]:
    files = library_modules()
    files.update({module_name(p): p for p in sorted((ROOT / "warehouse").glob("*.py"))})
    known = set(files)
    return {name: {t for t in imports_of(path, known) if t != name} for name, path in files.items()}


def test_no_import_cycle_inside_the_library():
    assert cycles(import_graph()) == []


def test_imports_go_downward_only_and_never_to_orchestration():
    assert violations(import_graph()) == []


def shell_graph() -> dict[str, set[str]]:
    """The import graph of the library, the warehouse and the orchestration shell (`tasks/`, `flows/`)."""
    files = library_modules()
    for top in ("warehouse", "tasks", "flows"):
        files.update({module_name(p): p for p in sorted((ROOT / top).rglob("*.py"))})
    known = set(files)
    return {name: {t for t in imports_of(path, known) if t != name} for name, path in files.items()}


def test_no_import_cycle_in_the_orchestration_shell():
    assert cycles(shell_graph()) == []


def private_imports(files: dict[str, Path]) -> list[str]:
    """`from a.b import _name` where `a.b` lies in another package than the importer: a private
    helper used across packages should be made public where it lives."""
    out = []
    for module, path in sorted(files.items()):
        package = module.rpartition(".")[0] if path.name != "__init__.py" else module
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                source_package = node.module if node.module in files and files[node.module].name == "__init__.py" \
                    else node.module.rpartition(".")[0]
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__") and source_package != package:
                        out.append(f"{module} imports {node.module}.{alias.name}")
    return out


def test_no_package_imports_another_packages_private_names():
    files = library_modules()
    for top in ("warehouse", "tasks", "flows"):
        files.update({module_name(p): p for p in sorted((ROOT / top).rglob("*.py"))})
    assert private_imports(files) == []


def test_every_subpackage_says_what_it_owns_and_may_import():
    for init in sorted(LIB.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "\nImports: " in doc, f"{init}: its docstring must say what it may import (a line `Imports: ...`)"
        assert init.parent.name in RANK, f"{init.parent.name}: give the new subpackage a rank in RANK"


@pytest.mark.parametrize("edges, expected", [
    ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set()}, []),
])
def test_the_checker_sees_cycles(edges, expected):
    assert cycles(edges) == expected


def test_the_checker_sees_upward_and_forbidden_imports():
    graph = {
        "prompt_r1.core.reward": {"prompt_r1.rollout.episode"},       # upward
        "prompt_r1.env.base": {"prompt_r1.policy.base"},              # sideways, same rank
        "prompt_r1.training.session": {"mlflow", "prompt_r1.core.grpo"},  # forbidden; fine
        "warehouse.store": {"prompt_r1.data.rows"},                   # the warehouse above data
        "prompt_r1.cli.use": {"prompt_r1.cli.common", "prompt_r1.api"},  # allowed
    }
    found = violations(graph)
    assert len(found) == 4, found
    assert any("mlflow" in line for line in found)


def test_the_public_api_is_importable_from_the_package():
    import prompt_r1

    for name in prompt_r1.__all__:
        assert callable(getattr(prompt_r1, name)), name
    with pytest.raises(AttributeError):
        prompt_r1.no_such_name  # noqa: B018


def test_benchmarks_are_modules_that_edit_no_import_path():
    """Benchmarks run from the repository root as modules (`python -m benchmarks.speed.grpo_step`),
    in folders by kind, so none needs to edit `sys.path` to import the project or each other."""
    bench = ROOT / "benchmarks"
    scripts = sorted(p for p in bench.rglob("*.py") if "results" not in p.parts)
    assert {p.parent.name for p in scripts} == {"benchmarks", "speed", "experiments", "gpu", "screens", "soak"}
    editing = [str(p.relative_to(ROOT)) for p in scripts if "sys.path" in p.read_text()]
    assert editing == []
    assert all((p.parent / "__init__.py").is_file() for p in scripts)


def test_no_function_is_longer_than_60_lines():
    """A function reads as its parts (`GRPOLearner.step`: prepare, logprobs, update, metrics): one
    past 60 lines, from `def` to its last line with docstring and nested functions, is a sign that
    two parts have grown together. Checked over the library and the orchestration shell."""
    long = []
    for top in ("prompt_r1", "flows", "tasks", "warehouse"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 60:
                    long.append(f"{path.relative_to(ROOT)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert long == []


def test_every_package_docstring_names_its_modules():
    """A package's docstring is its table of contents: each module and subpackage in it is named
    (as `name`), so a module added without a word about what it holds shows up here."""
    missing = []
    for top in ("prompt_r1", "flows", "tasks", "warehouse"):
        for init in sorted((ROOT / top).rglob("__init__.py")):
            doc = ast.get_docstring(ast.parse(init.read_text())) or ""
            names = [p.stem for p in init.parent.glob("*.py") if p.stem != "__init__"]
            names += [p.name for p in init.parent.iterdir() if (p / "__init__.py").is_file()]
            missing += [f"{init.relative_to(ROOT)}: {name}" for name in sorted(names)
                        if not any(f"`{name}{end}" in doc for end in ("`", "/`", "."))]
    assert missing == []


def test_every_markdown_section_appears_once():
    """A merge that repeats a block of a document leaves two sections of the same title, one of
    them stale (the README once carried two demo sections with different timings)."""
    from collections import Counter

    for doc in [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]:
        fence, headings = False, []
        for line in doc.read_text().splitlines():
            fence ^= line.startswith("```")
            if not fence and line.startswith("#"):
                headings.append(line.strip())
        repeated = [h for h, n in Counter(headings).items() if n > 1]
        assert not repeated, f"{doc.name}: sections repeated: {repeated}"
