"""The documents' references resolve: every relative link in the README and docs/, tools/ and bench/'s
READMEs names a file that exists, and every file path they quote (`engine/ops/backend.py`) too. The
diary bench/HISTORY.md is left as it was written."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "tools" / "README.md",
             ROOT / "bench" / "README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")
QUOTED_PATH = re.compile(r"`((?:engine|serve|protocol|tools|bench|tests|docs)/[\w./-]+\.(?:py|md|sh|cu|cuh|json))`")


def broken(document: Path) -> list[str]:
    text = document.read_text()
    missing = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a web address, an anchor in the same page
        if not (document.parent / target.split("#", 1)[0]).exists():
            missing.append(target)
    missing += [path for path in QUOTED_PATH.findall(text) if not (ROOT / path).exists()]
    return missing


def test_every_reference_resolves():
    assert {doc.relative_to(ROOT).as_posix(): broken(doc) for doc in DOCUMENTS if broken(doc)} == {}


def test_a_missing_file_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[there](page.md), [gone](gone.md), `engine/no_such_module.py`, [web](https://example.com)")
    assert broken(page) == ["gone.md", "engine/no_such_module.py"]
