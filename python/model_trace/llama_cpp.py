"""llama.cpp as a reference: a GGUF model run through llama-cpp-python's low-level API, its
graph's intermediate tensors read with an eval callback and written as a model-trace trace file.

    python -m model_trace.llama_cpp MODEL.gguf (--prompt TEXT | --tokens-from TRACE) \\
        [--max-tokens N] [--kv f16|f32] [--threads N] --out OUT [--capture PATTERN]

``--tokens-from TRACE`` runs the passes of a trace of the port: each pass is fed the token ids
the port's pass consumed (``pass_begin.tokens``; for a trace without them, the header's
``metadata.extra.prompt_ids`` and then each pass's chosen token), so that both sides compute the
same thing even where they would choose different tokens (teacher forcing, as the transformers
reference does). ``--prompt TEXT`` tokenizes with the GGUF's own vocabulary and lets llama.cpp
choose greedily. ``--max-tokens N``: at most N passes (the prompt's and N - 1 decode passes);
with ``--prompt`` the default is 16, with ``--tokens-from`` every pass of TRACE.

Needs ``llama-cpp-python==0.3.36`` (the ctypes view of ``ggml_tensor`` below is that version's;
another version is refused). Built with ``CMAKE_ARGS="-DGGML_NATIVE=OFF"``.

A pass is one graph run (one ``llama_decode``). Stages come from llama.cpp's node names, per layer
``N`` (``docs/trace-format.md`` has the table with what llama.cpp cannot give):

=====================  ==============================================
llama.cpp node         stage
=====================  ==============================================
``l_out-(N-1)``        ``input`` of layer N (``embd`` for layer 0)
``attn_norm-N``        ``attn_in``
``attn_out-N``         ``attn_out`` (after the output projection)
``ffn_inp-N``          ``resid_mid``
``ffn_norm-N``         ``mlp_in``
``ffn_out-N``          ``mlp_out``
``l_out-N``            ``output``
``kq_soft_max-N``      attention probabilities ``[1, heads, seq, positions]``
``result_output``      logits (the pass's last row, ``[1, vocab]``, as the port records them)
=====================  ==============================================

Only nodes computed by an operation are read: views (``... (view)``, ``(reshaped)``,
``(permuted)``) carry other names and are never taken, and a wanted name computed twice in one
graph run is an error, not a silent choice. ``Qcur``/``Kcur``/``Vcur`` (three nodes of one name:
the matmul, a reshape, RoPE) are not read: Q and K are in the GGUF's permuted row order and match
no other implementation's. ggml's dimensions are innermost first (``ne = [576, 5]`` is ``[5,
576]`` row-major); tensors are written with the batch dimension the port gives them (``[1, 5,
576]``). Flash attention is off (so that ``kq_soft_max`` exists), and every token of a pass asks
for logits (so that the last layer keeps every position: llama.cpp otherwise drops the rows
without logits before the last layer's MLP).

Cost: every node the callback asks for splits ggml's graph there. Reading SmolLM2's 212 nodes
makes ``llama_decode`` of a 57-token prompt 13-16% slower on 1 thread (6-33% on 2, noisy) and a
decode step 32-33% slower (55-62% on 2), measured here in two runs (``python/benchmarks/llama_cpp_callback.py``: medians of 7
interleaved runs); the values are
bit-identical with and without the callback.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .filter import CaptureFilter, Tracepoint
from .writer import TraceWriter

#: The llama-cpp-python version whose ``ggml_tensor`` layout :class:`_GgmlTensor` copies.
LLAMA_CPP_PYTHON = "0.3.36"

#: llama.cpp node name (without the ``-N``) -> stage, in the order a layer records them.
STAGES = {
    "attn_norm": "attn_in",
    "attn_out": "attn_out",
    "ffn_inp": "resid_mid",
    "ffn_norm": "mlp_in",
    "ffn_out": "mlp_out",
    "l_out": "output",
}

#: Global nodes read: the token embeddings (layer 0's input) and the logits.
EMBEDDINGS, LOGITS = "embd", "result_output"

#: The tracepoints a llama.cpp trace records (the header's ``tracepoints``; what capture
#: patterns match): the pass, the layer (input and output), each stage, the attention, the logits.
TRACEPOINTS = (
    [{"kind": "model", "name": "forward", "function": "llama_decode", "file": "", "line": 0},
     {"kind": "layer", "name": "llama_layer", "function": "llama_decode", "file": "", "line": 0}]
    + [{"kind": "tensor", "name": stage, "function": "llama_decode", "file": "", "line": 0}
       for stage in STAGES.values() if stage != "output"]
    + [{"kind": "attention", "name": "kq_soft_max", "function": "llama_decode", "file": "", "line": 0},
       {"kind": "logits", "name": "logits", "function": "llama_decode", "file": "", "line": 0}]
)

_NODE = re.compile(r"^([a-z_]+)-(\d+)$")

GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1


class LlamaCppError(RuntimeError):
    """llama.cpp could not run what was asked (a model it cannot load, a failed decode, a node
    it computed twice)."""


class _GgmlTensor(ctypes.Structure):
    """``struct ggml_tensor`` of the ggml vendored by llama-cpp-python 0.3.36 (``ggml.h``)."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


def _llama_cpp() -> Any:
    """The ``llama_cpp`` module, of the version this module reads the structures of."""
    try:
        import llama_cpp
    except ImportError as error:
        raise LlamaCppError(
            f"model_trace.llama_cpp needs llama-cpp-python=={LLAMA_CPP_PYTHON}: "
            f'CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install llama-cpp-python=={LLAMA_CPP_PYTHON} ({error})'
        ) from error
    if llama_cpp.__version__ != LLAMA_CPP_PYTHON:
        raise LlamaCppError(
            f"model_trace.llama_cpp reads ggml's tensors as llama-cpp-python {LLAMA_CPP_PYTHON} lays them "
            f"out; found {llama_cpp.__version__}: install llama-cpp-python=={LLAMA_CPP_PYTHON}"
        )
    return llama_cpp


def _ggml_base(llama_cpp: Any) -> ctypes.CDLL:
    """``libggml-base.so`` beside the llama_cpp package: ``ggml_nbytes`` and
    ``ggml_backend_tensor_get``."""
    directory = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    lib = ctypes.CDLL(os.path.join(directory, "libggml-base.so"))
    lib.ggml_nbytes.restype = ctypes.c_size_t
    lib.ggml_nbytes.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_tensor_get.restype = None
    lib.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    return lib


def wanted_node(name: str) -> Optional[Tuple[str, int]]:
    """(node kind, layer) of a node this writer reads (layer -1 for a global one), or ``None``."""
    if name in (EMBEDDINGS, LOGITS):
        return name, -1
    match = _NODE.match(name)
    if match and (match.group(1) in STAGES or match.group(1) == "kq_soft_max"):
        return match.group(1), int(match.group(2))
    return None


def row_major(raw: np.ndarray, dtype: Any, ne: Sequence[int], nb: Sequence[int]) -> np.ndarray:
    """A ggml tensor's bytes as a row-major float32 array: ``ne``/``nb`` are ggml's sizes and
    byte strides, innermost first; trailing dimensions of size 1 are dropped."""
    rank = max((i + 1 for i, n in enumerate(ne) if n != 1), default=1)
    shape, strides = tuple(reversed(ne[:rank])), tuple(reversed(nb[:rank]))
    view = np.lib.stride_tricks.as_strided(raw.view(dtype), shape=shape, strides=strides)
    return view.astype(np.float32)


def _drop_log(_level: int, _text: bytes, _user_data: Any) -> None:
    """A llama.cpp log callback that drops the line."""


#: Made once the module is used: ``llama_log_set`` keeps the pointer.
_QUIET: Any = None


def _quiet(L: Any, verbose: bool) -> None:
    """Drops llama.cpp's log lines (unless ``verbose``)."""
    global _QUIET
    if verbose:
        L.llama_log_set(None, None)
        return
    if _QUIET is None:
        _QUIET = L.llama_log_callback(_drop_log)
    L.llama_log_set(_QUIET, None)


class _Nodes:
    """The eval callback: the wanted nodes' values of one graph run, row-major float32."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        self.values: Dict[Tuple[str, int], np.ndarray] = {}
        self.error: Optional[str] = None

    def __call__(self, pointer: int, ask: bool, _user_data: Any) -> bool:
        try:
            return self._node(pointer, ask)
        except Exception as error:  # an exception must not cross into C: ends the graph run
            self.error = f"reading a llama.cpp node failed: {error!r}"
            return False

    def _node(self, pointer: int, ask: bool) -> bool:
        tensor = _GgmlTensor.from_address(pointer)
        name = tensor.name.decode("utf-8", "replace")
        wanted = wanted_node(name)
        if ask:
            return wanted is not None
        if wanted is None:
            return True
        if wanted in self.values:
            self.error = f"llama.cpp computed the node {name!r} twice in one graph run"
            return False
        if tensor.type not in (GGML_TYPE_F32, GGML_TYPE_F16):
            self.error = f"llama.cpp's node {name!r} has ggml type {tensor.type}, not F32 or F16"
            return False
        size = self.lib.ggml_nbytes(pointer)
        raw = (ctypes.c_uint8 * size)()
        self.lib.ggml_backend_tensor_get(pointer, raw, 0, size)
        dtype = np.float32 if tensor.type == GGML_TYPE_F32 else np.float16
        self.values[wanted] = row_major(np.frombuffer(raw, dtype=np.uint8), dtype, list(tensor.ne),
                                        list(tensor.nb))
        return True


def run(model_path: str, passes: Sequence[Sequence[int]], out: str, *, greedy_passes: int = 0,
        kv: str = "f16", threads: int = 1, capture: Optional[str] = None,
        metadata: Optional[Dict[str, Any]] = None, verbose: bool = False) -> List[int]:
    """Runs each token list of ``passes`` as one graph run at the positions after the previous
    ones, then ``greedy_passes`` more, each fed the token llama.cpp chose last; writes the trace
    at ``out`` and returns the token chosen after each pass (the last row's argmax). llama.cpp's
    own log lines are dropped unless ``verbose``."""
    if kv not in ("f16", "f32"):
        raise ValueError(f"kv is 'f16' or 'f32', not {kv!r}")
    if not passes or not passes[0]:
        raise ValueError("no tokens to run: the first pass needs at least one token")
    captures = CaptureFilter(capture)
    L = _llama_cpp()
    if not os.path.isfile(model_path):
        raise LlamaCppError(f"no GGUF file at {model_path}")
    _quiet(L, verbose)
    L.llama_backend_init()
    model_params = L.llama_model_default_params()
    model_params.n_gpu_layers = 0
    model = L.llama_model_load_from_file(model_path.encode(), model_params)
    if not model:
        raise LlamaCppError(f"llama.cpp could not load {model_path}")
    nodes = _Nodes(_ggml_base(L))
    callback = L.ggml_backend_sched_eval_callback(nodes)  # kept alive as long as the context
    total = sum(len(p) for p in passes) + greedy_passes
    widest = max(len(p) for p in passes)
    params = L.llama_context_default_params()
    params.n_ctx = max(64, total + 8)
    params.n_batch = params.n_ubatch = max(8, widest)
    params.n_seq_max = 1
    params.n_threads = params.n_threads_batch = threads
    params.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    params.type_k = params.type_v = L.GGML_TYPE_F16 if kv == "f16" else L.GGML_TYPE_F32
    params.cb_eval = callback
    params.cb_eval_user_data = None
    context = L.llama_init_from_model(model, params)
    if not context:
        L.llama_model_free(model)
        raise LlamaCppError("llama.cpp could not create a context")
    meta: Dict[str, Any] = {
        "model": os.path.basename(model_path),
        "weights": os.path.abspath(model_path),
        "device": "cpu",
        "extra": {
            "writer": f"llama.cpp (llama-cpp-python {L.__version__})",
            "kv_cache": kv,
            "flash_attention": "off",
            "threads": str(threads),
            "prompt_ids": json.dumps(list(passes[0])),
        },
    }
    meta.update(metadata or {})
    writer = TraceWriter(out, config={"trace_activations": True, "trace_attention": True, "trace_logits": True},
                         metadata=meta, tracepoints=TRACEPOINTS, capture=capture)
    batch = L.llama_batch_init(max(widest, 1), 0, 1)
    chosen: List[int] = []
    try:
        position = 0
        steps = [list(p) for p in passes] + [None] * greedy_passes
        for step in steps:
            tokens = [chosen[-1]] if step is None else step
            for i, token in enumerate(tokens):
                batch.token[i] = token
                batch.pos[i] = position + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1
            batch.n_tokens = len(tokens)
            nodes.values.clear()
            status = L.llama_decode(context, batch)
            L.llama_synchronize(context)
            if nodes.error is not None:
                raise LlamaCppError(nodes.error)
            if status != 0:
                raise LlamaCppError(f"llama_decode returned {status} at position {position}")
            logits = _write_pass(writer, nodes.values, tokens, position, captures)
            chosen.append(int(np.argmax(logits)))
            position += len(tokens)
    finally:
        writer.close()
        L.llama_batch_free(batch)
        L.llama_free(context)
        L.llama_model_free(model)
    return chosen


def _write_pass(writer: TraceWriter, values: Dict[Tuple[str, int], np.ndarray], tokens: List[int],
                position: int, captures: CaptureFilter) -> np.ndarray:
    """One graph run's nodes as a pass: each layer's stages, its attention over the positions
    cached so far, and the last row's logits (returned). What ``captures`` selects is saved in
    full, as the torch tracer decides it: a layer's input and output by its ``layer``
    tracepoint (``llama_layer``), a stage by its ``tensor`` tracepoint (the stage's name)."""
    n = len(tokens)
    layers = 1 + max((layer for (_, layer) in values), default=-1)
    pass_index = writer.begin_pass(position=position, tracepoint="forward", function="llama_decode", tokens=tokens)

    def wants(kind: str, name: str, layer: Optional[int]) -> bool:
        return captures.captures(Tracepoint(kind, name, function="llama_decode"), pass_index, layer)

    previous = values.get((EMBEDDINGS, -1))
    for layer in range(layers):
        writer.begin_layer(layer, "llama_layer", f"blk.{layer}")
        if previous is not None:
            writer.stage("input", previous.reshape(1, n, -1), wants_capture=wants("layer", "llama_layer", layer))
        for kind, stage in STAGES.items():
            if kind == "attn_out":
                # The attention probabilities where llama.cpp computes them (as the port records
                # them): between the attention's input and its output projection.
                _write_attention(writer, values.get(("kq_soft_max", layer)), layer, n, position,
                                 wants("attention", "kq_soft_max", layer))
            found = values.get((kind, layer))
            if found is not None:
                tracepoint = ("layer", "llama_layer") if stage == "output" else ("tensor", stage)
                writer.stage(stage, found.reshape(1, n, -1), wants_capture=wants(*tracepoint, layer))
        writer.end_layer()
        previous = values.get(("l_out", layer))
    logits = values.get((LOGITS, -1))
    if logits is None:
        raise LlamaCppError("llama.cpp's graph had no result_output node")
    last = logits.reshape(n, -1)[-1:]
    writer.logits(last, layers, "logits", LOGITS, wants_capture=wants("logits", "logits", layers))
    writer.end_pass()
    return last[0]


def _write_attention(writer: TraceWriter, probs: Optional[np.ndarray], layer: int, n: int, position: int,
                     capture: bool) -> None:
    """``kq_soft_max-N`` (``[heads, queries, KV slots]``) as the layer's attention event, the
    slots past the cached positions (masked: exactly 0) cut off."""
    if probs is None:
        return
    probs = probs.reshape(-1, n, probs.shape[-1])
    writer.attention(probs[:, :, :position + n][None], layer, "kq_soft_max", f"blk.{layer}", wants_capture=capture)


def passes_of(trace: str, max_passes: Optional[int] = None) -> List[List[int]]:
    """The token ids each pass of ``trace`` consumed: its ``pass_begin.tokens``, or for a trace
    written without them, the header's ``metadata.extra.prompt_ids`` and then the token each pass
    chose (the top token of its ``logits`` tracepoint)."""
    from .format import read_trace

    header, events = read_trace(trace)
    begins = [e for e in events if e["event"] == "pass_begin"]
    if begins and all("tokens" in e for e in begins):
        passes = [list(e["tokens"]) for e in begins]
    else:
        try:
            prompt = json.loads(header["metadata"]["extra"]["prompt_ids"])
        except (KeyError, TypeError, ValueError) as error:
            raise LlamaCppError(
                f"{trace}: its passes carry no tokens and its header no metadata.extra.prompt_ids ({error!r})"
            ) from error
        chosen = [e["batch_rows"][0]["top_tokens"][0] for e in events
                  if e["event"] == "logits" and e["tracepoint"] == "logits"]
        passes = [list(prompt)] + [[token] for token in chosen[:max(len(begins) - 1, 0)]]
    return passes[:max_passes] if max_passes is not None else passes


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model_trace.llama_cpp", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="the GGUF file")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="text to tokenize with the GGUF's vocabulary; llama.cpp chooses greedily")
    source.add_argument("--tokens-from", metavar="TRACE", help="a trace whose passes' tokens to run (teacher forcing)")
    parser.add_argument("--max-tokens", type=int, help="at most N passes (default: 16 with --prompt, all of TRACE's)")
    parser.add_argument("--kv", choices=["f16", "f32"], default="f16", help="the KV cache's type (llama.cpp's default: f16)")
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp's threads (default 1)")
    parser.add_argument("--out", required=True, help="the trace file to write")
    parser.add_argument("--capture", help="tensors to save in full (the capture filter's syntax, e.g. pass=0)")
    parser.add_argument("--verbose", action="store_true", help="show llama.cpp's own log lines")
    args = parser.parse_args(argv)
    if args.max_tokens is not None and args.max_tokens < 1:
        parser.error("--max-tokens is at least 1")
    try:
        if args.tokens_from:
            passes, greedy = passes_of(args.tokens_from, args.max_tokens), 0
        else:
            passes, greedy = [tokenize(args.model, args.prompt)], (args.max_tokens or 16) - 1
        started = time.monotonic()
        chosen = run(args.model, passes, args.out, greedy_passes=greedy, kv=args.kv, threads=args.threads,
                     capture=args.capture, verbose=args.verbose)
    except (LlamaCppError, ValueError, OSError) as error:
        print(f"model_trace.llama_cpp: {error}", file=sys.stderr)
        return 1
    passes_text = "1 pass" if len(chosen) == 1 else f"{len(chosen)} passes"
    print(f"{passes_text} in {time.monotonic() - started:.2f} s, chosen tokens {chosen}: {args.out}",
          file=sys.stderr)
    return 0


def tokenize(model_path: str, text: str) -> List[int]:
    """``text``'s token ids in the GGUF's vocabulary (no BOS added: SmolLM2's tokenizer adds
    none)."""
    L = _llama_cpp()
    if not os.path.isfile(model_path):
        raise LlamaCppError(f"no GGUF file at {model_path}")
    _quiet(L, False)
    model = L.Llama(model_path, vocab_only=True, verbose=False)
    return list(model.tokenize(text.encode(), add_bos=False, special=True))


if __name__ == "__main__":
    sys.exit(main())
