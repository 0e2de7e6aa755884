"""Writes trace files (docs/trace-format.md) from Python: the header, passes, layers with their
stages, attention, logits, captures. Framework-free: values are anything numpy can read; the
PyTorch hooks of :mod:`model_trace.torch` drive it."""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from . import __version__
from .attention import AttentionRows
from .floats import FloatTexts, float_texts
from .format import FORMAT_NAME, SCHEMA_VERSION, Summary, as_f32, dumps, tensor_summary

#: Tracepoint kinds, as the Rust registry names them.
KINDS = ("model", "layer", "attention", "logits", "kv_cache", "quant", "tensor")

_DTYPE_NAMES = {
    "float32": "f32",
    "float16": "f16",
    "bfloat16": "bf16",
    "float64": "f64",
    "int64": "i64",
    "int32": "i32",
}


def dtype_name(dtype: Any) -> str:
    """A framework dtype (``torch.float32``, ``np.dtype('float32')``) named as the Rust runtime
    names it (``f32``)."""
    text = str(dtype).replace("torch.", "")
    return _DTYPE_NAMES.get(text, text)



def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()

class CaptureWriter:
    """Saves full tensors as ``STEM.tensors-NNNN.safetensors`` beside the trace, one chunk at a
    time, each written to a temporary name and renamed."""

    def __init__(self, trace_path: str, chunk_bytes: int = 64 << 20):
        self.directory = os.path.dirname(os.path.abspath(trace_path))
        stem = os.path.basename(trace_path)
        self.stem = stem.rsplit(".", 1)[0] if "." in stem else stem
        self.chunk = 0
        self.chunk_bytes = chunk_bytes
        self.pending: Dict[str, np.ndarray] = {}
        self.pending_bytes = 0

    def _name(self) -> str:
        return f"{self.stem}.tensors-{self.chunk:04d}.safetensors"

    def add(self, name: str, values: np.ndarray) -> Dict[str, str]:
        # A copy: the values may be a view of a framework's tensor (torch's CPU tensors share
        # memory with .numpy()), which the model may change before the chunk is written.
        data = np.array(values, dtype=np.float32, order="C")
        if self.pending and self.pending_bytes + data.nbytes > self.chunk_bytes:
            self.flush()
        self.pending[name] = data
        self.pending_bytes += data.nbytes
        return {"file": self._name(), "tensor": name}

    def flush(self) -> None:
        if not self.pending:
            return
        from safetensors.numpy import save_file

        final = os.path.join(self.directory, self._name())
        partial = os.path.join(self.directory, f".{self._name()}.partial")
        save_file(self.pending, partial, metadata={"format": "pt", "writer": f"model-trace-python {__version__}"})
        # safetensors creates the file readable by its owner only; a capture is shared like the
        # trace file beside it, with the usual permissions.
        os.chmod(partial, 0o666 & ~_UMASK)
        os.replace(partial, final)
        self.pending, self.pending_bytes = {}, 0
        self.chunk += 1


class TraceWriter:
    """One session's trace file.

    ``begin_pass``/``end_pass`` bracket a forward pass, ``begin_layer``/``stage``/``end_layer`` a
    layer and its stages (``input`` and ``output`` included), ``attention`` and ``logits`` record
    those tensors. Sequence numbers and times follow the format. Events are written at the end
    of every pass and by :meth:`close` (and sooner when a pass holds more than
    ``PENDING_FLOATS`` floats), the floats of all of them turned into text at once.
    """

    #: Floats held back before the completed events are written even within a pass.
    PENDING_FLOATS = 1 << 20

    def __init__(
        self,
        path: str,
        *,
        config: Optional[Dict[str, Any]] = None,
        metadata: Optional[Dict[str, Any]] = None,
        tracepoints: Sequence[Dict[str, Any]] = (),
        capture: Optional[str] = None,
        digest: bool = True,
    ):
        self.path = path
        self.file = open(path, "w", encoding="utf-8")
        self.digest = digest
        self.capture = CaptureWriter(path) if capture else None
        self.capture_filter = capture
        self.seq = 0
        self.epoch = time.monotonic_ns()
        self.pass_index: Optional[int] = None
        self.passes = 0
        self.pass_start = 0
        self.pass_position = 0
        self.pass_layers = 0
        self.layers: List[Dict[str, Any]] = []
        self.closed = False
        self._pending: List[Dict[str, Any]] = []
        self._floats: List[np.ndarray] = []
        self._float_count = 0
        header = {
            "event": "header",
            "format": FORMAT_NAME,
            "schema": SCHEMA_VERSION,
            "writer": f"model-trace-python {__version__}",
            "session": 1,
            "process_id": os.getpid(),
            "thread": {"id": 1, "name": threading.current_thread().name},
            "clock": {"epoch_unix_ns": time.time_ns(), "session_start_ns": 0},
            "config": config or {},
            "filter": "",
            "capture": capture or "",
            "tracepoints": list(tracepoints),
            "metadata": metadata or {},
        }
        self.file.write(dumps(header) + "\n")

    # -- plumbing ------------------------------------------------------------------------------

    def _queue(self, event: Dict[str, Any]) -> None:
        """An event to write with the next batch; its values may be :class:`_Deferred`."""
        self._pending.append(event)
        if self._float_count > self.PENDING_FLOATS:
            self._write_pending()

    def _defer_floats(self, values: np.ndarray) -> int:
        """Holds float32 values back to be turned into text with the batch; their offset in it."""
        offset = self._float_count
        self._floats.append(values)
        self._float_count += values.size
        return offset

    def _write_pending(self) -> None:
        if not self._pending:
            return
        texts = float_texts(np.concatenate(self._floats) if self._floats else [])
        self.file.write("".join(_json(event, texts) + "\n" for event in self._pending))
        self._pending, self._floats, self._float_count = [], [], 0

    def next_seq(self) -> int:
        seq = self.seq
        self.seq += 1
        return seq

    def now_ns(self) -> int:
        return time.monotonic_ns() - self.epoch

    def summary(self, values: Any, what: str, layer: Optional[int], wants_capture: bool = False,
                dtype: Optional[str] = None) -> Summary:
        """The tensor summary of ``values`` (anything numpy reads); ``dtype`` names the
        framework's element type when the values were converted."""
        array = np.asarray(values)
        dtype = dtype or dtype_name(array.dtype)
        summary = tensor_summary(array, dtype=dtype, digest=self.digest)
        if self.capture is not None and wants_capture:
            pass_text = "none" if self.pass_index is None else str(self.pass_index)
            layer_text = "none" if layer is None else str(layer)
            name = f"p{pass_text}.l{layer_text}.{what}.s{self.seq}"
            summary.capture = self.capture.add(name, as_f32(array).reshape(array.shape))
        return summary

    def _deferred_summary(self, summary: Summary) -> "_Deferred":
        return _DeferredSummary(summary, self._defer_floats(summary.floats))

    # -- passes --------------------------------------------------------------------------------

    def begin_pass(self, position: Optional[int] = None, tracepoint: str = "forward", function: str = "") -> int:
        if self.pass_index is not None:
            self.end_pass()
        self.pass_index = self.passes
        self.passes += 1
        self.pass_position = self.pass_index if position is None else int(position)
        self.pass_start = self.now_ns()
        self.pass_layers = 0
        self._queue({
            "event": "pass_begin",
            "seq": self.next_seq(),
            "pass": self.pass_index,
            "position": self.pass_position,
            "tracepoint": tracepoint,
            "function": function,
            "start_ns": self.pass_start,
        })
        return self.pass_index

    def end_pass(self) -> None:
        if self.pass_index is None:
            return
        while self.layers:
            self.end_layer()
        self._queue({
            "event": "pass_end",
            "seq": self.next_seq(),
            "pass": self.pass_index,
            "position": self.pass_position,
            "duration_ns": self.now_ns() - self.pass_start,
            "layers": self.pass_layers,
            "anomalies": [],
            "logit_evolution": [],
        })
        self.pass_index = None
        self._write_pending()
        self.file.flush()

    def _ensure_pass(self) -> int:
        if self.pass_index is None:
            self.begin_pass(tracepoint="", function="")
        return self.pass_index  # type: ignore[return-value]

    # -- layers --------------------------------------------------------------------------------

    def begin_layer(self, layer: int, tracepoint: str, function: str) -> None:
        self._ensure_pass()
        self.pass_layers += 1
        self.layers.append({
            "event": "layer",
            "seq": self.next_seq(),
            "pass": self.pass_index,
            "layer": int(layer),
            "tracepoint": tracepoint,
            "function": function,
            "start_ns": self.now_ns(),
            "duration_ns": 0,
            "stages": [],
        })

    def stage(self, name: str, values: Any, wants_capture: bool = False, dtype: Optional[str] = None) -> None:
        """A stage (or ``input``/``output``) of the innermost open layer."""
        if not self.layers:
            return
        frame = self.layers[-1]
        seq = self.next_seq()
        summary = self.summary(values, name, frame["layer"], wants_capture, dtype)
        frame["stages"].append({"seq": seq, "name": name, "tensor": self._deferred_summary(summary)})

    def stage_summary(self, name: str, summary: Dict[str, Any]) -> None:
        """A stage of the innermost open layer whose tensor summary is already made (a dict as
        the trace holds it: :func:`model_trace.format.summarize`, or converted statistics)."""
        if self.layers:
            self.layers[-1]["stages"].append({"seq": self.next_seq(), "name": name, "tensor": summary})

    def end_layer(self) -> None:
        if not self.layers:
            return
        frame = self.layers.pop()
        frame["duration_ns"] = self.now_ns() - frame["start_ns"]
        self._queue(frame)

    def current_layer(self) -> Optional[int]:
        return self.layers[-1]["layer"] if self.layers else None

    # -- records -------------------------------------------------------------------------------

    def attention(self, probs: Any, layer: int, tracepoint: str, function: str, wants_capture: bool = False,
                  top_k: int = 10, weight_threshold: float = 0.01, dtype: Optional[str] = None,
                  rows: Optional[AttentionRows] = None) -> None:
        """Attention probabilities ``[batch, heads, q, k]``: the summary and every row, sparsely.
        ``rows``: the rows already analysed (:func:`model_trace.attention.attention_rows`, as
        :mod:`model_trace.torch` does on the tensor's device); else they are analysed here,
        which needs torch."""
        array = np.asarray(probs, dtype=np.float32)
        seq = self.next_seq()
        summary = self.summary(array, "attention", layer, wants_capture, dtype)
        if rows is None:
            from .attention import attention_rows

            rows = attention_rows(array, top_k, weight_threshold)
        self._queue({
            "event": "attention",
            "seq": seq,
            "pass": self.pass_index,
            "layer": int(layer),
            "tracepoint": tracepoint,
            "function": function,
            "probs": self._deferred_summary(summary),
            "rows": _DeferredRows(rows, int(layer), self._defer_floats(rows.weights[rows.positions >= 0]),
                                  self._defer_floats(rows.measures.reshape(-1))),
        })

    def logits(self, logits: Any, layer: int, tracepoint: str, function: str, wants_capture: bool = False,
               top_k: int = 5, dtype: Optional[str] = None) -> None:
        """Logits ``[vocab]``, ``[batch, vocab]`` or ``[batch, seq, vocab]``: the summary and the
        next-token row of each batch row."""
        self._ensure_pass()
        array = np.asarray(logits, dtype=np.float32)
        seq = self.next_seq()
        summary = self.summary(array, "logits", layer, wants_capture, dtype)
        if array.ndim == 1:
            array = array[None, None]
        elif array.ndim == 2:
            array = array[:, None]
        rows = []
        for b in range(array.shape[0]):
            row = array[b, -1]
            finite = np.where(np.isfinite(row), row, -np.inf)
            order = np.argsort(-finite, kind="stable")[:top_k]
            order = order[np.isfinite(row[order])]
            rows.append({"batch": b, "top_tokens": order.tolist(),
                         "top_logits": _DeferredList(self._defer_floats(row[order]), order.size)})
        self._queue({
            "event": "logits",
            "seq": seq,
            "pass": self.pass_index,
            "layer": int(layer),
            "tracepoint": tracepoint,
            "function": function,
            "logits": self._deferred_summary(summary),
            "batch_rows": rows,
        })

    def close(self) -> None:
        if self.closed:
            return
        self.end_pass()
        if self.capture is not None:
            self.capture.flush()
        self._queue({"event": "session_end", "seq": self.next_seq(), "end_ns": self.now_ns(),
                     "passes": self.passes, "errors": [], "errors_not_kept": 0})
        self._write_pending()
        self.file.close()
        self.closed = True


class _Deferred:
    """A value of a pending event whose JSON text needs the batch's float texts."""

    def json(self, texts: FloatTexts) -> str:
        raise NotImplementedError


class _DeferredSummary(_Deferred):
    def __init__(self, summary: Summary, offset: int):
        self.summary, self.offset = summary, offset

    def json(self, texts: FloatTexts) -> str:
        return self.summary.json(texts, self.offset)


class _DeferredList(_Deferred):
    def __init__(self, offset: int, count: int):
        self.offset, self.count = offset, count

    def json(self, texts: FloatTexts) -> str:
        return f"[{texts.span(self.offset, self.offset + self.count)}]"


class _DeferredRows(_Deferred):
    """The ``rows`` of an attention event: the kept weights and then the three measures of
    each row are at ``weights`` and ``measures`` in the batch's float texts."""

    def __init__(self, rows: AttentionRows, layer: int, weights: int, measures: int):
        self.rows, self.layer, self.weights, self.measures = rows, layer, weights, measures

    def json(self, texts: FloatTexts) -> str:
        rows = self.rows
        kept = rows.kept
        ends = np.cumsum(kept).tolist()
        positions = list(map(str, rows.positions[rows.positions >= 0].tolist()))
        index = np.arange(kept.size)
        batch = (index // (rows.heads * rows.q_len)).tolist()
        head = (index // rows.q_len % rows.heads).tolist()
        query = (rows.k_len - rows.q_len + index % rows.q_len).tolist()
        prefix = f'{{"layer_idx":{self.layer},"batch":'
        keys = f',"num_keys":{rows.k_len},"top_k_positions":['
        weights, measures = self.weights, self.measures
        parts = []
        start = 0
        for row, end in enumerate(ends):
            measure = measures + 3 * row
            parts.append(
                f'{prefix}{batch[row]},"head_idx":{head[row]},"query_pos":{query[row]}{keys}'
                f'{",".join(positions[start:end])}],"top_k_weights":[{texts.span(weights + start, weights + end)}],'
                f'"tail_mass":{texts[measure]},"entropy":{texts[measure + 1]},"sink_weight":{texts[measure + 2]}}}')
            start = end
        return f"[{','.join(parts)}]"


def _json(value: Any, texts: FloatTexts) -> str:
    """``dumps(value)``, with each :class:`_Deferred` in it written from the float texts."""
    if isinstance(value, _Deferred):
        return value.json(texts)
    if isinstance(value, dict):
        return "{" + ",".join(f"{dumps(key)}:{_json(item, texts)}" for key, item in value.items()) + "}"
    if isinstance(value, list) and any(isinstance(item, (dict, _Deferred)) for item in value):
        return "[" + ",".join(_json(item, texts) for item in value) + "]"
    return dumps(value)
