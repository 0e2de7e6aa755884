"""What a GGUF file says of itself: its metadata's scalar and string values and its tensor-info
table (each tensor's name, shape, ggml type and where its data lies), read from the file's
header without loading any tensor and without llama.cpp.

The writers record a run's precision from it (``metadata.precision.weights``: the types of a
GGUF's matmul weights), and :mod:`model_trace.gguf_f32` reads back what it wrote. The format is
ggml's ``docs/gguf.md`` (versions 2 and 3, little-endian): the magic ``GGUF``, the version, the
tensor and key counts, the key-value pairs, the tensor infos, then the data, aligned to
``general.alignment`` (32 by default).

    >>> info = model_trace.gguf_file.read("SmolLM2-135M-Instruct.Q4_1.gguf")
    >>> info.weight_types()
    ['Q4_1', 'Q8_0']

Reading walks every key, arrays of strings included, and maps no tensor data: 0.2 s for Gemma
3 270M's GGUF (a 262,144-token vocabulary), 0.09 s for SmolLM2's, measured here (gguf's
``GGUFReader``, which builds an object a vocabulary entry, took 38 s on Gemma's).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

#: ggml's type numbers (``enum ggml_type`` of ``ggml.h`` in the llama.cpp that llama-cpp-python
#: 0.3.36 vendors) and their names as ggml and the GGUF format write them, upper case. The
#: gaps are types ggml removed. A test checks the names against the library's
#: ``ggml_type_name``.
GGML_TYPES: Dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
    17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS",
    24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0",
    35: "TQ2_0", 39: "MXFP4",
}

#: The metadata key of an F32 copy written by :func:`model_trace.gguf_f32.write_f32`: the types
#: its weights were dequantized from, comma separated.
DEQUANTIZED_FROM = "model_trace.dequantized_from"

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF's value types: the struct format of each fixed-size one, and the two that are not.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class GgufError(ValueError):
    """A file that is not a GGUF file this reader understands (another magic, version 1, a
    value type it does not know, a table that runs past the end of the file)."""


def type_name(number: int) -> str:
    """ggml's name of a type number (``12`` -> ``"Q4_K"``); ``GGML_TYPE_<n>`` for a number this
    table does not know."""
    return GGML_TYPES.get(number, f"GGML_TYPE_{number}")


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor-info table."""

    #: The tensor's name (``blk.3.attn_q.weight``).
    name: str
    #: Its sizes as ggml lists them, innermost first (``ne``): ``[576, 1536]`` is 1536 rows of 576.
    shape: Tuple[int, ...]
    #: Its ggml type's name (:func:`type_name`).
    type: str
    #: Where its data begins in the file, in bytes from the start of the file.
    offset: int


@dataclass
class GgufFile:
    """A GGUF file's header: :func:`read` makes it."""

    path: str
    version: int
    #: The metadata's keys with their values, where a value is a number, a bool or a string;
    #: an array's key maps to None (the vocabulary's arrays are not kept).
    metadata: Dict[str, Any] = field(default_factory=dict)
    tensors: List[TensorInfo] = field(default_factory=list)

    def tensor(self, name: str) -> TensorInfo:
        """The tensor called ``name``; KeyError naming the file where there is none."""
        for tensor in self.tensors:
            if tensor.name == name:
                return tensor
        raise KeyError(f"{self.path} has no tensor {name!r}")

    def weight_types(self) -> List[str]:
        """The types of the matrices (the tensors of two or more dimensions: the matmul weights
        and the token embeddings, which a tied head multiplies by), each once, sorted. The
        vectors (norms, biases) are left out: a GGUF keeps them in F32 whatever its matmuls'
        types."""
        return sorted({t.type for t in self.tensors if sum(1 for n in t.shape if n > 1) >= 2})

    def dequantized_from(self) -> List[str]:
        """The types this file's float weights were dequantized from, as
        :func:`model_trace.gguf_f32.write_f32` marks them (:data:`DEQUANTIZED_FROM`); empty for
        a file it did not write."""
        marker = self.metadata.get(DEQUANTIZED_FROM)
        return [t for t in marker.split(",") if t] if isinstance(marker, str) else []


def read(path: str) -> GgufFile:
    """The header of the GGUF file at ``path`` (:class:`GgufFile`); :class:`GgufError` when it
    is not one this reader understands, OSError when it cannot be read."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return _Reader(data, path).header()


class _Reader:
    """A cursor over the file's bytes."""

    def __init__(self, data: Any, path: str) -> None:
        self.data, self.path, self.at = data, path, 0

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.at + size > len(self.data):
            raise GgufError(f"{self.path}: the GGUF header runs past the end of the file (at byte {self.at})")
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += size
        return value

    def string(self) -> str:
        length = self.take("<Q")
        if self.at + length > len(self.data):
            raise GgufError(f"{self.path}: a string of {length} bytes runs past the end of the file")
        text = bytes(self.data[self.at:self.at + length]).decode("utf-8", "replace")
        self.at += length
        return text

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            self.skip_array()
            return None
        raise GgufError(f"{self.path}: unknown GGUF value type {kind} at byte {self.at}")

    def skip_array(self) -> None:
        kind, count = self.take("<I"), self.take("<Q")
        if kind in _SCALARS:
            self.at += count * struct.calcsize(_SCALARS[kind])
        elif kind == _STRING:
            for _ in range(count):
                length = self.take("<Q")  # before the add: take() moves the cursor
                self.at += length
        else:
            for _ in range(count):
                self.value(kind)

    def header(self) -> GgufFile:
        if bytes(self.data[:4]) != MAGIC:
            raise GgufError(f"{self.path} is not a GGUF file (it does not begin with {MAGIC!r})")
        self.at = 4
        version = self.take("<I")
        if version not in (2, 3):
            raise GgufError(f"{self.path}: GGUF version {version}; this reader reads versions 2 and 3")
        tensor_count, key_count = self.take("<Q"), self.take("<Q")
        info = GgufFile(self.path, version)
        for _ in range(key_count):
            key = self.string()
            info.metadata[key] = self.value(self.take("<I"))
        entries = [self.tensor_entry() for _ in range(tensor_count)]
        alignment = info.metadata.get("general.alignment") or DEFAULT_ALIGNMENT
        start = -(-self.at // alignment) * alignment
        info.tensors = [TensorInfo(name, shape, kind, start + offset) for name, shape, kind, offset in entries]
        return info

    def tensor_entry(self) -> Tuple[str, Tuple[int, ...], str, int]:
        name = self.string()
        dimensions = self.take("<I")
        shape = tuple(self.take("<Q") for _ in range(dimensions))
        return name, shape, type_name(self.take("<I")), self.take("<Q")


def weight_types(path: str) -> List[str]:
    """The types of the GGUF file's matrices (:meth:`GgufFile.weight_types`), what a writer
    records as ``metadata.precision.weights`` for a run on the file, or as its
    ``dequantized_from`` for a run on its dequantized values."""
    return read(path).weight_types()

