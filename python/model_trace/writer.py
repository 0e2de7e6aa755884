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
from .format import FORMAT_NAME, SCHEMA_VERSION, as_f32, dumps, f32, summarize

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
        data = np.ascontiguousarray(values, dtype=np.float32)
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
    those tensors. Sequence numbers and times follow the format; the file is flushed at the end
    of every pass and closed by :meth:`close`.
    """

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
        self._write(header)

    # -- plumbing ------------------------------------------------------------------------------

    def _write(self, obj: Dict[str, Any]) -> None:
        self.file.write(dumps(obj))
        self.file.write("\n")

    def next_seq(self) -> int:
        seq = self.seq
        self.seq += 1
        return seq

    def now_ns(self) -> int:
        return time.monotonic_ns() - self.epoch

    def summary(self, values: Any, what: str, layer: Optional[int], wants_capture: bool = False,
                dtype: Optional[str] = None) -> Dict[str, Any]:
        """The tensor summary of ``values`` (anything numpy reads); ``dtype`` names the
        framework's element type when the values were converted."""
        array = np.asarray(values)
        dtype = dtype or dtype_name(array.dtype)
        summary = summarize(as_f32(array), shape=array.shape, dtype=dtype, digest=self.digest)
        if self.capture is not None and wants_capture:
            pass_text = "none" if self.pass_index is None else str(self.pass_index)
            layer_text = "none" if layer is None else str(layer)
            name = f"p{pass_text}.l{layer_text}.{what}.s{self.seq}"
            summary["capture"] = self.capture.add(name, as_f32(array).reshape(array.shape))
        return summary

    # -- passes --------------------------------------------------------------------------------

    def begin_pass(self, position: Optional[int] = None, tracepoint: str = "forward", function: str = "") -> int:
        if self.pass_index is not None:
            self.end_pass()
        self.pass_index = self.passes
        self.passes += 1
        self.pass_position = self.pass_index if position is None else int(position)
        self.pass_start = self.now_ns()
        self.pass_layers = 0
        self._write({
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
        self._write({
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
        frame["stages"].append({"seq": seq, "name": name, "tensor": summary})

    def end_layer(self) -> None:
        if not self.layers:
            return
        frame = self.layers.pop()
        frame["duration_ns"] = self.now_ns() - frame["start_ns"]
        self._write(frame)

    def current_layer(self) -> Optional[int]:
        return self.layers[-1]["layer"] if self.layers else None

    # -- records -------------------------------------------------------------------------------

    def attention(self, probs: Any, layer: int, tracepoint: str, function: str, wants_capture: bool = False,
                  top_k: int = 10, weight_threshold: float = 0.01, dtype: Optional[str] = None) -> None:
        """Attention probabilities ``[batch, heads, q, k]``: the summary and every row, sparsely."""
        array = np.asarray(probs, dtype=np.float32)
        seq = self.next_seq()
        summary = self.summary(array, "attention", layer, wants_capture, dtype)
        while array.ndim < 4:
            array = array[None]
        batch, heads, q_len, k_len = array.shape
        rows = []
        for b in range(batch):
            for h in range(heads):
                for r in range(q_len):
                    rows.append(attention_row(array[b, h, r], int(layer), b, h, k_len - q_len + r, top_k, weight_threshold))
        self._write({
            "event": "attention",
            "seq": seq,
            "pass": self.pass_index,
            "layer": int(layer),
            "tracepoint": tracepoint,
            "function": function,
            "probs": summary,
            "rows": rows,
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
            order = [int(i) for i in order if np.isfinite(row[i])]
            rows.append({"batch": b, "top_tokens": order, "top_logits": [f32(row[i]) for i in order]})
        self._write({
            "event": "logits",
            "seq": seq,
            "pass": self.pass_index,
            "layer": int(layer),
            "tracepoint": tracepoint,
            "function": function,
            "logits": summary,
            "batch_rows": rows,
        })

    def close(self) -> None:
        if self.closed:
            return
        self.end_pass()
        if self.capture is not None:
            self.capture.flush()
        self._write({"event": "session_end", "seq": self.next_seq(), "end_ns": self.now_ns(),
                     "passes": self.passes, "errors": [], "errors_not_kept": 0})
        self.file.close()
        self.closed = True


def attention_row(weights: np.ndarray, layer: int, batch: int, head: int, query: int, top_k: int,
                  weight_threshold: float) -> Dict[str, Any]:
    """One row as the Rust runtime records it: the ``top_k`` heaviest positive finite weights of
    at least ``weight_threshold`` (heaviest first, lower position on ties), the tail mass, the
    entropy in nats and the weight on position 0."""
    w = np.asarray(weights, dtype=np.float32)
    ok = np.isfinite(w) & (w >= np.float32(1.1754944e-38))
    mass = w[ok].astype(np.float64)
    total = float(mass.sum())
    entropy = float(-(mass * np.log(mass)).sum()) if mass.size else 0.0
    floor = max(weight_threshold, np.float32(1.4e-45))
    candidates = np.where(np.isfinite(w) & (w >= floor), w, -np.inf)
    order = np.argsort(-candidates, kind="stable")[:top_k]
    order = [int(i) for i in order if np.isfinite(candidates[i])]
    kept = [float(w[i]) for i in order]
    first = float(w[0]) if w.size and np.isfinite(w[0]) and w[0] > 0 else 0.0
    return {
        "layer_idx": layer,
        "batch": batch,
        "head_idx": head,
        "query_pos": int(query),
        "num_keys": int(w.size),
        "top_k_positions": order,
        "top_k_weights": [f32(v) for v in kept],
        "tail_mass": f32(max(total - sum(kept), 0.0)),
        "entropy": f32(entropy if entropy > 0 else 0.0),
        "sink_weight": f32(first),
    }
