"""The house's layering: no import cycle among the project's modules, and packages importing only
downwards (protocol/ below engine/ below serve/). Imports at module level and inside functions both
count: a cycle through a function-level import still ties the two modules together."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("protocol", "engine", "serve")  # bottom to top: each may import those before it
# the engine's folders, bottom to top: each may import those before it; the modules at engine/'s root
# (the programs: cli, config, startup, terminal, mock_engine) sit above them all
ENGINE_LAYERS = ("core", "modelfile", "kernels", "ops", "kvcache", "model", "runner", "parallel", "loop")
# the server's layers, bottom to top: its folders and, between them, three modules at its root (the
# settings, the state every route reads, and the set of models by name, one state each); app.py,
# cli.py and __main__.py sit above them all
SERVE_LAYERS = ("api", "engine_proc", "scheduling", "config", "state", "model_set", "http")
# what serve/ may import of the engine: its package (the version), its configuration, and the bottom
# layers that read model files and name core types, never the engine's machinery
ENGINE_FACE = ("engine", "engine.config", "engine.core", "engine.modelfile")


def project_modules() -> dict[str, Path]:
    """Dotted name -> file, for every module of the project's packages."""
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `name` imports: `from a.b import c` counts as a.b.c where that is a module,
    else as a.b; relative imports resolved against the module's package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names if alias.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out |= {sub} if sub in known else ({base} if base in known else set())
    return out - {name}


def import_graph() -> dict[str, set[str]]:
    known = project_modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = counter
                    counter += 1
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_imports_itself_back():
    assert cycles(import_graph()) == []


def test_packages_import_only_downwards():
    upward = [(name, target) for name, targets in import_graph().items() for target in targets
              if PACKAGES.index(target.split(".")[0]) > PACKAGES.index(name.split(".")[0])]
    assert upward == []


def layer_of(name: str, package: str, layers: tuple[str, ...]) -> int | None:
    """A module's place among its package's layers: the index of its folder, len(layers) for a module
    at the package's root (above every folder), None for the package itself or another package."""
    parts = name.split(".")
    if parts[0] != package or len(parts) == 1:
        return None
    return layers.index(parts[1]) if parts[1] in layers else len(layers)


def upward_imports(graph: dict[str, set[str]], package: str, layers: tuple[str, ...]) -> list[tuple[str, str]]:
    """Imports from a folder of `package` into a folder above it or into the package's root modules."""
    found = []
    for name, targets in graph.items():
        here = layer_of(name, package, layers)
        if here is None or here == len(layers):
            continue
        for target in targets:
            there = layer_of(target, package, layers)
            if there is not None and there > here:
                found.append((name, target))
    return sorted(found)


def test_the_engines_folders_import_only_downwards():
    graph = import_graph()
    assert {name.split(".")[1] for name in graph if name.startswith("engine.") and
            (ROOT / "engine" / name.split(".")[1]).is_dir()} == set(ENGINE_LAYERS)  # every folder placed
    assert upward_imports(graph, "engine", ENGINE_LAYERS) == []


def test_the_servers_layers_import_only_downwards():
    graph = import_graph()
    assert {name.split(".")[1] for name in graph if name.startswith("serve.") and
            (ROOT / "serve" / name.split(".")[1]).is_dir()} <= set(SERVE_LAYERS)  # every folder placed
    assert upward_imports(graph, "serve", SERVE_LAYERS) == []


def test_serve_reaches_the_engine_only_through_its_face():
    reached = {(name, target) for name, targets in import_graph().items() if name.split(".")[0] == "serve"
               for target in targets if target.split(".")[0] == "engine"}
    outside = [(name, target) for name, target in reached
               if not any(target == face or target.startswith(face + ".") for face in ENGINE_FACE)]
    assert reached and sorted(outside) == []


def test_an_upward_import_is_found():
    graph = {"engine.core.step": {"engine.loop.loop"}, "engine.loop.loop": {"engine.core.step"},
             "engine.cli": {"engine.loop.loop"}}
    assert upward_imports(graph, "engine", ENGINE_LAYERS) == [("engine.core.step", "engine.loop.loop")]


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
