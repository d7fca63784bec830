"""Small classes with one job each: no class in engine/ or serve/ longer than 200 lines (its `class`
line to its last), the size past which a class was found doing several jobs (issue 43)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 200


def long_classes(paths) -> list[tuple[str, str, int]]:
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > LIMIT:
                found.append((path.as_posix(), node.name, node.end_lineno - node.lineno + 1))
    return found


def test_no_class_is_longer_than_the_limit():
    assert long_classes([*ROOT.glob("engine/**/*.py"), *ROOT.glob("serve/**/*.py")]) == []


def test_a_long_class_is_found(tmp_path):
    (tmp_path / "big.py").write_text("class Big:\n" + "    x = 1\n" * LIMIT + "\n\nclass Small:\n    pass\n")
    assert [(name, size) for _, name, size in long_classes([tmp_path / "big.py"])] == [("Big", LIMIT + 1)]
