"""Trace a PyTorch model with forward hooks: the reference side of ``model-trace diff``.

    import model_trace.torch
    with model_trace.torch.trace(model, "ref.ndjson"):
        model(**inputs)

Every forward call of ``model`` is a pass, which records the ``input_ids`` it consumes (its
``pass_begin`` event's ``tokens``); each transformer block a layer, with its input, its
output and the stages of the stage vocabulary (docs/trace-format.md) in between; attention
probabilities (when the model runs eager attention) and the next-token logits are recorded too.
Hugging Face transformers' BERT and Llama blocks are known; for other architectures give the
layer pattern and the stages' submodules (:class:`Architecture`).
"""

from __future__ import annotations

import contextlib
import functools
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np

from .attention import attention_rows
from .filter import CaptureFilter, Tracepoint
from .format import read_trace
from .writer import Pending, TraceWriter, dtype_name


@dataclass
class Architecture:
    """Where a model's blocks and stages are.

    ``layers``: a regex over ``named_modules()`` paths whose group 1 is the layer index.
    ``stages``: stage name -> (submodule path relative to the block, ``"output"`` or
    ``"input"``), in execution order. ``attention``: (submodule, index of the probabilities in its
    output tuple). ``logits``: the module whose output is the logits (absolute path).
    """

    name: str
    layers: str
    stages: Dict[str, Tuple[str, str]] = field(default_factory=dict)
    attention: Optional[Tuple[str, int]] = None
    logits: Optional[str] = None
    layer_class: Optional[str] = None


#: Llama blocks (transformers' LlamaDecoderLayer): pre-norm.
LLAMA = Architecture(
    name="llama",
    layers=r"^(?:.*\.)?layers\.(\d+)$",
    layer_class="LlamaDecoderLayer",
    stages={
        "attn_in": ("input_layernorm", "output"),
        "attn_out": ("self_attn", "output"),
        "resid_mid": ("post_attention_layernorm", "input"),
        "mlp_in": ("post_attention_layernorm", "output"),
        "mlp_out": ("mlp", "output"),
    },
    attention=("self_attn", 1),
    logits="lm_head",
)

#: BERT encoder layers (transformers' BertLayer): post-norm.
BERT = Architecture(
    name="bert",
    layers=r"^(?:.*\.)?layer\.(\d+)$",
    layer_class="BertLayer",
    stages={
        "attn_out": ("attention.output.dense", "output"),
        "resid_mid": ("attention", "output"),
        "mlp_out": ("output.dense", "output"),
    },
    attention=("attention.self", 1),
)

KNOWN = {"llama": LLAMA, "bert": BERT}


def detect(model: Any, modules: Optional[Dict[str, Any]] = None) -> Architecture:
    """The architecture of a transformers model, from the class of its blocks (``modules``:
    ``dict(model.named_modules())`` when the caller has it)."""
    classes = {type(module).__name__ for module in (modules.values() if modules is not None else model.modules())}
    for architecture in KNOWN.values():
        if architecture.layer_class in classes:
            return architecture
    raise ValueError(
        "model_trace.torch: unknown architecture (blocks of class "
        f"{sorted(c for c in classes if 'Layer' in c or 'Block' in c)}); pass architecture=Architecture(...)"
    )


def module_names(architecture: Architecture) -> Architecture:
    """The same architecture recording each stage under its module's name (``self_attn``,
    ``post_attention_layernorm:input``) instead of the stage vocabulary: what the ``llama`` and
    ``bert`` presets of ``model-trace diff --map`` translate back."""
    stages = {_module_stage(path, which): (path, which) for path, which in architecture.stages.values()}
    return Architecture(architecture.name, architecture.layers, stages, architecture.attention,
                        architecture.logits, architecture.layer_class)


#: Names a stage cannot have: records of their own (`attention`, `logits`) and the layer's
#: `input` and `output`.
RESERVED = ("attention", "logits", "input", "output")


def _module_stage(path: str, which: str) -> str:
    """A module's stage name: its path, `:input` for its input, `:output` where the path alone
    would be a reserved name (BERT's `attention` module)."""
    if which == "input":
        return f"{path}:input"
    return f"{path}:output" if path in RESERVED else path


#: Device types whose tensors are copied to host memory asynchronously (:class:`_HostCopy`):
#: the writer waits for them once a batch. Another device's are copied with ``.cpu()``.
ASYNC_COPY_DEVICES = ("cuda",)

#: Attention probabilities on a device with at least this many elements are analysed there
#: (:func:`model_trace.attention.attention_rows`: ~35 small torch operations, then one copy of
#: the results, which waits for the device); smaller ones with the batch's others in host
#: memory, from the copy made for their summary anyway. Measured on an H100 machine (torch
#: 2.11, python/benchmarks/cuda_copies.py), one tensor's analysis on the device took 1.2-1.5 ms
#: at every size from 153 to 2.4M elements (launches and the wait); in host memory 0.12 ms for
#: a decode step's [1, 9, 1, 17], 0.23 ms for a 16-token prefill's [1, 9, 16, 16], 1.1 ms for
#: 37K elements, 2.0 ms for 83K, 3.0 ms for 147K, 15 ms for 590K. They meet at about 50K; the
#: wait for the device, which also keeps it from running ahead of the host, tips it to 64K.
DEVICE_ANALYSIS_MIN_ELEMENTS = 1 << 16


def analysed_on_device(probs: Any) -> bool:
    """Whether the attention rows of ``probs`` (a torch tensor) are analysed on its device,
    rather than in host memory with the batch's other attention tensors."""
    return probs.device.type != "cpu" and probs.numel() >= DEVICE_ANALYSIS_MIN_ELEMENTS


def to_numpy(value: Any) -> Tuple[Union[np.ndarray, Pending], str]:
    """A tensor's values as float32 on the host (a CPU float32 tensor's own memory), and its
    dtype's name. A CUDA tensor's come as a :class:`_HostCopy` whose values the writer reads
    once it has waited for the device (one wait a batch, not one a tensor)."""
    import torch

    if isinstance(value, torch.Tensor):
        tensor = value.detach()
        device = tensor.device.type
        if device in ASYNC_COPY_DEVICES:
            # float16 and bfloat16 copied as they are (half the bytes) and widened in host
            # memory; other types made float32 on the device, as before a blocking copy.
            if tensor.dtype not in (torch.float32, torch.float16, torch.bfloat16):
                tensor = tensor.to(torch.float32)
            return _HostCopy(tensor), _dtype_name(value.dtype)
        if tensor.dtype != torch.float32:
            tensor = tensor.to(torch.float32)
        if device != "cpu":
            tensor = tensor.cpu()
        return tensor.numpy(), _dtype_name(value.dtype)
    array = np.asarray(value)
    return array.astype(np.float32), dtype_name(array.dtype)


class _HostCopy(Pending):
    """A device tensor's copy to host memory, under way. ``tensor.to("cpu", non_blocking=True)``
    queues the copy on the device's current stream and returns at once, with a host tensor
    that torch allocates in pinned memory (``_to_copy`` pins the result of a non-blocking copy
    from an accelerator to the CPU): its values are there only once the device has reached
    the copy. So they are read (:meth:`read`) only after ``wait``, a
    ``torch.cuda.synchronize`` of the device, which the writer calls once for its batch. The
    copy is taken now: what the model does with the tensor later on the same stream comes after
    it."""

    __slots__ = ("host",)

    def __init__(self, tensor: Any):
        super().__init__(tensor.shape, _synchronizer(tensor.device))
        self.host = tensor.to("cpu", non_blocking=True)

    def read(self) -> np.ndarray:
        import torch

        host, self.host = self.host, None
        if host.dtype in (torch.float16, torch.bfloat16):
            host = host.to(torch.float32)  # exact: every float16 and bfloat16 value is a float32 one
        return host.numpy()


_SYNCHRONIZERS: Dict[Any, Callable[[], None]] = {}


def _synchronizer(device: Any) -> Callable[[], None]:
    """``torch.cuda.synchronize(device)``, one callable a device: the writer calls each distinct
    one once a batch."""
    wait = _SYNCHRONIZERS.get(device)
    if wait is None:
        import torch

        wait = _SYNCHRONIZERS[device] = functools.partial(torch.cuda.synchronize, device)
    return wait


_DTYPE_NAMES: Dict[Any, str] = {}


def _dtype_name(dtype: Any) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype_name(dtype)
    return name


def first_tensor(value: Any) -> Any:
    """``value``, or its first element if it is a tuple or list (module outputs such as
    ``(hidden_states, attn_weights)``)."""
    if isinstance(value, (tuple, list)):
        return value[0] if value else None
    return value


@contextlib.contextmanager
def trace(
    model: Any,
    path: str,
    *,
    architecture: Optional[Architecture] = None,
    names: str = "stages",
    capture: Optional[str] = None,
    metadata: Optional[Dict[str, Any]] = None,
    digest: bool = True,
    record_attention: bool = True,
    record_logits: bool = True,
    isolate: Optional[str] = None,
) -> Iterator[TraceWriter]:
    """Records every forward call of ``model`` inside the ``with`` block into the trace file at
    ``path`` (replaced if it exists).

    ``architecture``: detected from transformers' block classes (BERT, Llama) when not given.
    ``names``: ``"stages"`` records the stage vocabulary (``attn_out``, ...); ``"modules"``
    records the modules' own names, for ``model-trace diff --map llama|bert``. ``capture``: a
    capture filter (:class:`model_trace.filter.CaptureFilter`, the Rust one's syntax: ``"*"``,
    ``"layer:*,pass=0"``): full tensors saved beside the trace. A hooked module's tracepoint, as
    the patterns see it: its kind; its name (a layer: the block's class, ``LlamaDecoderLayer``;
    a stage: the stage's name; attention: the submodule's path in the block, ``self_attn``;
    logits: the head's path, ``lm_head``); as its function, the module's path in
    ``model.named_modules()`` (``model.layers.3.self_attn``) and as its module the model's class,
    so that a ``::`` glob matches ``LlamaForCausalLM::model.layers.3.self_attn``; no file and
    line 0, so ``@file`` patterns match none of them. Attention probabilities need
    ``attn_implementation="eager"``; with another implementation the model returns none and none
    is recorded.

    ``isolate``: a trace of the port (written with its layers' inputs captured:
    ``MODEL_TRACE_CAPTURE=layer:*``) whose captured input of each (pass, layer) this model's
    layer is fed in place of its own: the reference run the other way round from the port's
    ``MODEL_TRACE_ISOLATE``, so that each layer's output here is what the reference computes
    from the port's input. Each replacement is an ``intervention`` event, and the header names
    the file (``isolate``); a pass or layer the port did not capture raises ``ValueError``.
    """
    # One walk of the module tree: it costs as much as a small model's forward pass.
    modules = dict(model.named_modules())
    architecture = architecture or detect(model, modules)
    if names == "modules":
        architecture = module_names(architecture)
    elif names != "stages":
        raise ValueError(f"names must be 'stages' or 'modules', not {names!r}")
    captures = CaptureFilter(capture)
    pattern = re.compile(architecture.layers)
    layers = [(int(m.group(1)), name, module) for name, module in modules.items()
              if (m := pattern.match(name))
              and (architecture.layer_class is None or type(module).__name__ == architecture.layer_class)]
    if not layers:
        raise ValueError(f"model_trace.torch: no module matches the layer pattern {architecture.layers!r}")
    final_layer = max(index for index, _, _ in layers) + 1
    tracepoints = [{"kind": "model", "name": "forward", "function": type(model).__name__, "file": "", "line": 0}]
    tracepoints += [{"kind": "layer", "name": type(layers[0][2]).__name__, "function": name, "file": "", "line": 0}
                    for _, name, _ in layers[:1]]
    tracepoints += [{"kind": "tensor", "name": stage, "function": path, "file": "", "line": 0}
                    for stage, (path, _) in architecture.stages.items()]
    config = {
        "trace_activations": True,
        "trace_attention": record_attention and architecture.attention is not None,
        "trace_logits": record_logits and architecture.logits is not None,
        "trace_quant_error": False,
        "trace_kv_cache": False,
        "digests": "always" if digest else "off",
    }
    meta = {"extra": {"architecture": architecture.name, "names": names}}
    meta.update(metadata or {})
    replay = _Captures(isolate) if isolate is not None else None
    interventions = [f"stage=input replace({isolate})"] if isolate is not None else []
    writer = TraceWriter(path, config=config, metadata=meta, tracepoints=tracepoints, capture=capture, digest=digest,
                         interventions=interventions, isolate=isolate)
    handles: List[Any] = []

    def wants(kind: str, name: str, function: str, layer: Optional[int]) -> bool:
        if not capture:
            return False
        tracepoint = Tracepoint(kind, name, function=function, module=type(model).__name__)
        return captures.captures(tracepoint, writer.pass_index, layer)

    def top_pre(_module: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        writer.begin_pass(position=_position(args, kwargs), function=type(model).__name__,
                          tokens=_token_ids(args, kwargs))

    def top_post(*_: Any) -> None:
        writer.end_pass()

    handles.append(model.register_forward_pre_hook(top_pre, with_kwargs=True))
    handles.append(model.register_forward_hook(top_post))
    layer_name = type(layers[0][2]).__name__
    for index, path_, block in layers:
        handles += _hook_layer(writer, block, index, path_, layer_name, architecture, wants, record_attention, modules,
                               replay)
    if record_logits and architecture.logits:
        head = modules.get(architecture.logits)
        if head is not None:
            def on_logits(_module: Any, _args: Any, output: Any) -> None:
                logits = first_tensor(output)
                if logits.ndim == 3:
                    logits = logits[:, -1, :]  # the next-token logits, as the Rust examples record them
                values, dtype = to_numpy(logits)
                writer.logits(values, final_layer, architecture.logits, architecture.logits,
                              wants("logits", architecture.logits, architecture.logits, final_layer), dtype=dtype)

            handles.append(head.register_forward_hook(on_logits))
    try:
        yield writer
    finally:
        for handle in handles:
            handle.remove()
        writer.close()


def _position(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Union[int, Pending]:
    """The position of a pass's first token: ``cache_position[0]``, else the cache's length. A
    CUDA tensor's first value is copied like the tensors (reading it now would wait for the
    device)."""
    cache_position = kwargs.get("cache_position")
    if cache_position is not None:
        first = cache_position.reshape(-1)[:1]
        if first.device.type in ASYNC_COPY_DEVICES:
            return _HostCopy(first)
        return int(first[0])
    past = kwargs.get("past_key_values")
    if past is not None and hasattr(past, "get_seq_length"):
        return int(past.get_seq_length())
    return 0


def _token_ids(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Union[List[int], Pending, None]:
    """The token ids a pass consumes: ``input_ids``, given by keyword or as the first positional
    argument, a batch's rows one after another; None when the model was given no integer ids
    (``inputs_embeds``). A CUDA tensor's are copied like the tensors (reading them now would
    wait for the device)."""
    import torch

    ids = kwargs.get("input_ids")
    if ids is None and args:
        ids = args[0]
    if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.is_complex():
        return None
    flat = ids.detach().reshape(-1)
    if flat.device.type in ASYNC_COPY_DEVICES:
        return _HostCopy(flat)
    return flat.tolist()


def _hook_layer(writer: TraceWriter, block: Any, index: int, path: str, layer_name: str,
                architecture: Architecture, wants: Any, record_attention: bool,
                all_modules: Dict[str, Any], replay: Optional["_Captures"] = None) -> List[Any]:
    handles = []
    modules = _Submodules(block, path, all_modules)

    def pre(_module: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        writer.begin_layer(index, layer_name, path)
        hidden = args[0] if args else kwargs.get("hidden_states")
        changed = None
        if hidden is not None and replay is not None:
            hidden, changed = replay.feed(writer, index, hidden, args, kwargs)
        if hidden is not None:
            values, dtype = to_numpy(hidden)
            writer.stage("input", values, wants("layer", layer_name, path, index), dtype)
        return changed

    def post(_module: Any, _args: Any, output: Any) -> None:
        values, dtype = to_numpy(first_tensor(output))
        writer.stage("output", values, wants("layer", layer_name, path, index), dtype)
        writer.end_layer()

    handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
    # The probabilities before the stages: a hook on the same module (Llama's self_attn gives
    # both) must record them first, as they were computed first.
    if record_attention and architecture.attention is not None:
        # Names of their own: the stages' loop below rebinds `sub`, which the hook would see.
        attention_sub, position = architecture.attention
        attention_path = f"{path}.{attention_sub}"
        module = modules.get(attention_sub)
        if module is not None:
            def on_attention(_module: Any, _args: Any, output: Any) -> None:
                probs = output[position] if isinstance(output, (tuple, list)) and len(output) > position else None
                if probs is not None:
                    values, dtype = to_numpy(probs)
                    # A large one on a device analysed there (then one copy of the results);
                    # the others by the writer, in host memory, with the batch's other
                    # attention tensors.
                    rows = attention_rows(probs) if analysed_on_device(probs) else None
                    writer.attention(values, index, attention_sub, attention_path,
                                     wants("attention", attention_sub, attention_path, index), dtype=dtype,
                                     rows=rows)

            handles.append(module.register_forward_hook(on_attention))
    for stage, (sub, which) in architecture.stages.items():
        module = modules.get(sub)
        if module is None:
            raise ValueError(f"model_trace.torch: {path} has no submodule {sub!r} (stage {stage!r})")
        handles.append(_stage_hook(writer, module, stage, which, index, f"{path}.{sub}", wants))
    handles.append(block.register_forward_hook(post))
    return handles


class _Captures:
    """The captured tensors of a trace (the port's), by (pass, layer, stage), found through the
    layer events' ``capture`` pointers as the Rust side finds them."""

    def __init__(self, path: str):
        import os

        self.path = path
        self.directory = os.path.dirname(os.path.abspath(path))
        self.captures: Dict[Tuple[int, int, str], Dict[str, str]] = {}
        _, events = read_trace(path)
        for event in events:
            if event.get("event") != "layer":
                continue
            for stage in event["stages"]:
                capture = stage["tensor"].get("capture")
                if capture:
                    self.captures.setdefault((event["pass"], event["layer"], stage["name"]), capture)
        if not self.captures:
            raise ValueError(f"{path} holds no captured layer tensors to replay: write it with "
                             "MODEL_TRACE_CAPTURE=layer:* (or capture=\"layer:*\")")

    def values(self, pass_index: int, layer: int, stage: str) -> np.ndarray:
        import os

        from safetensors import safe_open

        capture = self.captures.get((pass_index, layer, stage))
        if capture is None:
            raise ValueError(f"isolate: {self.path} has no capture of pass {pass_index}, layer {layer}, {stage}")
        with safe_open(os.path.join(self.directory, capture["file"]), framework="np") as file:
            return file.get_tensor(capture["tensor"])

    def feed(self, writer: TraceWriter, layer: int, hidden: Any, args: Tuple[Any, ...],
             kwargs: Dict[str, Any]) -> Tuple[Any, Tuple[Tuple[Any, ...], Dict[str, Any]]]:
        """The layer's input replaced by the capture (same element count, the layer's own
        shape, dtype and device), the event written, and the hook's new (args, kwargs)."""
        import torch

        pass_index = writer._ensure_pass()
        replayed = self.values(pass_index, layer, "input")
        if replayed.size != hidden.numel():
            raise ValueError(f"isolate: pass {pass_index}, layer {layer}: the capture holds {replayed.size} values, "
                             f"the input {hidden.numel()} (shape {tuple(hidden.shape)})")
        before = hidden.detach().to(torch.float32).cpu().numpy()
        new = torch.from_numpy(np.ascontiguousarray(replayed, dtype=np.float32)).reshape(hidden.shape)
        new = new.to(dtype=hidden.dtype, device=hidden.device)
        source = f"{self.path} p{pass_index}.l{layer}.input"
        writer.intervention("input", f"stage=input replace({self.path})", before,
                            new.detach().to(torch.float32).cpu().numpy(), source=source)
        if args:
            return new, ((new,) + tuple(args[1:]), kwargs)
        return new, (args, {**kwargs, "hidden_states": new})


class _Submodules:
    """A block's submodules by their path in it, looked up among the model's (a module shared
    with an earlier place is listed there only once: then among the block's own)."""

    def __init__(self, block: Any, path: str, all_modules: Dict[str, Any]):
        self.block, self.path, self.all_modules = block, path, all_modules
        self.own: Optional[Dict[str, Any]] = None

    def get(self, relative: str) -> Any:
        found = self.all_modules.get(f"{self.path}.{relative}" if relative else self.path)
        if found is None:
            if self.own is None:
                self.own = dict(self.block.named_modules())
            found = self.own.get(relative)
        return found


def _stage_hook(writer: TraceWriter, module: Any, stage: str, which: str, index: int, path: str,
                wants: Any) -> Any:
    if which == "input":
        def on_input(_module: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
            hidden = args[0] if args else kwargs.get("hidden_states")
            if hidden is not None:
                values, dtype = to_numpy(hidden)
                writer.stage(stage, values, wants("tensor", stage, path, index), dtype)

        return module.register_forward_pre_hook(on_input, with_kwargs=True)

    def on_output(_module: Any, _args: Any, output: Any) -> None:
        values, dtype = to_numpy(first_tensor(output))
        writer.stage(stage, values, wants("tensor", stage, path, index), dtype)

    return module.register_forward_hook(on_output)
