#!/usr/bin/env bash
# What a device call carries besides the working tree (both git-ignored; carry [".whl", ".device"]), made
# here, where PyPI is reachable: .whl/, the wheels tools/device/gpu_run.sh installs on the device machine
# (its image has CuPy, NumPy, tokenizers, jinja2 and httpx, not the server's other needs) for its Python
# 3.12; .device/tok.gguf, the default model's tokenizer alone, which the synthetic models take;
# .device/llama.tgz, llama.cpp's sources for the peers steps.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
platforms=""
for n in 17 24 27 28 31 34 35; do platforms="$platforms --platform manylinux_2_${n}_x86_64"; done
for name in gguf fastapi starlette pydantic pydantic_core uvicorn "llguidance>=1.7.6" annotated_types annotated_doc \
    typing_inspection opentelemetry_api importlib_metadata zipp prometheus_client jsonschema jsonschema_specifications \
    referencing rpds_py lark h11 click anyio typing_extensions py-spy; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 $platforms --platform any -d .whl "$name" 2>&1 | grep -v "^WARNING: Location" || true
done
# pydantic pins its core: keep the one it names
core=$(unzip -p .whl/pydantic-2*.whl '*/METADATA' | sed -n 's/^Requires-Dist: pydantic-core==//p')
find .whl -name 'pydantic_core-*' ! -name "pydantic_core-$core-*" -delete
ls .whl
mkdir -p .device
[ -f .device/tok.gguf ] || .venv/bin/python tools/fixtures/make_synthetic_gguf.py .device/tok.gguf --vocab-only
# llama.cpp's sources for the peers steps (../shared/PEERS.md): the llama-cpp-python sdist's vendored copy, only
# what its build needs (about 10 MB)
if [ ! -f .device/llama.tgz ]; then
  src=$(mktemp -d)
  python3 -m pip download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d "$src" 2>&1 | grep -v "^WARNING: Location" || true
  tar -xzf "$src"/llama_cpp_python-0.3.36.tar.gz -C "$src"
  tar -czf .device/llama.tgz -C "$src"/llama_cpp_python-0.3.36/vendor/llama.cpp app cmake common ggml include src tools \
    vendor scripts licenses LICENSE CMakeLists.txt
  rm -rf "$src"
fi
