"""GpuKernels split into a module a kernel family (issue 43) with nothing lost, checked on the CPU (no
CuPy): the launchers run on the GPU only, so the split is held to the old text.

- every attribute of the old GpuKernels (its methods and what it set on self) is on the new one, and
  every name the old engine/kernels/__init__.py defined or took from engine/kernels/ is importable from
  engine.kernels;
- every old method and module-level function has the same syntax tree in its new place (the moe module
  renamed moe_launch), every old constant's line is in a new module, and the old __init__ equals the
  new one with load_modules and prepare_functions put back in line;
- every attribute the house reaches on a GpuKernels (`kernels.`, `.kernels.`, `k.` where k is one) or on
  the engine.kernels module, and every name it imports from there, exists;
- no class in engine/kernels/ is over 200 lines.

    python tools/checks/kernels_api_check.py [--old REV]   (REV: the commit before the split)
"""
from __future__ import annotations

import argparse
import ast
import inspect
import io
import subprocess
import sys
import textwrap
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import engine.kernels as new_module  # noqa: E402
from engine.kernels import GpuKernels  # noqa: E402

OLD_REV = "9eac495"  # the last commit with GpuKernels whole in engine/kernels/__init__.py
RENAMED = {"moe": "moe_launch"}  # old module names -> new
INLINED = ("load_modules", "prepare_functions")  # the old __init__'s parts, now methods it calls
MAX_CLASS_LINES = 200
SELF = ("tools/checks/kernels_api_check.py", "tools/checks/kernels_launch_compare.py")  # they reach the old GpuKernels on purpose


def old_text(rev: str) -> str:
    return subprocess.run(["git", "show", f"{rev}:engine/kernels/__init__.py"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout


def comments(text: str) -> list[str]:
    return [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT]


def self_attributes(cls_node: ast.ClassDef) -> set[str]:
    """What a class's methods set on self."""
    return {t.attr for node in ast.walk(cls_node) if isinstance(node, (ast.Assign, ast.AugAssign))
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            for t in ast.walk(t) if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
            and t.value.id == "self"}


def class_node(cls) -> ast.ClassDef:
    return ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]


def instance_attributes() -> set[str]:
    """What the new GpuKernels' parts set on self."""
    return {n for cls in GpuKernels.__mro__[:-1] for n in self_attributes(class_node(cls))}


def new_attributes() -> set[str]:
    return {n for n in dir(GpuKernels) if not n.startswith("__") or n == "__init__"} | instance_attributes()


class Renamed(ast.NodeTransformer):
    def visit_Name(self, node):
        return ast.copy_location(ast.Name(RENAMED.get(node.id, node.id), node.ctx), node)


def dump(node) -> str:
    return ast.dump(Renamed().visit(ast.parse(ast.unparse(node))))


def body_without_docstring(fn: ast.FunctionDef) -> list:
    body = fn.body
    has_doc = body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
    return body[1:] if has_doc else body


def inlined_init() -> list:
    """The new __init__'s statements with self.load_modules(...) and self.prepare_functions(...)
    replaced by those methods' bodies (load_modules' `cp = self.cp` left out: __init__ has cp)."""
    methods = {name: class_node(cls).body for cls in GpuKernels.__mro__[:-1] for name in INLINED
               if name in vars(cls)}
    found = {}
    for name, body in methods.items():
        fn = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
        statements = body_without_docstring(fn)
        if name == "load_modules":
            assert ast.unparse(statements[0]) == "cp = self.cp", "load_modules starts with cp = self.cp"
            statements = statements[1:]
        found[name] = statements
    init = next(n for n in class_node(GpuKernels).body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    out = []
    for stmt in init.body:
        call = stmt.value if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) else None
        name = call.func.attr if call and isinstance(call.func, ast.Attribute) else None
        out += found[name] if name in found else [stmt]
    return out


def new_definitions() -> dict[str, ast.AST]:
    """Every function and method of engine/kernels/*.py by name (methods of the GpuKernels parts)."""
    found = {}
    for path in sorted((ROOT / "engine" / "kernels").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef):
                found.setdefault(node.name, node)
    for cls in GpuKernels.__mro__[:-1]:
        for node in class_node(cls).body:
            if isinstance(node, ast.FunctionDef):
                found[f"GpuKernels.{node.name}"] = found.get(f"GpuKernels.{node.name}", node)
    return found


def new_statements() -> set[str]:
    return {dump(node) for path in (ROOT / "engine" / "kernels").glob("*.py")
            for node in ast.parse(path.read_text()).body if isinstance(node, (ast.Assign, ast.AnnAssign))}


def old_names(tree: ast.Module) -> set[str]:
    """Names the old module defined, or imported from engine/kernels/ (not numpy, not engine.core)."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("engine.kernels"):
            names |= {RENAMED.get(a.asname or a.name, a.asname or a.name) for a in node.names}
    return names


def receivers(path: Path) -> list[tuple[int, str, bool]]:
    """(line, attribute, on the module) for each attribute reached on a GpuKernels or on engine.kernels
    (`from engine.kernels import NAME` included)."""
    text = path.read_text()
    tree = ast.parse(text)
    k_is_kernels = "GpuKernels" in text
    module_aliases = {a.asname for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
                      if a.name == "engine.kernels" and a.asname}
    out = [(node.lineno, a.name, True) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
           and node.module == "engine.kernels" for a in node.names]
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        v = node.value
        engine_kernels = isinstance(v, ast.Attribute) and v.attr == "kernels" and isinstance(v.value, ast.Name) and (
            v.value.id == "engine")
        if engine_kernels or (isinstance(v, ast.Name) and v.id in module_aliases):
            out.append((node.lineno, node.attr, True))
        elif (isinstance(v, ast.Name) and (v.id == "kernels" or (v.id == "k" and k_is_kernels))) or (
                isinstance(v, ast.Attribute) and v.attr == "kernels"):
            out.append((node.lineno, node.attr, False))
    return out


def class_sizes(folder: Path) -> list[tuple[int, str]]:
    rows = []
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                rows.append((node.end_lineno - node.lineno + 1, f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"))
    return sorted(rows, reverse=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", default=OLD_REV, help="the commit whose engine/kernels/__init__.py is the reference")
    a = p.parse_args()
    text = old_text(a.old)
    tree = ast.parse(text)
    old_cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GpuKernels")
    problems = []

    old_attrs = {n.name for n in old_cls.body if isinstance(n, ast.FunctionDef)} | self_attributes(old_cls)
    attrs = new_attributes()
    problems += [f"GpuKernels.{n}: gone" for n in sorted(old_attrs - attrs)]
    problems += [f"engine.kernels.{n}: not importable" for n in sorted(old_names(tree)) if not hasattr(new_module, n)]
    methods = {n for cls in GpuKernels.__mro__[:-1] for n, v in vars(cls).items()
               if callable(v) or isinstance(v, staticmethod)}
    problems += [f"GpuKernels.{n}: a method shadowed by an attribute set on self"
                 for n in sorted(methods & instance_attributes())]
    print(f"GpuKernels: {len(old_attrs)} attributes before, all {len(old_attrs & attrs)} there now "
          f"({len(attrs)} in all)")

    defs = new_definitions()
    same = 0
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            new = defs.get(node.name)
            ok = new is not None and dump(new) == dump(node)
            same += ok
            problems += [] if ok else [f"{node.name}: not moved verbatim"]
    for node in old_cls.body:
        if isinstance(node, ast.FunctionDef) and node.name != "__init__":
            new = defs.get(f"GpuKernels.{node.name}")
            ok = new is not None and dump(new) == dump(node)
            same += ok
            problems += [] if ok else [f"GpuKernels.{node.name}: not moved verbatim"]
    old_init = next(n for n in old_cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    init_same = [dump(s) for s in old_init.body] == [dump(s) for s in inlined_init()]
    problems += [] if init_same else ["GpuKernels.__init__: differs from the old one with its parts in line"]
    statements = new_statements()
    constants = [node for node in tree.body if isinstance(node, ast.Assign)]
    problems += [f"{ast.unparse(node)[:60]}: not in a new module" for node in constants if dump(node) not in statements]
    kept = {c for path in (ROOT / "engine" / "kernels").glob("*.py") for c in comments(path.read_text())}
    banners = [c for c in comments(text) if c.startswith("# ----") and c not in kept]  # now module docstrings
    lint = [c for c in comments(text) if c.startswith("# noqa")]  # the re-exports are __all__ now
    problems += [f"comment {c!r}: not kept" for c in comments(text) if c not in kept and c not in banners + lint]
    init = "equal with its parts in line" if init_same else "DIFFERS"
    print(f"verbatim: {same} functions and methods, {len(constants)} constants, every comment (section banners "
          f"now module docstrings: {len(banners)}), __init__ {init}")

    files = [f for d in ("engine", "serve", "tools", "tests", "bench") for f in sorted((ROOT / d).rglob("*.py"))
             if f.relative_to(ROOT).as_posix() not in SELF]
    reached = 0
    for path in files:
        for line, name, on_module in receivers(path):
            reached += 1
            where = f"{path.relative_to(ROOT)}:{line}"
            if on_module and not hasattr(new_module, name):
                problems.append(f"{where}: engine.kernels.{name} does not exist")
            elif not on_module and name not in attrs and not hasattr(new_module, name):
                before = name in old_attrs or name in old_names(tree)
                message = f"{where}: .{name} is on neither GpuKernels nor engine.kernels"
                if before:
                    problems.append(message)
                else:
                    print(f"note (as before the split): {message}")
    print(f"call sites: {reached} attributes reached on a GpuKernels or engine.kernels")

    sizes = class_sizes(ROOT / "engine")
    problems += [f"{where}: {n} lines" for n, where in sizes if n > MAX_CLASS_LINES and "engine/kernels/" in where]
    print("largest classes in engine/: " + "; ".join(f"{where} {n}" for n, where in sizes[:4]))
    for problem in problems:
        print("PROBLEM", problem)
    print("ok" if not problems else f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
