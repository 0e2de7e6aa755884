"""An F32 copy of a GGUF file, written by llama.cpp itself: every quantized weight dequantized
to the float32 values the file's types decode to, so that llama.cpp runs on the numbers
transformers loads from the same GGUF (it dequantizes with gguf's decoders, which give the same
values: the tests compare them), and a port run on its dequantized weights can be compared with
it to float rounding.

    python -m model_trace.gguf_f32 SRC.gguf DST.gguf [--threads N] [--verbose]

It calls llama.cpp's quantize (``llama_model_quantize`` of llama-cpp-python, the version
:mod:`model_trace.llama_cpp` needs) with the all-F32 file type and requantizing allowed: the
matrices are dequantized, the vectors (already F32) copied, every metadata key kept, and the key
:data:`MARKER` added (``model_trace.dequantized_from``: the source's weight types, comma
separated, ``Q4_K,Q5_0,Q6_K,Q8_0``), since llama.cpp overwrites ``general.file_type`` with
the F32 type and would leave no trace of them. :func:`model_trace.llama_cpp.run` reads it: a
trace of llama.cpp on the copy records ``metadata.precision`` ``{"weights": ["F32"],
"dequantized_from": [...]}``.

Cost, measured here (2 shared cores): SmolLM2-135M's Q4_1 file (92 MiB) becomes 515 MiB in
1-8 s, Gemma 3 270M's (241 MiB) 1.0 GiB in 2.5-6 s.
The file is written beside ``DST`` under a temporary name and renamed into place when whole.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
from typing import List, Optional

from . import gguf_file
from .llama_cpp import LlamaCppError, _llama_cpp, _quiet

#: The metadata key of the copy that names the types its weights were dequantized from
#: (:meth:`model_trace.gguf_file.GgufFile.dequantized_from` reads it).
MARKER = gguf_file.DEQUANTIZED_FROM


def write_f32(source: str, out: str, *, threads: int = 0, verbose: bool = False) -> List[str]:
    """Writes the F32 copy of the GGUF at ``source`` to ``out`` (replaced if it exists) and
    returns the types its weights were dequantized from (what :data:`MARKER` says: the
    source's non-F32 matrix types, or the source's own marker where it is itself a copy).
    ``threads``: llama.cpp's (0: one a core). llama.cpp's log lines are dropped unless
    ``verbose``. :class:`LlamaCppError` when llama.cpp fails; ValueError when ``out`` is
    ``source``."""
    if not os.path.isfile(source):
        raise LlamaCppError(f"no GGUF file at {source}")
    if os.path.abspath(out) == os.path.abspath(source):
        raise ValueError(f"the F32 copy would overwrite its source {source}: name another file")
    info = gguf_file.read(source)
    types = info.dequantized_from() or [t for t in info.weight_types() if t != "F32"]
    L = _llama_cpp()
    _quiet(L, verbose)
    L.llama_backend_init()
    params = L.llama_model_quantize_default_params()
    params.ftype = L.LLAMA_FTYPE_ALL_F32
    params.allow_requantize = True
    params.nthread = threads
    # A C array of overrides ended by one whose key is empty, as llama.h asks.
    overrides = (L.llama_model_kv_override * 2)()
    if types:
        overrides[0].tag = L.LLAMA_KV_OVERRIDE_TYPE_STR
        overrides[0].key = MARKER.encode()
        overrides[0].value.val_str = ",".join(types).encode()
        params.kv_overrides = ctypes.cast(overrides, ctypes.POINTER(L.llama_model_kv_override))
    directory, name = os.path.split(os.path.abspath(out))
    partial = os.path.join(directory, f".{name}.{os.getpid()}.partial")
    try:
        status = L.llama_model_quantize(source.encode(), partial.encode(), ctypes.byref(params))
        if status != 0:
            raise LlamaCppError(f"llama.cpp's quantize failed on {source} (status {status}; --verbose shows its log)")
        os.replace(partial, out)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return types


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model_trace.gguf_f32", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", help="the GGUF file to dequantize")
    parser.add_argument("out", help="the F32 GGUF file to write")
    parser.add_argument("--threads", type=int, default=0, help="llama.cpp's threads (default 0: one a core)")
    parser.add_argument("--verbose", action="store_true", help="show llama.cpp's own log lines")
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        types = write_f32(args.source, args.out, threads=args.threads, verbose=args.verbose)
    except (LlamaCppError, gguf_file.GgufError, ValueError, OSError) as error:
        print(f"model_trace.gguf_f32: {error}", file=sys.stderr)
        return 1
    what = f"dequantized from {', '.join(types)}" if types else "copied (the source has float weights only)"
    print(f"{args.out}: F32 weights {what}, in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
