"""Writes trace files (docs/trace-format.md) from Python: the header, passes, layers with their
stages, attention, logits, captures. Framework-free: values are anything numpy can read; the
PyTorch hooks of :mod:`model_trace.torch` drive it."""

from __future__ import annotations

import json
import math
import os
import threading
import time
from json.encoder import encode_basestring_ascii
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import __version__
from .attention import AttentionRows, attention_rows_of_many
from .floats import NumberTexts, f32_text, float_texts, integer_texts, join_rows
from .format import (FORMAT_NAME, SAMPLE_LEN, SCHEMA_VERSION, SKETCH_DIM, STAT_FLOATS, Summary, as_f32, canonical_nan,
                     dumps, tensor_summaries, tensor_summary)
from .routing import routing_record

#: Tracepoint kinds, as the Rust registry names them.
KINDS = ("model", "layer", "attention", "logits", "kv_cache", "quant", "tensor", "router")

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


class Pending:
    """Values still on their way to host memory, given to the writer in place of an array: a
    device's tensor being copied asynchronously (:mod:`model_trace.torch` copies CUDA tensors
    so). The writer reads none of them before its batch is summarised; then it calls ``wait``
    once for the whole batch (one call for all the pending values that share a ``wait``: a
    synchronisation of their device), and only after that :meth:`read`, once each. Not an
    array-like on purpose: ``np.asarray`` cannot read one by mistake."""

    __slots__ = ("shape", "wait", "_values")

    def __init__(self, shape: Sequence[int], wait: Callable[[], None]):
        self.shape: Tuple[int, ...] = tuple(shape)
        self.wait = wait
        self._values: Optional[np.ndarray] = None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """What the values take in host memory, as float32."""
        return 4 * self.size

    def read(self) -> np.ndarray:
        """The values, as float32 (integers as they are): called once, after ``wait``."""
        raise NotImplementedError

    @property
    def values(self) -> np.ndarray:
        """What :meth:`read` gave, once the writer has waited for it."""
        if self._values is None:
            raise RuntimeError("model_trace: pending values read before their copy was waited for")
        return self._values


#: What the writer takes as a tensor's values: anything numpy reads, or values on their way.
Values = Union[Any, Pending]


class CaptureWriter:
    """Saves full tensors as ``STEM.tensors-NNNN.safetensors`` beside the trace, one chunk at a
    time, each written to a temporary name and renamed; every NaN as the bits ``0x7fc00000``
    (the fingerprint's)."""

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
        if data.size and np.isnan(np.min(data)):
            data = canonical_nan(data)  # every NaN saved as 0x7fc00000, as it is fingerprinted
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
    ``PENDING_FLOATS`` numbers), the numbers of all of them turned into text at once. The
    tensors are summarised when their events are written (or when the copies kept for that
    pass ``PENDING_BYTES``), those of one length together, and the attention rows of the tensors
    with the same number of keys analysed together: at the sizes of a forward pass's tensors,
    array operations cost mostly what a call costs. Values may be :class:`Pending` (copies from
    a device under way): the writer waits for them once a batch, before it reads any, and
    until then does nothing with them (their captures, a logits row's top tokens, their
    summaries and attention rows wait too).
    """

    #: Numbers held back before the completed events are written even within a pass.
    PENDING_FLOATS = 1 << 20
    #: Bytes of tensor copies held back before they are summarised even within a pass.
    PENDING_BYTES = 32 << 20

    def __init__(
        self,
        path: str,
        *,
        config: Optional[Dict[str, Any]] = None,
        metadata: Optional[Dict[str, Any]] = None,
        tracepoints: Sequence[Dict[str, Any]] = (),
        capture: Optional[str] = None,
        digest: bool = True,
        interventions: Sequence[str] = (),
        isolate: Optional[str] = None,
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
        self._numbers = _PendingNumbers()
        self._tensors: List[_PendingTensor] = []
        self._tensor_bytes = 0
        self._rows: List[_DeferredRows] = []
        self._all_rows: List[_DeferredRows] = []
        self._pending_numbers = 0
        #: Pending values not yet waited for, and what is to be done once they are read.
        self._waiting: List[Pending] = []
        self._after_wait: List[Callable[[], None]] = []
        #: The stage check of the tracer writing this file, where it runs one (``model_trace.torch``
        #: sets it: ``writer.stage_check.report()``); None otherwise.
        self.stage_check: Optional[Any] = None
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
        if interventions:
            header["interventions"] = list(interventions)
        if isolate is not None:
            header["isolate"] = isolate
        self.file.write(dumps(header) + "\n")

    def rewrite_header(self, tracepoints: Optional[Sequence[Dict[str, Any]]] = None,
                       extra: Optional[Dict[str, str]] = None) -> None:
        """Rewrites the header line written when the writer opened: its ``tracepoints`` replaced,
        ``extra`` merged into its ``metadata.extra``. For what a tracer learns only from the
        first pass (``model_trace.torch``'s inferred stages); the file is written again from
        the start, so call it early."""
        self.file.flush()
        with open(self.path, "r", encoding="utf-8") as file:
            header = json.loads(file.readline())
            rest = file.read()
        if tracepoints is not None:
            header["tracepoints"] = list(tracepoints)
        if extra:
            header.setdefault("metadata", {}).setdefault("extra", {}).update(extra)
        self.file.seek(0)
        self.file.truncate()
        self.file.write(dumps(header) + "\n" + rest)

    # -- plumbing ------------------------------------------------------------------------------

    def _queue(self, event: Dict[str, Any]) -> None:
        """An event to write with the next batch; its values may be :class:`_Deferred`."""
        self._pending.append(event)
        if self._pending_numbers > self.PENDING_FLOATS:
            self._write_pending()

    def _write_pending(self) -> None:
        if not self._pending:
            return
        self._resolve()
        self._summarise()
        _analyse_rows(self._rows, self._numbers)
        texts = self._numbers.texts()
        _render_rows(self._all_rows, texts)
        self.file.write("".join((_layer_json(event, texts) if event["event"] == "layer" else _json(event, texts)) + "\n"
                                for event in self._pending))
        self._pending, self._numbers, self._rows, self._all_rows, self._pending_numbers = [], _PendingNumbers(), [], [], 0
        # The layers still open (a batch written within a pass) are written with a later batch:
        # the floats of their stages' summaries, made with this one, go with that one.
        for frame in self.layers:
            for stage in frame["stages"]:
                deferred = stage["tensor"]
                if isinstance(deferred, _DeferredSummary) and deferred.tensor.summary is not None:
                    deferred.tensor.offset = self._numbers.floats.add(deferred.tensor.summary.floats)
                    self._pending_numbers += deferred.tensor.summary.floats.size

    def _own(self, values: Values, dtype: Optional[str]) -> Tuple[Any, str]:
        """The writer's own float32 copy of ``values`` (a :class:`Pending`'s values are its own
        already: they are waited for with the batch) and the name of their dtype."""
        if isinstance(values, Pending):
            self._waiting.append(values)
            return values, dtype or "f32"
        array = np.asarray(values)
        return np.array(array, dtype=np.float32), dtype or dtype_name(array.dtype)

    def _resolve(self) -> None:
        """Waits for the batch's pending values (each distinct ``wait``, by ``==``, called once,
        before any of them is read), reads them, then does what waited for them."""
        waiting, self._waiting = self._waiting, []
        if waiting:
            for wait in dict.fromkeys(pending.wait for pending in waiting):
                wait()
            for pending in waiting:
                pending._values = pending.read()
        if self._after_wait:
            after, self._after_wait = self._after_wait, []
            for then in after:
                then()

    def _summarise(self) -> None:
        """Summarises the tensors kept for it (and saves those to capture), their floats added
        to the batch's numbers."""
        tensors = self._tensors
        if not tensors:
            return
        self._resolve()
        arrays = [t.values.values if isinstance(t.values, Pending) else t.values for t in tensors]
        if self.capture is not None:
            for tensor, array in zip(tensors, arrays):
                if tensor.capture is not None:
                    tensor.capture = self.capture.add(tensor.capture, as_f32(array).reshape(array.shape))
        summaries = tensor_summaries(arrays, [t.dtype for t in tensors], self.digest, [a.shape for a in arrays])
        floats = self._numbers.floats
        for tensor, summary in zip(tensors, summaries):
            summary.capture = tensor.capture
            tensor.summary, tensor.offset, tensor.values = summary, floats.add(summary.floats), None
        self._tensors, self._tensor_bytes = [], 0

    def _pending_tensor(self, array: Any, dtype: str, capture: Optional[str]) -> "_DeferredSummary":
        """The summary, to be made with the batch, of ``array`` (the writer's own copy, or a
        :class:`Pending`), saved as ``capture`` (a name) when not None."""
        tensor = _PendingTensor(array, dtype, capture)
        self._tensors.append(tensor)
        self._tensor_bytes += array.nbytes
        self._pending_numbers += 2 * SAMPLE_LEN + SKETCH_DIM + len(STAT_FLOATS)
        if self._tensor_bytes > self.PENDING_BYTES:
            self._summarise()
        return _DeferredSummary(tensor)

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
        summary = tensor_summary(array, dtype=dtype or dtype_name(array.dtype), digest=self.digest)
        summary.capture = self._capture(array, what, layer, wants_capture)
        return summary

    def _capture(self, array: np.ndarray, what: str, layer: Optional[int], wants: bool) -> Optional[Dict[str, str]]:
        """Saves ``array`` in full when captures are on and ``wants``; where it went."""
        name = self._capture_name(what, layer, wants)
        return None if name is None else self.capture.add(name, as_f32(array).reshape(array.shape))  # type: ignore[union-attr]

    def _capture_name(self, what: str, layer: Optional[int], wants: bool) -> Optional[str]:
        """The name a tensor recorded now is saved under when captures are on and ``wants``
        (it is saved when its batch is summarised, in the order recorded)."""
        if self.capture is None or not wants:
            return None
        pass_text = "none" if self.pass_index is None else str(self.pass_index)
        layer_text = "none" if layer is None else str(layer)
        return f"p{pass_text}.l{layer_text}.{what}.s{self.seq}"


    # -- passes --------------------------------------------------------------------------------

    def begin_pass(self, position: Union[int, Pending, None] = None, tracepoint: str = "forward",
                   function: str = "", tokens: Union[Sequence[int], Pending, None] = None) -> int:
        """``position``: the pass's first token's (default: the pass's index), or a
        :class:`Pending` whose first value it is. ``tokens``: the token ids the pass consumes,
        integers from 0 to 2**32 - 1 (anything numpy reads, a batch's rows one after another),
        or a :class:`Pending` of them; written as the event's ``tokens``, absent when None."""
        if self.pass_index is not None:
            self.end_pass()
        self.pass_index = self.passes
        self.passes += 1
        if isinstance(position, Pending):
            self._waiting.append(position)
            self.pass_position: Any = _DeferredInteger(position)
        else:
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
            **({} if tokens is None else {"tokens": self._token_ids(tokens)}),
        })
        return self.pass_index

    def _token_ids(self, tokens: Union[Sequence[int], Pending]) -> Any:
        if isinstance(tokens, Pending):
            self._waiting.append(tokens)
            return _DeferredIntegers(tokens)
        ids = np.asarray(tokens).reshape(-1)
        if ids.size and (ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() >= 1 << 32):
            raise ValueError(f"model_trace: token ids must be integers in 0..2**32, not {ids.tolist()}")
        return ids.tolist()

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

    def ensure_pass(self) -> int:
        """The index of the pass open now: one begun (with no tracepoint) if none is."""
        if self.pass_index is None:
            self.begin_pass(tracepoint="", function="")
        return self.pass_index  # type: ignore[return-value]

    # -- layers --------------------------------------------------------------------------------

    def begin_layer(self, layer: int, tracepoint: str, function: str) -> None:
        self.ensure_pass()
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

    def stage(self, name: str, values: Values, wants_capture: bool = False, dtype: Optional[str] = None) -> None:
        """A stage (or ``input``/``output``) of the innermost open layer. Its summary is made with
        the batch, from a copy of the values taken now (or from a :class:`Pending`)."""
        if not self.layers:
            return
        frame = self.layers[-1]
        seq = self.next_seq()
        array, dtype = self._own(values, dtype)
        tensor = self._pending_tensor(array, dtype, self._capture_name(name, frame["layer"], wants_capture))
        frame["stages"].append({"seq": seq, "name": name, "tensor": tensor})

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

    def intervention(self, stage: str, intervention: str, before: np.ndarray, after: np.ndarray,
                     source: Optional[str] = None) -> None:
        """A tensor of the innermost open layer was changed (``before`` into ``after``, as the
        program saw it): the ``intervention`` event, written before the layer's own."""
        if not self.layers:
            return
        frame = self.layers[-1]
        old = np.asarray(before, dtype=np.float64).ravel()
        new = np.asarray(after, dtype=np.float64).ravel()
        event: Dict[str, Any] = {
            "event": "intervention",
            "seq": self.next_seq(),
            "pass": frame["pass"],
            "layer": frame["layer"],
            "stage": stage,
            "tracepoint": frame["tracepoint"],
            "function": frame["function"],
            "intervention": intervention,
        }
        if source is not None:
            event["source"] = source
        event.update({
            "positions": None,
            "before_l2": float(np.float32(np.sqrt(np.dot(old, old)))),
            "delta_l2": float(np.float32(np.sqrt(np.dot(new - old, new - old)))),
        })
        self._queue(event)

    # -- records -------------------------------------------------------------------------------

    def attention(self, probs: Values, layer: int, tracepoint: str, function: str, wants_capture: bool = False,
                  top_k: int = 10, weight_threshold: float = 0.01, dtype: Optional[str] = None,
                  rows: Optional[AttentionRows] = None) -> None:
        """Attention probabilities ``[batch, heads, q, k]``: the summary and every row, sparsely.
        ``rows``: the rows already analysed (:func:`model_trace.attention.attention_rows`, as
        :mod:`model_trace.torch` does for a large tensor on a device); else they are analysed with
        the batch, from a copy of the values taken now (or from a :class:`Pending`)."""
        array, dtype = self._own(probs, dtype)
        seq = self.next_seq()
        summary = self._pending_tensor(array, dtype, self._capture_name("attention", layer, wants_capture))
        deferred = _DeferredRows(int(layer), rows if rows is not None else (array, top_k, weight_threshold))
        self._all_rows.append(deferred)
        if rows is None:
            self._rows.append(deferred)
            self._pending_numbers += array.size // max(array.shape[-1], 1) * (2 * top_k + 3) if array.ndim else 0
        else:
            deferred.take_numbers(self._numbers)
        self._queue({
            "event": "attention",
            "seq": seq,
            "pass": self.pass_index,
            "layer": int(layer),
            "tracepoint": tracepoint,
            "function": function,
            "probs": summary,
            "rows": deferred,
        })

    def logits(self, logits: Values, layer: int, tracepoint: str, function: str, wants_capture: bool = False,
               top_k: int = 5, dtype: Optional[str] = None) -> None:
        """Logits ``[vocab]``, ``[batch, vocab]`` or ``[batch, seq, vocab]``: the summary and the
        next-token row of each batch row (of a :class:`Pending`, once it is read)."""
        self.ensure_pass()
        array, dtype = self._own(logits, dtype)
        seq = self.next_seq()
        rows: List[Dict[str, Any]] = []
        if isinstance(array, Pending):
            # Before the summary is asked for: that can summarise the batch, waiting for the values.
            self._after_wait.append(lambda: self._logit_rows(array.values, top_k, rows))
        else:
            self._logit_rows(array, top_k, rows)
        summary = self._pending_tensor(array, dtype, self._capture_name("logits", layer, wants_capture))
        self._queue({
            "event": "logits",
            "seq": seq,
            "pass": self.pass_index,
            "layer": int(layer),
            "tracepoint": tracepoint,
            "function": function,
            "logits": summary,
            "batch_rows": rows,
        })

    def router(self, logits: Any, experts: Any, weights: Any, layer: int, tracepoint: str = "router",
               function: str = "", scoring: str = "softmax", bias: Any = None,
               groups: Optional[Tuple[int, int]] = None, wants_capture: bool = False,
               dtype: Optional[str] = None) -> None:
        """One router call (docs/trace-format.md, ``router``): ``logits`` ``[rows, experts]``
        (or ``[batch, seq, experts]``), the chosen ``experts`` and their ``weights``
        ``[rows, k]`` as the router returned them, ``scoring`` ``softmax`` or ``sigmoid``, the
        selection ``bias`` ``[experts]`` and ``groups`` ``(n_group, topk_group)`` where the router
        has them. The logits are summarised as given; each token's margins are computed now
        (:func:`model_trace.routing.routing_record`, which raises
        :class:`~model_trace.routing.RoutingError` on values that do not fit together)."""
        record = routing_record(logits, experts, weights, scoring, bias, groups)
        array, dtype = self._own(logits, dtype)
        seq = self.next_seq()
        summary = self._pending_tensor(array, dtype, self._capture_name("router", layer, wants_capture))
        event: Dict[str, Any] = {"event": "router", "seq": seq, "pass": self.pass_index, "layer": int(layer),
                                 "tracepoint": tracepoint, "function": function, "scoring": scoring}
        if groups is not None:
            event["groups"] = {"groups": int(groups[0]), "top_groups": int(groups[1])}
        event.update({"selection_bias": bias is not None, "num_experts": record["num_experts"],
                      "top_k": record["top_k"], "logits": summary, "tokens": record["tokens"],
                      "load": record["load"]})
        self._pending_numbers += sum(2 * len(t["logits"]) + 4 for t in record["tokens"])
        self._queue(event)

    def _logit_rows(self, array: np.ndarray, top_k: int, rows: List[Dict[str, Any]]) -> None:
        """Appends to ``rows`` the top tokens of the next-token row of each batch row of
        ``array``, their logits added to the batch's numbers."""
        if array.ndim == 1:
            array = array[None, None]
        elif array.ndim == 2:
            array = array[:, None]
        for b in range(array.shape[0]):
            row = array[b, -1]
            best = top_tokens(row, top_k)
            rows.append({"batch": b, "top_tokens": best.tolist(),
                         "top_logits": _DeferredList(self._numbers.floats.add(row[best]), best.size)})

    def close(self) -> None:
        if self.closed:
            return
        self.end_pass()
        self._summarise()  # the captures of tensors recorded outside a pass, before the last chunk
        if self.capture is not None:
            self.capture.flush()
        self._queue({"event": "session_end", "seq": self.next_seq(), "end_ns": self.now_ns(),
                     "passes": self.passes, "errors": [], "errors_not_kept": 0})
        self._write_pending()
        self.file.close()
        self.closed = True


def top_tokens(logits: np.ndarray, count: int) -> np.ndarray:
    """The ``count`` tokens of a row of logits with the highest finite logits, best first, the
    lower token first on ties (a partition, then a sort of the few that can be among them)."""
    count = min(count, logits.size)
    if count <= 0:
        return np.zeros(0, dtype=np.int64)
    key = -np.where(np.isfinite(logits), logits, -np.inf)
    candidates = np.flatnonzero(key <= np.partition(key, count - 1)[count - 1])
    best = candidates[np.lexsort((candidates, key[candidates]))][:count]
    return best[np.isfinite(logits[best])]


class _PendingTensor:
    """A tensor's values (the writer's copy, or a :class:`Pending`) and the name to capture it
    under until it is summarised, then its summary, where it was captured and where its floats
    are among the batch's numbers."""

    __slots__ = ("values", "dtype", "capture", "summary", "offset")

    def __init__(self, values: Any, dtype: str, capture: Any):
        self.values, self.dtype, self.capture = values, dtype, capture
        self.summary: Optional[Summary] = None
        self.offset = 0


class _Batch:
    """Numbers held back for a batch of events, as arrays, each array's offset among them."""

    def __init__(self) -> None:
        self.arrays: List[np.ndarray] = []
        self.count = 0

    def add(self, values: np.ndarray) -> int:
        offset = self.count
        self.arrays.append(values)
        self.count += values.size
        return offset

    def values(self) -> np.ndarray:
        return np.concatenate(self.arrays) if self.arrays else np.zeros(0)


class _Texts:
    """The JSON texts of a batch's floats and integers."""

    def __init__(self, floats: NumberTexts, integers: NumberTexts):
        self.floats, self.integers = floats, integers


class _PendingNumbers:
    """The floats and the integers of the events not yet written: turned into text at once, one
    vectorised conversion each, when the events are written."""

    def __init__(self) -> None:
        self.floats = _Batch()
        self.integers = _Batch()

    def texts(self) -> _Texts:
        return _Texts(float_texts(self.floats.values()), integer_texts(self.integers.values()))


class _Deferred:
    """A value of a pending event whose JSON text needs the batch's number texts."""

    def json(self, texts: _Texts) -> str:
        raise NotImplementedError


class _DeferredSummary(_Deferred):
    def __init__(self, tensor: _PendingTensor):
        self.tensor = tensor

    def json(self, texts: _Texts) -> str:
        return self.tensor.summary.json(texts.floats, self.tensor.offset)  # type: ignore[union-attr]


class _DeferredInteger(_Deferred):
    """An integer that is the first of a :class:`Pending`'s values (a pass's position)."""

    def __init__(self, pending: Pending):
        self.pending = pending

    def json(self, texts: _Texts) -> str:
        return str(int(self.pending.values.reshape(-1)[0]))


class _DeferredIntegers(_DeferredInteger):
    """The integers that are a :class:`Pending`'s values, in order (a pass's token ids)."""

    def json(self, texts: _Texts) -> str:
        return "[" + ",".join(map(str, self.pending.values.reshape(-1).tolist())) + "]"


class _DeferredList(_Deferred):
    def __init__(self, offset: int, count: int):
        self.offset, self.count = offset, count

    def json(self, texts: _Texts) -> str:
        return f"[{texts.floats.span(self.offset, self.offset + self.count)}]"


class _DeferredRows(_Deferred):
    """The ``rows`` of an attention event, their numbers held in ``numbers``."""

    def __init__(self, layer: int, rows: Any):
        #: The analysed rows, or (probabilities, top_k, weight threshold) until they are.
        self.rows, self.layer = rows, layer
        self.positions = self.weights = self.measures = 0
        #: The JSON text, when written with the batch's other rows (:func:`_render_rows`).
        self.text: Optional[str] = None

    def take_numbers(self, numbers: _PendingNumbers) -> None:
        """Adds the analysed rows' numbers to the batch's."""
        rows = self.rows
        kept = rows.positions >= 0
        self.positions = numbers.integers.add(rows.positions[kept])
        self.weights = numbers.floats.add(rows.weights[kept])
        self.measures = numbers.floats.add(rows.measures.reshape(-1))

    def json(self, texts: _Texts) -> str:
        if self.text is not None:
            return self.text
        rows = self.rows
        ends = np.cumsum(rows.kept)
        starts = ends - rows.kept
        index = np.arange(ends.size)
        heads = [f'{{"layer_idx":{self.layer},"batch":{b},"head_idx":{h},"query_pos":{q},"num_keys":{rows.k_len},'
                 for b, h, q in zip((index // (rows.heads * rows.q_len)).tolist(), (index // rows.q_len % rows.heads).tolist(),
                                    (rows.k_len - rows.q_len + index % rows.q_len).tolist())]
        positions = _spans(texts.integers, self.positions + starts, self.positions + ends)
        weights = _spans(texts.floats, self.weights + starts, self.weights + ends)
        measures = _spans(texts.floats, self.measures + np.arange(3 * ends.size), self.measures + np.arange(1, 3 * ends.size + 1))
        return "[" + ",".join(
            f'{head}"top_k_positions":[{kept}],"top_k_weights":[{weight}],'
            f'"tail_mass":{tail},"entropy":{entropy},"sink_weight":{sink}}}'
            for head, kept, weight, tail, entropy, sink
            in zip(heads, positions, weights, measures[0::3], measures[1::3], measures[2::3])) + "]"


def _render_rows(deferred: List[_DeferredRows], texts: _Texts) -> None:
    """The JSON text of the rows of every attention event of a batch, at once (one
    :func:`join_rows`), set as their :attr:`_DeferredRows.text`."""
    for d in deferred:
        if d.rows.positions.shape[0] == 0:
            d.text = "[]"
    deferred = [d for d in deferred if d.text is None]
    if not deferred:
        return
    counts = [d.rows.positions.shape[0] for d in deferred]
    total = sum(counts)
    kept = np.concatenate([d.rows.kept for d in deferred])
    ends = np.cumsum(kept)
    event_first = np.cumsum([0] + counts[:-1])
    first_kept = np.repeat(ends[event_first] - kept[event_first], counts)  # kept before each event
    local_kept_end = ends - first_kept
    local_kept_start = local_kept_end - kept
    local = np.arange(total) - np.repeat(event_first, counts)

    def per_row(values: List[int]) -> np.ndarray:
        return np.repeat(np.array(values, dtype=np.int64), counts)

    heads, q_len = per_row([d.rows.heads for d in deferred]), per_row([d.rows.q_len for d in deferred])
    k_len, layer = per_row([d.rows.k_len for d in deferred]), per_row([d.layer for d in deferred])
    query = k_len - q_len + local % q_len
    if layer.min() < 0 or query.min() < 0:
        return  # written row by row (_DeferredRows.json)

    def span(numbers: NumberTexts, first: np.ndarray, stop: np.ndarray) -> Any:
        starts = numbers.start_array[first]
        return numbers.ascii(), starts, np.maximum(numbers.start_array[stop] - 1 - starts, 0)

    positions, weights = per_row([d.positions for d in deferred]), per_row([d.weights for d in deferred])
    measures = per_row([d.measures for d in deferred]) + 3 * local
    floats = texts.floats
    joined, starts = join_rows(total, [
        '{"layer_idx":', layer, ',"batch":', local // (heads * q_len), ',"head_idx":', local // q_len % heads,
        ',"query_pos":', query, ',"num_keys":', k_len,
        ',"top_k_positions":[', span(texts.integers, positions + local_kept_start, positions + local_kept_end),
        '],"top_k_weights":[', span(floats, weights + local_kept_start, weights + local_kept_end),
        '],"tail_mass":', span(floats, measures, measures + 1), ',"entropy":', span(floats, measures + 1, measures + 2),
        ',"sink_weight":', span(floats, measures + 2, measures + 3), '},'])
    bounds = starts[np.concatenate([event_first, [total]])].tolist()
    for d, start, stop in zip(deferred, bounds, bounds[1:]):
        d.text = f"[{joined[start:stop - 1]}]"


def _analyse_rows(pending: List[_DeferredRows], numbers: _PendingNumbers) -> None:
    """Analyses the attention rows of the tensors kept for it, those with the same number of keys
    (and options) together, and adds their numbers to the batch's."""
    groups: Dict[Any, List[_DeferredRows]] = {}
    for deferred in pending:
        probs, top_k, threshold = deferred.rows
        if isinstance(probs, Pending):
            probs = probs.values
            deferred.rows = (probs, top_k, threshold)
        groups.setdefault((probs.shape[-1] if probs.ndim else 0, top_k, threshold), []).append(deferred)
    for (_, top_k, threshold), members in groups.items():
        analysed = attention_rows_of_many([deferred.rows[0] for deferred in members], top_k, threshold)
        for deferred, rows in zip(members, analysed):
            deferred.rows = rows
            deferred.take_numbers(numbers)


def _spans(texts: NumberTexts, starts: np.ndarray, stops: np.ndarray) -> List[str]:
    """``texts.span(a, b)`` for each ``a`` of ``starts`` and ``b`` of ``stops``."""
    joined = texts.joined
    return [joined[a:b - 1] if b > a else "" for a, b in zip(texts.start_array[starts].tolist(), texts.start_array[stops].tolist())]


def _layer_json(frame: Dict[str, Any], texts: _Texts) -> str:
    """:func:`_json` of a layer event (keys as :meth:`TraceWriter.begin_layer` puts them), from
    one template: a pass has many of them."""
    stages = ",".join(f'{{"seq":{stage["seq"]},"name":{encode_basestring_ascii(stage["name"])},'
                      f'"tensor":{_json(stage["tensor"], texts)}}}' for stage in frame["stages"])
    return (f'{{"event":"layer","seq":{frame["seq"]},"pass":{_json(frame["pass"], texts)},"layer":{frame["layer"]},'
            f'"tracepoint":{encode_basestring_ascii(frame["tracepoint"])},'
            f'"function":{encode_basestring_ascii(frame["function"])},"start_ns":{frame["start_ns"]},'
            f'"duration_ns":{frame["duration_ns"]},"stages":[{stages}]}}')


def _json(value: Any, texts: _Texts) -> str:
    """The JSON text of an event or a part of it, as the Rust writer writes it: each
    :class:`_Deferred` written from the number texts, floats as float32
    (:func:`model_trace.floats.f32_text`), the rest as ``dumps`` writes it."""
    kind = type(value)
    if kind is int:
        return str(value)
    if kind is str:
        return encode_basestring_ascii(value)
    if kind is float:
        return f32_text(value)
    if value is None:
        return "null"
    if isinstance(value, _Deferred):
        return value.json(texts)
    if isinstance(value, dict):
        return "{" + ",".join(f"{encode_basestring_ascii(key)}:{_json(item, texts)}" for key, item in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_json(item, texts) for item in value) + "]"
    return dumps(value)
