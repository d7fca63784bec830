"""engine/modelfile/gguf_file.py reads what gguf's own GGUFReader reads (every field's value, every tensor's
type, shape, size and bytes), and a file that is not a GGUF is a clear error, here and from the
engine and the server processes."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from gguf import GGUFReader

from engine.modelfile.gguf_file import GGUFFile, GGUFFormatError
from engine.modelfile.model_path import resolve_model_path
from tests.harness import ROOT


def test_fields_and_tensors_equal_gguf_readers():
    path = str(resolve_model_path(None))
    ours, theirs = GGUFFile(path), GGUFReader(path, "r")
    assert set(ours.fields) == set(theirs.fields)
    for key, field in theirs.fields.items():
        want, got = field.contents(), ours.fields[key].contents()
        if isinstance(want, float) or (isinstance(want, list) and want and isinstance(want[0], float)):
            np.testing.assert_allclose(got, want, rtol=0, atol=0)
        else:
            assert got == want, key
    assert len(ours.fields["tokenizer.ggml.tokens"].data) == 49152
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert (a.tensor_type, list(a.shape), a.n_elements, a.n_bytes, a.data_offset) == (
            b.tensor_type, list(b.shape), b.n_elements, b.n_bytes, b.data_offset), a.name
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape and np.array_equal(a.data, b.data)


@pytest.mark.parametrize("content, message", [(b"not a model at all", "no GGUF magic"),
                                              (b"GGUF\x03\x00\x00\x00" + b"\x01" * 12, "not a readable GGUF")])
def test_a_file_that_is_not_gguf_is_a_clear_error(tmp_path, content, message):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(content)
    with pytest.raises(GGUFFormatError, match=message):
        GGUFFile(bad)


def test_cut_short_is_a_clear_error(tmp_path):
    whole = resolve_model_path(None).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: len(whole) // 2])  # the header whole, the tensors' data not
    with pytest.raises(GGUFFormatError, match="runs past the end of the file"):
        GGUFFile(cut)


@pytest.mark.parametrize("command", [[sys.executable, "-m", "engine", "--serve", "--device", "cpu", "--model"],
                                     [sys.executable, "-m", "serve", "--model"]])
def test_the_processes_refuse_it_with_a_message(tmp_path, command):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model at all")
    run = subprocess.run([*command, str(bad)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode != 0 and "not a readable GGUF file" in run.stderr


def rss_file_kib() -> int:
    """This process's resident pages of mapped files (Linux's /proc/self/status RssFile)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:"))


def test_released_pages_leave_the_processes_resident_memory_and_read_back_the_same():
    f = GGUFFile(str(resolve_model_path(None)))  # (the default model's ~90 MB)
    big = max(f.tensors, key=lambda t: t.n_bytes)
    before = rss_file_kib()
    first = np.array(big.data, copy=True)  # every page of the tensor touched
    touched = rss_file_kib()
    assert touched - before > big.n_bytes // 1024 // 2  # (pages the test's own imports brought in are counted too)
    f.release_pages()
    assert rss_file_kib() < touched - big.n_bytes // 1024 // 2
    np.testing.assert_array_equal(np.asarray(big.data), first)  # read again from the page cache: the same bytes
