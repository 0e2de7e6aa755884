"""llama.cpp as a reference: a GGUF model run through llama-cpp-python's low-level API, its
graph's intermediate tensors read with an eval callback and written as a model-trace trace file.

    python -m model_trace.llama_cpp MODEL.gguf (--prompt TEXT | --tokens-from TRACE) \\
        [--max-tokens N] [--kv f16|f32] [--threads N] --out OUT [--capture PATTERN] \\
        [--node-table ARCH] [--no-stage-check]

``--tokens-from TRACE`` runs the passes of a trace of the port: each pass is fed the token ids
the port's pass consumed (``pass_begin.tokens``; for a trace without them, the header's
``metadata.extra.prompt_ids`` and then each pass's chosen token), so that both sides compute the
same thing even where they would choose different tokens (teacher forcing, as the transformers
reference does). ``--prompt TEXT`` tokenizes with the GGUF's own vocabulary and lets llama.cpp
choose greedily. ``--max-tokens N``: at most N passes (the prompt's and N - 1 decode passes);
with ``--prompt`` the default is 16, with ``--tokens-from`` every pass of TRACE.

Needs ``llama-cpp-python==0.3.36`` (the ctypes view of ``ggml_tensor`` below is that version's;
another version is refused). Built with ``CMAKE_ARGS="-DGGML_NATIVE=OFF"``.

A pass is one graph run (one ``llama_decode``). Stages come from llama.cpp's node names, which
differ by architecture: each architecture (the GGUF's ``general.architecture``) has a
declarative :class:`NodeTable` in its family's file (``model_trace/families/<family>.py``,
collected in :data:`TABLES`), read from its graph builder in the llama.cpp that
llama-cpp-python 0.3.36 vendors (``src/models/<architecture>.cpp``). Per layer ``N`` (the
table of every architecture: ``docs/trace-format.md``), for Llama:

=========================  ==============================================
llama.cpp node             stage
=========================  ==============================================
``l_out-(N-1)``            ``input`` of layer N (``embd`` for layer 0)
``attn_norm-N``            ``attn_in``
``attn_out-N``             ``attn_out`` (after the output projection)
``ffn_inp-N``              ``resid_mid``
``ffn_norm-N``             ``mlp_in``
``ffn_out-N``              ``mlp_out`` (``ffn_moe_out-N`` in a MoE layer)
``l_out-N``                ``output``
``kq_soft_max-N``          attention probabilities ``[1, heads, seq, positions]``
``result_output``          logits (the pass's last row, ``[1, vocab]``, as the port records them)
=========================  ==============================================

and each family's file says what its graph names otherwise (Gemma 3's ``inp_scaled``,
``Qcur_normed-N``, ``sa_out-N``, ...). Where an architecture does not name its attention output
(all but Llama and Granite), ``attn_out`` is the node that multiplies by the layer's ``blk.N.attn_output.weight``
(or adds its ``blk.N.attn_output.bias`` after that); Phi-3's unnamed ``resid_mid`` is the add
that takes that node as an operand. A node a table expects and the graph did
not compute is a warning (:class:`MissingNodeWarning`) once per node and run, never a silent
gap. An architecture with no table is an error, unless ``node_table=`` (``--node-table``) names
the table to borrow (a warning says so); the stage check below then tells whether it fits.

In a GGUF with experts, each MoE layer's routing (``ffn_moe_logits-N``, ``ffn_moe_topk-N``, the
final ``ffn_moe_weights*-N``) is written as its ``router`` event: :mod:`model_trace.llama_cpp_routing`.

The stage check (``model_trace.stage_check``: ``resid_mid = input + attention branch``, ``output
= resid_mid + MLP branch``, each norm stage a normalisation of the stage before it) runs on the
first pass's values: a stage map that does not fit the graph raises
:class:`model_trace.stage_check.StageMapError` naming layer, stage and identity; the header's
``metadata.extra.stage_check`` says ``first pass`` (or ``off`` with ``check_stages=False``,
``--no-stage-check``), ``metadata.extra.architecture`` the GGUF's architecture, and
``metadata.extra.residual_multiplier`` Granite's ``residual_scale``.

The header's ``metadata.precision`` (:mod:`model_trace.precision`, the object the Rust runtime
writes) says what llama.cpp computed in: ``weights``, the types of the GGUF's matrices read from
its tensor-info table (``["Q4_1", "Q8_0"]`` for SmolLM2's file; ``["F32"]`` for an F32 copy
written by :mod:`model_trace.gguf_f32`, with ``dequantized_from`` the types it was dequantized
from, which the copy's metadata names), ``activations`` ``F32``, ``kv_cache`` ``--kv`` upper
case (``F16`` by default) and ``source`` ``llama.cpp``. llama.cpp writes the KV cache before
the attention reads it, so an F16 cache rounds the keys and values of the prompt pass too:
``--kv f32`` for a comparison to float rounding.

Cost: every node the callback asks for splits ggml's graph there. Reading SmolLM2's 212 nodes
makes ``llama_decode`` of a 57-token prompt 13-16% slower on 1 thread (6-33% on 2, noisy) and a
decode step 32-33% slower (55-62% on 2), measured here in two runs (``python/benchmarks/llama_cpp_callback.py``: medians of 7
interleaved runs); the values are
bit-identical with and without the callback.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import os
import re
import sys
import time
import warnings
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

import numpy as np

from . import gguf_file, llama_cpp_routing, precision
from .families import TABLES
from .families.layouts import ATTN_PROJECTION, ATTN_RESIDUAL, NodeTable
from .filter import CaptureFilter, Tracepoint
from .writer import TraceWriter

#: The llama-cpp-python version whose ``ggml_tensor`` layout :class:`_GgmlTensor` copies.
LLAMA_CPP_PYTHON = "0.3.36"

#: Global nodes read besides a table's embeddings: the logits.
LOGITS = "result_output"

_NODE = re.compile(r"^([A-Za-z_0-9]+?)-(\d+)$")
_PROJECTION_OPERAND = re.compile(r"^blk\.(\d+)\.attn_output\.(weight|bias)$")

GGML_OP_ADD, GGML_OP_MUL_MAT, GGML_OP_GET_ROWS = 2, 29, 40


def tracepoints(table: NodeTable, router: bool = False) -> List[Dict[str, Any]]:
    """The tracepoints a llama.cpp trace of ``table``'s architecture records (the header's
    ``tracepoints``; what capture patterns match): the pass, the layer (input and output), each
    stage, the attention, the logits, and with ``router`` (a model with experts) the router."""
    stages = [stage for stages in [table.stages] + [v for _, v in table.variants] for stage, _ in stages]
    ordered = [stage for i, stage in enumerate(stages) if stage != "output" and stage not in stages[:i]]
    site = {"function": "llama_decode", "file": "", "line": 0}
    return ([{"kind": "model", "name": "forward", **site}, {"kind": "layer", "name": "llama_layer", **site}]
            + [{"kind": "tensor", "name": stage, **site} for stage in ordered]
            + [{"kind": "attention", "name": "kq_soft_max", **site}, {"kind": "logits", "name": "logits", **site}]
            + ([dict(llama_cpp_routing.TRACEPOINT)] if router else []))


class MissingNodeWarning(UserWarning):
    """A node the architecture's table expects that llama.cpp's graph did not compute: its stage
    is absent from the trace."""



GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1
GGML_TYPE_I32 = 26
#: The node types read, as numpy reads them: the floats, and the router's chosen expert ids.
_NODE_DTYPES = {GGML_TYPE_F32: np.float32, GGML_TYPE_F16: np.float16, GGML_TYPE_I32: np.int32}


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


@functools.lru_cache(maxsize=None)
def _node_names(table: NodeTable) -> FrozenSet[str]:
    return table.nodes()


def wanted_node(name: str, table: NodeTable, layer_before: int = -1) -> Optional[Tuple[str, int]]:
    """(node name without its ``-N``, layer) of a named node this writer reads for ``table``'s
    architecture (layer -1 for a global one), or ``None``. ``layer_before``: the layer of the
    numbered node before it, which an unnumbered node of the table belongs to."""
    if name in (table.embeddings, LOGITS):
        return name, -1
    if name in table.unnumbered:
        return (name, layer_before) if layer_before >= 0 else None
    match = _NODE.match(name)
    if match and (match.group(1) in _node_names(table) or match.group(1) in llama_cpp_routing.ROUTER_NODES):
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


def _print_log(_level: int, text: bytes, _user_data: Any) -> None:
    """A llama.cpp log callback that writes the line to stderr."""
    sys.stderr.write(text.decode("utf-8", "replace"))


#: Made once the module is used: ``llama_log_set`` keeps the pointer.
_LOG_CALLBACKS: Dict[bool, Any] = {}


def _quiet(L: Any, verbose: bool) -> None:
    """Drops llama.cpp's log lines (unless ``verbose``: then they go to stderr)."""
    if verbose not in _LOG_CALLBACKS:
        _LOG_CALLBACKS[verbose] = L.llama_log_callback(_print_log if verbose else _drop_log)
    L.llama_log_set(_LOG_CALLBACKS[verbose], None)


def _name(pointer: Optional[int]) -> str:
    return _GgmlTensor.from_address(pointer).name.decode("utf-8", "replace") if pointer else ""


class _Nodes:
    """The eval callback: the wanted nodes' values of one graph run, row-major float32, with
    their ggml sizes (``ne``)."""

    def __init__(self, lib: ctypes.CDLL, table: NodeTable) -> None:
        self.lib = lib
        self.table = table
        names = _node_names(table)
        self.find_projection = ATTN_PROJECTION in names or ATTN_RESIDUAL in names
        self.find_residual = ATTN_RESIDUAL in names
        self.values: Dict[Tuple[str, int], np.ndarray] = {}
        self.sizes: Dict[Tuple[str, int], Tuple[int, ...]] = {}
        self.error: Optional[str] = None
        self.reset()

    def reset(self) -> None:
        """Before a graph run."""
        self.values.clear()
        self.sizes.clear()
        #: Every node name (without its number) the graph computed: what a table's variant and
        #: the missing-node warnings look at.
        self.computed: Set[str] = set()
        #: The layer of the last numbered node asked about.
        self.layer = -1
        #: Nodes answered True, until their values come: (node, layer), found by structure?
        self.pending: Dict[int, Tuple[Tuple[str, int], bool]] = {}
        #: The attention projection's outputs (and the last layer's row selections of them), by
        #: pointer: their layer.
        self.projections: Dict[int, int] = {}

    def __call__(self, pointer: int, ask: bool, _user_data: Any) -> bool:
        try:
            return self._node(pointer, ask)
        except Exception as error:  # an exception must not cross into C: ends the graph run
            self.error = f"reading a llama.cpp node failed: {error!r}"
            return False

    def _node(self, pointer: int, ask: bool) -> bool:
        tensor = _GgmlTensor.from_address(pointer)
        if ask:
            return self._ask(pointer, tensor)
        wanted, structural = self.pending.pop(pointer, (None, False))
        if wanted is None:
            return True
        name = tensor.name.decode("utf-8", "replace")
        if wanted in self.values and not structural:
            self.error = f"llama.cpp computed the node {name!r} twice in one graph run"
            return False
        dtype = _NODE_DTYPES.get(tensor.type)
        if dtype is None:
            self.error = f"llama.cpp's node {name!r} has ggml type {tensor.type}, not F32, F16 or I32"
            return False
        size = self.lib.ggml_nbytes(pointer)
        raw = (ctypes.c_uint8 * size)()
        self.lib.ggml_backend_tensor_get(pointer, raw, 0, size)
        # A structural match later in the layer (the bias add after the matmul) replaces the earlier.
        self.values[wanted] = row_major(np.frombuffer(raw, dtype=np.uint8), dtype, list(tensor.ne),
                                        list(tensor.nb))
        self.sizes[wanted] = tuple(tensor.ne)
        return True

    def _ask(self, pointer: int, tensor: _GgmlTensor) -> bool:
        name = tensor.name.decode("utf-8", "replace")
        match = _NODE.match(name)
        if match:
            self.layer = int(match.group(2))
            self.computed.add(match.group(1))
        elif name:
            self.computed.add(name)
        wanted = wanted_node(name, self.table, self.layer)
        structural = False
        if wanted is None and self.find_projection:
            wanted = self._by_structure(pointer, tensor)
            structural = wanted is not None
        if wanted is not None:
            self.pending[pointer] = (wanted, structural)
        return wanted is not None

    def _by_structure(self, pointer: int, tensor: _GgmlTensor) -> Optional[Tuple[str, int]]:
        """The attention projection (by its weight or bias operand) and the add of it to the
        stream, which some graphs leave unnamed."""
        if tensor.op in (GGML_OP_MUL_MAT, GGML_OP_ADD):
            operand = _PROJECTION_OPERAND.match(_name(tensor.src[0] if tensor.op == GGML_OP_MUL_MAT else tensor.src[1]))
            if operand and (operand.group(2) == "weight") == (tensor.op == GGML_OP_MUL_MAT):
                layer = int(operand.group(1))
                self.projections[pointer] = layer
                self.computed.add(ATTN_PROJECTION)
                return ATTN_PROJECTION, layer
        if tensor.op == GGML_OP_GET_ROWS and tensor.src[0] in self.projections:
            self.projections[pointer] = self.projections[tensor.src[0]]
            return None
        if self.find_residual and tensor.op == GGML_OP_ADD:
            for operand in (tensor.src[0], tensor.src[1]):
                layer = self.projections.get(operand) if operand else None
                if layer is not None and (ATTN_RESIDUAL, layer) not in self.values \
                        and not any(key == (ATTN_RESIDUAL, layer) for key, _ in self.pending.values()):
                    self.computed.add(ATTN_RESIDUAL)
                    return ATTN_RESIDUAL, layer
        return None


def precision_of(model_path: str, kv: str = "f16") -> Dict[str, Any]:
    """The header's ``metadata.precision`` of a run on the GGUF at ``model_path`` with a KV
    cache of type ``kv``: the types of the file's matrices, read from its tensor-info table
    (:func:`model_trace.gguf_file.read`), and where the file is an F32 copy written by
    :func:`model_trace.gguf_f32.write_f32`, the types it was dequantized from; F32
    activations (ggml's CPU kernels may round them for a quantized matmul, as the weight
    types say); source ``llama.cpp``."""
    info = gguf_file.read(model_path)
    return precision.record(info.weight_types(), dequantized_from=info.dequantized_from(), activations="F32",
                            kv_cache=kv, source="llama.cpp")


def architecture_of(model: Any, L: Any) -> str:
    """The GGUF's ``general.architecture`` as llama.cpp read it."""
    return _meta(model, L, "general.architecture") or ""


def _meta(model: Any, L: Any, key: str) -> Optional[str]:
    buffer = ctypes.create_string_buffer(256)
    length = L.llama_model_meta_val_str(model, key.encode(), buffer, ctypes.sizeof(buffer))
    return buffer.value.decode("utf-8", "replace") if length >= 0 else None


def table_for(architecture: str, node_table: Optional[str] = None) -> NodeTable:
    """The node table of ``architecture``, or of ``node_table`` where given (borrowed: a
    warning says so). An architecture with no table is an error naming those there are."""
    known = ", ".join(sorted(TABLES))
    if node_table is not None:
        if node_table not in TABLES:
            raise LlamaCppError(f"no llama.cpp node table {node_table!r}; there are tables for {known}")
        if node_table != architecture:
            warnings.warn(f"model_trace.llama_cpp: reading the {architecture!r} graph with the {node_table!r} "
                          "node table (--node-table): the stage check on the first pass tells whether it fits",
                          stacklevel=3)
        return TABLES[node_table]
    if architecture not in TABLES:
        raise LlamaCppError(
            f"no node table for llama.cpp's architecture {architecture!r}: its graph names its nodes its own way "
            f"(src/models/{architecture}.cpp). Tables: {known}. If its blocks are built like one of those, "
            "--node-table ARCH (node_table=) reads it with that table, and the stage check tells whether it fits")
    return TABLES[architecture]


def run(model_path: str, passes: Sequence[Sequence[int]], out: str, *, greedy_passes: int = 0,
        kv: str = "f16", threads: int = 1, capture: Optional[str] = None,
        metadata: Optional[Dict[str, Any]] = None, verbose: bool = False, check_stages: bool = True,
        node_table: Optional[str] = None) -> List[int]:
    """Runs each token list of ``passes`` as one graph run at the positions after the previous
    ones, then ``greedy_passes`` more, each fed the token llama.cpp chose last; writes the trace
    at ``out`` and returns the token chosen after each pass (the last row's argmax). The stages
    follow the node table of the GGUF's architecture (``node_table``: another's, borrowed);
    ``check_stages``: the stage check on the first pass (a failure raises
    :class:`model_trace.stage_check.StageMapError`). llama.cpp's own log lines are dropped
    unless ``verbose``."""
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
    architecture = architecture_of(model, L)
    try:
        table = table_for(architecture, node_table)
    except LlamaCppError:
        L.llama_model_free(model)
        raise
    residual_multiplier = _meta(model, L, table.residual_scale) if table.residual_scale else None
    routing = llama_cpp_routing.rule_of(model_path, architecture)
    nodes = _Nodes(_ggml_base(L), table)
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
    extra = {
        "writer": f"llama.cpp (llama-cpp-python {L.__version__})",
        "architecture": architecture,
        "node_table": table.architecture,
        "kv_cache": kv,
        "flash_attention": "off",
        "threads": str(threads),
        "prompt_ids": json.dumps(list(passes[0])),
        "stage_check": "first pass" if check_stages else "off",
    }
    if residual_multiplier is not None:
        extra["residual_multiplier"] = residual_multiplier
    meta: Dict[str, Any] = {"model": os.path.basename(model_path), "weights": os.path.abspath(model_path),
                            "device": "cpu", "precision": precision_of(model_path, kv), "extra": extra}
    meta.update(metadata or {})
    writer = TraceWriter(out, config={"trace_activations": True, "trace_attention": True, "trace_logits": True},
                         metadata=meta, tracepoints=tracepoints(table, routing.experts > 0), capture=capture)
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
            nodes.reset()
            status = L.llama_decode(context, batch)
            L.llama_synchronize(context)
            if nodes.error is not None:
                raise LlamaCppError(nodes.error)
            if status != 0:
                raise LlamaCppError(f"llama_decode returned {status} at position {position}")
            first = not chosen
            logits, layers = _write_pass(writer, nodes, tokens, position, captures, routing)
            if first:
                _warn_missing(nodes, architecture)
                if check_stages:
                    _check_stages(layers, architecture, table, residual_multiplier)
            chosen.append(int(np.argmax(logits)))
            position += len(tokens)
    finally:
        writer.close()
        L.llama_batch_free(batch)
        L.llama_free(context)
        L.llama_model_free(model)
    return chosen


def _warn_missing(nodes: _Nodes, architecture: str) -> None:
    """One warning per node the table expects and the first graph run did not compute (with the
    layers it is missing in)."""
    table = nodes.table
    layers = 1 + max((layer for (_, layer) in nodes.values), default=-1)
    if (table.embeddings, -1) not in nodes.values:
        warnings.warn(f"model_trace.llama_cpp: llama.cpp's {architecture!r} graph computed no {table.embeddings!r} "
                      "node: layer 0 has no input stage", MissingNodeWarning, stacklevel=3)
    for stage, candidates in table.stages_for(nodes.computed):
        missing = [layer for layer in range(layers) if not any((c, layer) in nodes.values for c in candidates)]
        if missing:
            where = "any layer" if len(missing) == layers else f"layers {_ranges(missing)}"
            names = " or ".join(repr(c) for c in candidates)
            warnings.warn(f"model_trace.llama_cpp: llama.cpp's {architecture!r} graph computed no {names} node in "
                          f"{where}: the stage {stage!r} is absent there", MissingNodeWarning, stacklevel=3)


def _ranges(layers: List[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``."""
    spans: List[List[int]] = []
    for layer in layers:
        if spans and layer == spans[-1][1] + 1:
            spans[-1][1] = layer
        else:
            spans.append([layer, layer])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)


def _check_stages(layers: Dict[int, Dict[str, np.ndarray]], architecture: str, table: NodeTable,
                  residual_multiplier: Optional[str]) -> None:
    """The stage check on the first pass's values: raises StageMapError on a failed identity."""
    from .stage_check import StageMapError, check_layers

    # float(), not stage_check.parse_multiplier: a GGUF's residual scale that is no number is an
    # error here, not a multiplier of 1 that would fail the check and blame the node table.
    multiplier = float(residual_multiplier) if residual_multiplier is not None else 1.0
    report = check_layers(layers, multiplier)
    if report.failures:
        raise StageMapError(report.failures, f"model_trace.llama_cpp (llama.cpp's {architecture!r} graph read with "
                                             f"the {table.architecture!r} node table)")


def _stage_values(nodes: _Nodes, key: Tuple[str, int], stage: str, n: int) -> np.ndarray:
    """A node's values with the port's batch dimension: ``[1, seq, width]``, or for per-head
    query/key norms ``[1, seq, heads, head_dim]`` (ggml's ``ne = [head_dim, heads, seq]``)."""
    values = nodes.values[key]
    if stage in ("q_norm", "k_norm") and nodes.table.qk_per_head:
        return values.reshape(1, n, -1, nodes.sizes[key][0])
    return values.reshape(1, n, -1)


def _write_pass(writer: TraceWriter, nodes: _Nodes, tokens: List[int], position: int, captures: CaptureFilter,
                routing: llama_cpp_routing.RouterRule) -> Tuple[np.ndarray, Dict[int, Dict[str, np.ndarray]]]:
    """One graph run's nodes as a pass: each layer's stages, its attention over the positions
    cached so far, its router (:mod:`model_trace.llama_cpp_routing`), and the last row's logits. Returns those logits and each layer's stage values
    (for the stage check). What ``captures`` selects is saved in full, as the torch tracer
    decides it: a layer's input and output by its ``layer`` tracepoint (``llama_layer``), a stage
    by its ``tensor`` tracepoint (the stage's name)."""
    n = len(tokens)
    values, table = nodes.values, nodes.table
    layers = 1 + max((layer for (_, layer) in values), default=-1)
    stages = table.stages_for(nodes.computed)
    pass_index = writer.begin_pass(position=position, tracepoint="forward", function="llama_decode", tokens=tokens)

    def wants(kind: str, name: str, layer: Optional[int]) -> bool:
        return captures.captures(Tracepoint(kind, name, function="llama_decode"), pass_index, layer)

    recorded: Dict[int, Dict[str, np.ndarray]] = {}
    previous = values.get((table.embeddings, -1))
    for layer in range(layers):
        writer.begin_layer(layer, "llama_layer", f"blk.{layer}")
        mine = recorded[layer] = {}
        if previous is not None:
            mine["input"] = previous.reshape(1, n, -1)
            writer.stage("input", mine["input"], wants_capture=wants("layer", "llama_layer", layer))
        attention_written = False
        for stage, candidates in stages:
            if not attention_written and stage not in ("attn_in", "q_norm", "k_norm"):
                # The attention probabilities where llama.cpp computes them (as the port records
                # them): between the attention's input and its output projection.
                _write_attention(writer, values.get(("kq_soft_max", layer)), layer, n, position,
                                 wants("attention", "kq_soft_max", layer))
                attention_written = True
            key = next(((c, layer) for c in candidates if (c, layer) in values), None)
            if key is not None:
                mine[stage] = _stage_values(nodes, key, stage, n)
                tracepoint = ("layer", "llama_layer") if stage == "output" else ("tensor", stage)
                writer.stage(stage, mine[stage], wants_capture=wants(*tracepoint, layer))
        llama_cpp_routing.write_router(writer, values, layer, routing, wants("router", "ffn_moe", layer))
        writer.end_layer()
        previous = values.get(("l_out", layer))
    logits = values.get((LOGITS, -1))
    if logits is None:
        raise LlamaCppError("llama.cpp's graph had no result_output node")
    last = logits.reshape(n, -1)[-1:]
    writer.logits(last, layers, "logits", LOGITS, wants_capture=wants("logits", "logits", layers))
    writer.end_pass()
    return last[0], recorded


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
    parser.add_argument("--node-table", metavar="ARCH",
                        help="read the graph with the node table of another llama.cpp architecture "
                             f"(one of {', '.join(sorted(TABLES))}); default: the GGUF's own")
    parser.add_argument("--no-stage-check", action="store_true",
                        help="do not check the first pass's stages against their identities")
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
                     capture=args.capture, verbose=args.verbose, check_stages=not args.no_stage_check,
                     node_table=args.node_table)
    except (LlamaCppError, ValueError, OSError) as error:
        print(f"model_trace.llama_cpp: {error}", file=sys.stderr)
        return 1
    passes_text = "1 pass" if len(chosen) == 1 else f"{len(chosen)} passes"
    print(f"{passes_text} in {time.monotonic() - started:.2f} s, chosen tokens {chosen}: {args.out}",
          file=sys.stderr)
    return 0


def tokenize(model_path: str, text: str) -> List[int]:
    """``text``'s token ids in the GGUF's vocabulary, with the BOS token where the GGUF's
    ``tokenizer.ggml.add_bos_token`` asks for it (Gemma's does; SmolLM2's does not)."""
    L = _llama_cpp()
    if not os.path.isfile(model_path):
        raise LlamaCppError(f"no GGUF file at {model_path}")
    _quiet(L, False)
    model = L.Llama(model_path, vocab_only=True, verbose=False)
    # add_bos=True lets llama.cpp add the special tokens the vocabulary asks for, and no others.
    return list(model.tokenize(text.encode(), add_bos=True, special=True))


if __name__ == "__main__":
    sys.exit(main())
