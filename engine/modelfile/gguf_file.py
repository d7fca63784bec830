"""A GGUF file's metadata and tensor table, read fast: the subset of gguf.GGUFReader's interface the
engine and the server use (fields[key].contents(), tensors[i].name / tensor_type / shape / n_bytes /
data), parsed in one pass over the memory-mapped header.

Why not GGUFReader itself: it builds several NumPy views for every element of every array field,
and a 150K-token vocabulary with its 150K merges is 300K strings: about 16 s on a 2-core machine
for Qwen2.5's file, paid by the server and by the engine at every start. Here a string array is one
loop of struct reads (well under a second). The gguf package still names the types and their block
sizes, and dequantizes.

Layout (GGUF v2 and v3, little-endian): magic, version, tensor count, key/value count; the
key/value pairs (a string key, a value type, the value); per tensor its name, dimensions (ggml
order: the row width first), type and offset; tensor data from the next multiple of
general.alignment (32 by default).
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

MAGIC = 0x46554747  # "GGUF" little-endian
LENGTH = struct.Struct("<Q")  # a string's byte count before its UTF-8 bytes
SCALARS = {GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
           GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i", GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?",
           GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d"}
ARRAY_DTYPES = {GGUFValueType.UINT8: "<u1", GGUFValueType.INT8: "<i1", GGUFValueType.UINT16: "<u2",
                GGUFValueType.INT16: "<i2", GGUFValueType.UINT32: "<u4", GGUFValueType.INT32: "<i4",
                GGUFValueType.FLOAT32: "<f4", GGUFValueType.BOOL: "?", GGUFValueType.UINT64: "<u8",
                GGUFValueType.INT64: "<i8", GGUFValueType.FLOAT64: "<f8"}
TYPED = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,  # other types: their bytes
         GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8, GGMLQuantizationType.I16: np.int16,
         GGMLQuantizationType.I32: np.int32, GGMLQuantizationType.I64: np.int64}


class GGUFFormatError(ValueError):
    """The file is not a GGUF this reader understands (or is cut short)."""


@dataclass(frozen=True)
class Field:
    name: str
    value: object  # a Python scalar or str, or a list for an array

    def contents(self):
        return self.value

    @property
    def data(self):
        """An array field's elements (GGUFReader's .data indexes them; only its length is used)."""
        return self.value


@dataclass(frozen=True)
class Tensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: np.ndarray  # GGUF's dimensions, the row width first
    n_elements: int
    n_bytes: int
    data_offset: int
    data: np.ndarray  # the memory-mapped values, numpy order (rows last-first); block types as bytes (..., row bytes)


class GGUFFile:
    def __init__(self, path: str | Path, mode: str = "r"):
        """mode is accepted for GGUFReader's signature; the file is always mapped read-only."""
        self.path = str(path)
        with open(self.path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._pos = 0
        try:
            self.fields, self.tensors = self._parse()
        except (struct.error, UnicodeDecodeError, ValueError) as e:
            raise GGUFFormatError(f"{self.path}: not a readable GGUF file ({e})") from None

    def release_pages(self) -> None:
        """Unmap the pages this process touched (a GPU engine's, once the weights are on the device): the process's
        resident memory no longer counts the file's bytes, which stay in the page cache for the next start and come
        back from it if read again (MADV_DONTNEED on a read-only file mapping)."""
        if hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)

    # ------------------------------------------------------------ primitives

    def _unpack(self, fmt: str):
        value = struct.unpack_from(fmt, self._map, self._pos)[0]
        self._pos += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        n = self._unpack("<Q")
        end = self._pos + n
        if end > len(self._map):
            raise ValueError("a string runs past the end of the file")
        text = self._map[self._pos:end].decode("utf-8")
        self._pos = end
        return text

    def _strings(self, count: int) -> list[str]:
        """_string count times, in one tight loop: a vocabulary and its merges are ~100K-300K strings,
        read by every server and engine start."""
        m, pos, size, out = self._map, self._pos, len(self._map), []
        length, append = LENGTH.unpack_from, out.append
        for _ in range(count):
            end = pos + 8 + length(m, pos)[0]
            if end > size:
                raise ValueError("a string runs past the end of the file")
            append(m[pos + 8:end].decode("utf-8"))
            pos = end
        self._pos = pos
        return out

    def _value(self, kind: int):
        kind = GGUFValueType(kind)
        if kind == GGUFValueType.STRING:
            return self._string()
        if kind == GGUFValueType.ARRAY:
            item, count = GGUFValueType(self._unpack("<I")), self._unpack("<Q")
            if item == GGUFValueType.STRING:
                return self._strings(count)
            if item == GGUFValueType.ARRAY:
                return [self._value(GGUFValueType.ARRAY) for _ in range(count)]
            dtype = np.dtype(ARRAY_DTYPES[item])
            values = np.frombuffer(self._map, dtype=dtype, count=count, offset=self._pos)
            self._pos += dtype.itemsize * count
            return values.tolist()
        return self._unpack(SCALARS[kind])

    # ------------------------------------------------------------ the file

    def _parse(self) -> tuple[dict[str, Field], list[Tensor]]:
        if self._unpack("<I") != MAGIC:
            raise ValueError("no GGUF magic")
        version = self._unpack("<I")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} (2 and 3 are read)")
        n_tensors, n_fields = self._unpack("<Q"), self._unpack("<Q")
        fields = {key: Field(key, value) for key, value in  # the header, as GGUFReader lists it
                  (("GGUF.version", version), ("GGUF.tensor_count", n_tensors), ("GGUF.kv_count", n_fields))}
        for _ in range(n_fields):
            key = self._string()
            fields[key] = Field(key, self._value(self._unpack("<I")))
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            dims = [self._unpack("<Q") for _ in range(self._unpack("<I"))]
            infos.append((name, dims, GGMLQuantizationType(self._unpack("<I")), self._unpack("<Q")))
        alignment = int(fields["general.alignment"].value) if "general.alignment" in fields else 32
        start = -(-self._pos // alignment) * alignment
        return fields, [self._tensor(start, *info) for info in infos]

    def _tensor(self, start: int, name: str, dims: list[int], kind: GGMLQuantizationType, offset: int) -> Tensor:
        n = int(np.prod(dims)) if dims else 1
        block, size = GGML_QUANT_SIZES[kind]
        n_bytes = n * size // block
        shape = list(reversed(dims))
        if kind in TYPED:
            dtype, count = np.dtype(TYPED[kind]), n
        else:  # (..., row bytes)
            dtype, count = np.dtype(np.uint8), n_bytes
            shape[-1] = shape[-1] // block * size
        at = start + offset
        if at + n_bytes > len(self._map):
            raise ValueError(f"tensor {name} runs past the end of the file")
        data = np.frombuffer(self._map, dtype=dtype, count=count, offset=at).reshape(shape)
        return Tensor(name, kind, np.array(dims, dtype=np.uint64), n, n_bytes, at, data)
