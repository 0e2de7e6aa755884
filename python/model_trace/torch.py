"""Trace a PyTorch model with forward hooks: the reference side of ``model-trace diff``.

    import model_trace.torch
    with model_trace.torch.trace(model, "ref.ndjson"):
        model(**inputs)

Every forward call of ``model`` is a pass, which records the ``input_ids`` it consumes (its
``pass_begin`` event's ``tokens``); each transformer block a layer, with its input, its
output and the stages of the stage vocabulary (docs/trace-format.md) in between; attention
probabilities (when the model runs eager attention) and the next-token logits are recorded too.
The families of :mod:`model_trace.families` (Llama, Mistral, Mixtral, Qwen 2/3 and their MoE,
Gemma 1/2/3, Phi-3, OLMo 2, Granite, StarCoder 2, StableLM, Falcon, GPT-2, BERT) are detected from
their block class; the stages of another class are inferred from the first pass, with a warning
that prints the :class:`Architecture` to pass. On the first pass every layer's stages are
checked against the identities their names promise (:mod:`model_trace.stage_check`): a wrong
stage map raises :class:`StageMapError` instead of writing a trace that diffs wrong.
"""

from __future__ import annotations

import contextlib
import functools
import re
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple, Union

import numpy as np

from . import families, stage_check
from .attention import attention_rows
from .families import (BERT, FALCON_NEW_ARCHITECTURE, FALCON_PARALLEL, FALCON_SEQUENTIAL, FAMILIES, GEMMA,  # noqa: F401
                       GEMMA2, GEMMA3, GPT2, GRANITE, HEADS_FIRST, LLAMA, MISTRAL, MIXTRAL, OLMO2, PHI3, QWEN2,
                       QWEN2_MOE, QWEN3, QWEN3_MOE, STABLELM, STABLELM_PARALLEL, STARCODER2, Architecture)
from .families.name_maps import RESERVED, module_names, module_stage  # noqa: F401  (RESERVED, module_names: exported)
from .stage_check import StageMapError
from .filter import CaptureFilter, Tracepoint
from .format import read_trace
from .writer import Pending, TraceWriter, dtype_name


#: Every preset by family name (:data:`model_trace.families.FAMILIES` holds their variants too).
KNOWN = families.known()


def detect(model: Any, modules: Optional[Dict[str, Any]] = None) -> Architecture:
    """The architecture of a transformers model, from the class of its blocks (``modules``:
    ``dict(model.named_modules())`` when the caller has it) and, for a class whose block
    depends on it (Falcon, StableLM), its config. Raises ``ValueError`` for a class no preset
    knows (:func:`trace` infers those)."""
    classes = [type(module).__name__ for module in (modules.values() if modules is not None else model.modules())]
    architecture = families.choose(classes, getattr(model, "config", None))
    if architecture is None:
        raise ValueError(
            "model_trace.torch: unknown architecture (blocks of class "
            f"{sorted({c for c in classes if 'Layer' in c or 'Block' in c})}); pass architecture=Architecture(...)"
        )
    return architecture


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


#: The stage maps that passed the check, per model (weakly keyed: a model's entry goes with it):
#: the keys of :func:`_checked_key`. A later trace of the same model object with the same
#: architecture skips the check, since a stage map is a property of the model's modules, not of
#: its inputs; its header's ``stage_check`` says ``"passed earlier"``. A loop that traces one
#: model many times (causal tracing, benchmarks) pays the check once.
_PASSED: "weakref.WeakKeyDictionary[Any, Set[str]]" = weakref.WeakKeyDictionary()


def _checked_key(architecture: Architecture, residual_multiplier: float) -> str:
    return f"{architecture!r} r={residual_multiplier!r}"


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
    check_stages: bool = True,
) -> Iterator[TraceWriter]:
    """Records every forward call of ``model`` inside the ``with`` block into the trace file at
    ``path`` (replaced if it exists).

    ``architecture``: detected from the model's block class (:data:`model_trace.families.FAMILIES`)
    when not given; a class none of them knows is inferred from the first pass (the first
    block's children, placed by where their values flow, confirmed by the stage check), used
    with a ``UserWarning`` that prints the inferred ``Architecture(...)``, or a ``ValueError``
    naming what could not be placed.
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

    ``check_stages``: on the first pass (pass 0), when each layer ends, its stages are checked
    against the stage identities (``resid_mid = input + attn_out``, ``mlp_in = norm(resid_mid)``,
    ...: :func:`model_trace.stage_check.check_layer`); a failure raises :class:`StageMapError`
    naming the layer, the stage, the identity and its error against the tolerance. The header's
    ``metadata.extra.stage_check`` says ``"first pass"`` (``"off"`` with ``check_stages=False``).
    Once a model's map has passed, later traces of the same model object with the same
    architecture do not check it again (``"passed earlier"``): the map belongs to the model's
    modules, not to its inputs.
    Its cost, on the first pass only: a float32 copy of each stage on its device, read back to
    host memory when its layer ends (a wait for the device, once a layer), and the identities
    in numpy. The yielded writer's ``stage_check`` holds what it found
    (``writer.stage_check.report()``), None when off.
    """
    # One walk of the module tree: it costs as much as a small model's forward pass.
    modules = dict(model.named_modules())
    config = getattr(model, "config", None)
    inference: Optional[_Inference] = None
    if architecture is None:
        architecture = families.choose([type(m).__name__ for m in modules.values()], config)
        if architecture is None:
            inference = _Inference.plan(model, modules)
            architecture = inference.placeholder
    if names not in ("stages", "modules"):
        raise ValueError(f"names must be 'stages' or 'modules', not {names!r}")
    captures = CaptureFilter(capture)
    layers = _layers(architecture, modules)
    final_layer = max(index for index, _, _ in layers) + 1
    head = _output_head(model, modules, architecture)
    extra: Dict[str, str] = {"architecture": architecture.name, "names": names}
    for key in architecture.config_metadata:
        value = _config_value(config, key)
        if value is not None:
            extra[key] = repr(float(value)) if isinstance(value, (int, float)) else str(value)
    meta: Dict[str, Any] = {"extra": extra}
    for key, value in (metadata or {}).items():
        # A caller's extra keys join the tracer's (theirs win, but for whether the check runs).
        meta[key] = {**extra, **value} if key == "extra" else value
    multiplier = stage_check.parse_multiplier(meta["extra"].get("residual_multiplier"))
    checked_key = _checked_key(architecture, multiplier)
    passed_earlier = check_stages and inference is None and checked_key in _PASSED.get(model, ())
    check_stages = check_stages and not passed_earlier
    meta["extra"]["stage_check"] = "passed earlier" if passed_earlier else "first pass" if check_stages else "off"
    recorded_logits = record_logits and (head is not None or architecture.logits is not None)
    run_config = {
        "trace_activations": True,
        "trace_attention": record_attention and (architecture.attention is not None or inference is not None),
        "trace_logits": recorded_logits,
        "trace_quant_error": False,
        "trace_kv_cache": False,
        "digests": "always" if digest else "off",
    }
    replay = _Captures(isolate) if isolate is not None else None
    interventions = [f"stage=input replace({isolate})"] if isolate is not None else []
    writer = TraceWriter(path, config=run_config, metadata=meta, tracepoints=_tracepoints(model, layers, architecture),
                         capture=capture, digest=digest, interventions=interventions, isolate=isolate)
    run = _Run(writer, model, modules, layers, architecture, names, captures if capture else None,
               record_attention, replay, _FirstPassCheck(writer, multiplier) if check_stages else None)
    head_output: List[Any] = []

    def top_pre(_module: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        head_output.clear()
        writer.begin_pass(position=_position(args, kwargs), function=type(model).__name__,
                          tokens=_token_ids(args, kwargs))

    def top_post(_module: Any, _args: Any, output: Any) -> None:
        if recorded_logits:
            # What the model returns: Gemma 2's soft-capped, Granite's scaled logits (the head's
            # own output only where the model returns no `logits`).
            logits = getattr(output, "logits", None) if not isinstance(output, (tuple, list)) else None
            if logits is None and head_output:
                logits = head_output[-1]
            if logits is not None:
                if logits.ndim == 3:
                    logits = logits[:, -1, :]  # the next-token logits, as the Rust examples record them
                name = architecture.logits or head or "logits"
                values, dtype = to_numpy(logits)
                writer.logits(values, final_layer, name, name, run.wants("logits", name, name, final_layer),
                              dtype=dtype)
        writer.end_pass()

    run.handles.append(model.register_forward_pre_hook(top_pre, with_kwargs=True))
    run.handles.append(model.register_forward_hook(top_post))
    head_module = modules.get(head) if head is not None else None
    if recorded_logits and head_module is not None:
        def on_head(_module: Any, _args: Any, output: Any) -> None:
            head_output.append(first_tensor(output))

        run.handles.append(head_module.register_forward_hook(on_head))
    for index, block_path, block in layers:
        run.hook_layer(index, block_path, block, inference if index == layers[0][0] else None)
    try:
        yield writer
    finally:
        run.remove()
        writer.close()
    check = run.check
    # Passed: every layer checked (pass 0 ran to its end) and nothing failed.
    if check is not None and inference is None and check.outcomes \
            and {outcome.layer for outcome in check.outcomes} >= {index for index, _, _ in layers} \
            and all(outcome.passed for outcome in check.outcomes):
        _PASSED.setdefault(model, set()).add(checked_key)


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


def _layers(architecture: Architecture, modules: Dict[str, Any]) -> List[Tuple[int, str, Any]]:
    """The blocks (index, path, module) the architecture's pattern and class select; an error
    that says which of the two selected nothing."""
    pattern = re.compile(architecture.layers)
    matched = [(int(m.group(1)), name, module) for name, module in modules.items() if (m := pattern.match(name))]
    layers = [layer for layer in matched
              if architecture.layer_class is None or type(layer[2]).__name__ == architecture.layer_class]
    if layers:
        return layers
    if matched:
        classes = sorted({type(module).__name__ for _, _, module in matched})
        raise ValueError(f"model_trace.torch: {len(matched)} modules match the layer pattern {architecture.layers} "
                         f"of the {architecture.name!r} architecture but are of class {', '.join(classes)}, not "
                         f"{architecture.layer_class}: the architecture is not this model's (leave architecture= out to "
                         "detect it, or give an Architecture with layer_class=" f"{classes[0]!r})")
    raise ValueError(f"model_trace.torch: no module matches the layer pattern {architecture.layers} of the "
                     f"{architecture.name!r} architecture")


def _output_head(model: Any, modules: Dict[str, Any], architecture: Architecture) -> Optional[str]:
    """The path of the module whose output is the logits: the architecture's, else the model's
    output embeddings (transformers' ``get_output_embeddings``), else None."""
    if architecture.logits is not None:
        return architecture.logits
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if head is None:
        return None
    return next((name for name, module in modules.items() if module is head), None)


def _config_value(config: Any, key: str) -> Any:
    """A config attribute, looked up in the text config too (a multimodal model's)."""
    for candidate in (config, getattr(config, "get_text_config", lambda: None)()):
        if candidate is not None and hasattr(candidate, key):
            return getattr(candidate, key)
    return None


def _tracepoints(model: Any, layers: List[Tuple[int, str, Any]], architecture: Architecture) -> List[Dict[str, Any]]:
    tracepoints = [{"kind": "model", "name": "forward", "function": type(model).__name__, "file": "", "line": 0}]
    tracepoints += [{"kind": "layer", "name": type(layers[0][2]).__name__, "function": name, "file": "", "line": 0}
                    for _, name, _ in layers[:1]]
    tracepoints += [{"kind": "tensor", "name": stage, "function": source[0], "file": "", "line": 0}
                    for stage, source in architecture.stages.items()]
    return tracepoints


class _FirstPassCheck:
    """The stage check on the first pass (pass 0): each stage's tensor copied when it is
    recorded (float32, on its device: a module may change its output in place later, as
    Falcon's MLP output is), the layer checked when it ends (its copies then read back to host
    memory and dropped), a failure raised as :class:`StageMapError`. Later passes cost nothing."""

    def __init__(self, writer: TraceWriter, residual_multiplier: float):
        self.writer = writer
        self.residual_multiplier = residual_multiplier
        self.layers: Dict[int, Dict[str, Any]] = {}
        self.outcomes: List[stage_check.Outcome] = []

    def active(self) -> bool:
        return self.writer.pass_index == 0

    def keep(self, layer: int, stage: str, tensor: Any) -> None:
        import torch

        if isinstance(tensor, torch.Tensor) and self.active():
            self.layers.setdefault(layer, {})[stage] = tensor.detach().to(torch.float32, copy=True)

    def finish(self, layer: int, path: str) -> None:
        kept = self.layers.pop(layer, None)
        if kept is None or not self.active():
            return
        values = {stage: tensor.cpu().numpy() for stage, tensor in kept.items()}
        outcomes = stage_check.check_layer(values, layer, self.residual_multiplier)
        self.outcomes += outcomes
        failures = [o for o in outcomes if not o.passed]
        if failures:
            raise StageMapError(failures, f"model_trace.torch: pass 0, layer {layer} ({path})")

    def report(self) -> stage_check.Report:
        return stage_check.Report(list(self.outcomes))


def _oriented(tensor: Any, layout: str) -> Any:
    """A stage's tensor as the vocabulary records it: a heads-first one ([batch, heads, seq,
    head_dim]) with its positions before its heads."""
    if layout == HEADS_FIRST and getattr(tensor, "ndim", 0) == 4:
        return tensor.transpose(1, 2).contiguous()
    return tensor


class _Run:
    """The hooks of one ``trace`` call and what they share."""

    def __init__(self, writer: TraceWriter, model: Any, modules: Dict[str, Any], layers: List[Tuple[int, str, Any]],
                 architecture: Architecture, names: str, captures: Optional[CaptureFilter], record_attention: bool,
                 replay: Optional["_Captures"], check: Optional[_FirstPassCheck]):
        self.writer, self.model, self.modules, self.layers = writer, model, modules, layers
        self.architecture, self.names, self.captures = architecture, names, captures
        self.record_attention, self.replay, self.check = record_attention, replay, check
        self.layer_name = type(layers[0][2]).__name__
        self.handles: List[Any] = []
        writer.stage_check = check

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def wants(self, kind: str, name: str, function: str, layer: Optional[int]) -> bool:
        if self.captures is None:
            return False
        tracepoint = Tracepoint(kind, name, function=function, module=type(self.model).__name__)
        return self.captures.captures(tracepoint, self.writer.pass_index, layer)

    def recorded_name(self, stage: str, source: Tuple[str, ...]) -> str:
        return module_stage(source[0], source[1]) if self.names == "modules" else stage

    def record_stage(self, index: int, stage: str, source: Tuple[str, ...], path: str, tensor: Any) -> None:
        """One stage's tensor (as its module gave it) written, and kept for the check."""
        tensor = _oriented(tensor, source[2] if len(source) > 2 else "")
        if tensor is None:
            return
        name = self.recorded_name(stage, source)
        values, dtype = to_numpy(tensor)
        self.writer.stage(name, values, self.wants("tensor", name, path, index), dtype)
        if self.check is not None:
            self.check.keep(index, stage, tensor)

    def hook_layer(self, index: int, path: str, block: Any, inference: Optional["_Inference"]) -> None:
        writer, check = self.writer, self.check

        def pre(_module: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
            writer.begin_layer(index, self.layer_name, path)
            hidden = args[0] if args else kwargs.get("hidden_states")
            changed = None
            if hidden is not None and self.replay is not None:
                hidden, changed = self.replay.feed(writer, index, hidden, args, kwargs)
            if hidden is not None:
                values, dtype = to_numpy(hidden)
                writer.stage("input", values, self.wants("layer", self.layer_name, path, index), dtype)
                if check is not None:
                    check.keep(index, "input", hidden)
                if inference is not None and inference.pending():
                    inference.block_input = hidden.detach().to("cpu", dtype=_float32()).numpy().copy()
            return changed

        def post(_module: Any, _args: Any, output: Any) -> None:
            hidden = first_tensor(output)
            if inference is not None and inference.pending():
                self.architecture = inference.infer(self, index, path, hidden)
                for other_index, other_path, other_block in self.layers:
                    self.hook_stages(other_index, other_path, other_block)
            values, dtype = to_numpy(hidden)
            writer.stage("output", values, self.wants("layer", self.layer_name, path, index), dtype)
            if check is not None:
                check.keep(index, "output", hidden)
            writer.end_layer()
            if check is not None:
                check.finish(index, path)

        self.handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
        if inference is not None:
            inference.record_children(self, block)
        else:
            self.hook_stages(index, path, block)
        self.handles.append(block.register_forward_hook(post))

    def hook_stages(self, index: int, path: str, block: Any) -> None:
        """The hooks of a block's attention probabilities and stages."""
        modules = _Submodules(block, path, self.modules)
        architecture = self.architecture
        # The probabilities before the stages: a hook on the same module (Llama's self_attn gives
        # both) must record them first, as they were computed first.
        if self.record_attention and architecture.attention is not None:
            attention_sub, position = architecture.attention
            module = modules.get(attention_sub)
            if module is not None:
                self.handles.append(module.register_forward_hook(
                    self._attention_hook(index, attention_sub, f"{path}.{attention_sub}", position)))
        for stage, source in architecture.stages.items():
            module = modules.get(source[0])
            if module is None:
                raise ValueError(f"model_trace.torch: {path} has no submodule {source[0]!r} (stage {stage!r} of the "
                                 f"{architecture.name!r} architecture)")
            self.handles.append(self._stage_hook(module, stage, source, index, f"{path}.{source[0]}"))

    def _attention_hook(self, index: int, attention_sub: str, attention_path: str, position: int) -> Any:
        def on_attention(_module: Any, _args: Any, output: Any) -> None:
            self.record_attention_output(index, attention_sub, attention_path, position, output)

        return on_attention

    def record_attention_output(self, index: int, attention_sub: str, attention_path: str, position: int,
                                output: Any) -> None:
        probs = output[position] if isinstance(output, (tuple, list)) and len(output) > position else None
        if probs is not None:
            values, dtype = to_numpy(probs)
            # A large one on a device analysed there (then one copy of the results); the others
            # by the writer, in host memory, with the batch's other attention tensors.
            rows = attention_rows(probs) if analysed_on_device(probs) else None
            self.writer.attention(values, index, attention_sub, attention_path,
                                  self.wants("attention", attention_sub, attention_path, index), dtype=dtype,
                                  rows=rows)

    def _stage_hook(self, module: Any, stage: str, source: Tuple[str, ...], index: int, path: str) -> Any:
        if source[1] == "input":
            def on_input(_module: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
                hidden = args[0] if args else kwargs.get("hidden_states")
                if hidden is not None:
                    self.record_stage(index, stage, source, path, hidden)

            return module.register_forward_pre_hook(on_input, with_kwargs=True)

        def on_output(_module: Any, _args: Any, output: Any) -> None:
            self.record_stage(index, stage, source, path, first_tensor(output))

        return module.register_forward_hook(on_output)


def _float32() -> Any:
    import torch

    return torch.float32


class _Inference:
    """The stages of a block class no preset knows, inferred on the first pass: the first
    block's children (and its attention's norms) recorded as they are called, placed at the
    block's end (:func:`model_trace.families.infer`), written for that block, then hooked as a
    preset's would be on every block; the header rewritten with the inferred architecture, and
    a warning printing it."""

    def __init__(self, placeholder: Architecture, logits: Optional[str]):
        self.placeholder = placeholder
        self.logits = logits
        self.calls: List[Dict[str, Any]] = []
        self.ticks = 0
        self.block_input: Optional[np.ndarray] = None
        self.inferred: Optional[Architecture] = None
        self.recording: List[Any] = []

    @classmethod
    def plan(cls, model: Any, modules: Dict[str, Any]) -> "_Inference":
        """The blocks: the longest list of modules of one class that hold an attention module;
        an error naming the block classes seen when there is none."""
        import torch

        best: Optional[Tuple[str, Any]] = None
        for name, module in modules.items():
            if not isinstance(module, torch.nn.ModuleList) or len(module) == 0:
                continue
            classes = {type(child) for child in module}
            if len(classes) != 1:
                continue
            first = module[0]
            if not any(families.kind_of(child_name, type(child).__name__) == families.ATTENTION
                       for child_name, child in first.named_children()):
                continue
            if best is None or len(module) > len(best[1]):
                best = (name, module)
        if best is None:
            classes = sorted({type(m).__name__ for m in modules.values() if "Layer" in type(m).__name__
                              or "Block" in type(m).__name__})
            raise ValueError("model_trace.torch: unknown architecture (blocks of class "
                             f"{classes}), and no list of blocks with an attention submodule to infer the stages from; "
                             "pass architecture=Architecture(...)")
        path, blocks = best
        layer_class = type(blocks[0]).__name__
        pattern = "^" + re.escape(path) + r"\.(\d+)$"
        get = getattr(model, "get_output_embeddings", None)
        head = get() if callable(get) else None
        logits = next((name for name, module in modules.items() if module is head), None) if head is not None else None
        placeholder = Architecture(name=f"inferred:{layer_class}", layers=pattern, layer_class=layer_class,
                                   logits=logits)
        return cls(placeholder, logits)

    def pending(self) -> bool:
        return self.inferred is None

    def record_children(self, run: _Run, block: Any) -> None:
        """Hooks on the block's children and its attention's norms, recording each call: its
        input and output (float32 copies on their device), when it started and returned."""
        attention_children = [(f"{name}.{sub}", module) for name, child in block.named_children()
                              if families.kind_of(name, type(child).__name__) == families.ATTENTION
                              for sub, module in child.named_children()
                              if families.kind_of(sub, type(module).__name__) == families.NORM]
        for name, child in list(block.named_children()) + attention_children:
            def pre(_module: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], name: str = name) -> None:
                if self.pending():
                    hidden = args[0] if args else kwargs.get("hidden_states")
                    self.calls.append({"path": name, "input": _kept(hidden), "started": self.clock()})

            def post(module: Any, _args: Any, output: Any, name: str = name) -> None:
                if not self.pending():
                    return
                call = next(c for c in reversed(self.calls) if c["path"] == name and "finished" not in c)
                call.update(output=_kept(first_tensor(output)), raw=output, finished=self.clock(),
                            class_name=type(module).__name__)

            self.recording.append(child.register_forward_pre_hook(pre, with_kwargs=True))
            self.recording.append(child.register_forward_hook(post))
        run.handles += self.recording

    def clock(self) -> int:
        self.ticks += 1
        return self.ticks

    def infer(self, run: _Run, index: int, path: str, output: Any) -> Architecture:
        """The architecture from the first block's recorded calls; its stages written for this
        block (in the order the hooks would have written them), the recording hooks removed, the
        header rewritten, a warning."""
        import warnings

        for handle in self.recording:
            handle.remove()
        block_input = self.block_input
        seq = block_input.shape[1] if block_input is not None and block_input.ndim >= 2 else None
        calls = []
        for call in self.calls:
            if "finished" not in call:
                continue  # a call that never returned
            hidden_out = call["output"]
            layout = ""
            if hidden_out is not None and hidden_out.ndim == 4 and seq is not None \
                    and hidden_out.shape[2] == seq and hidden_out.shape[1] != seq:
                layout = HEADS_FIRST
            calls.append(families.Call(call["path"], call["class_name"], _host(call["input"]), _host(hidden_out),
                                       call["started"], call["finished"], layout))
        by_path = {call["path"]: call for call in self.calls if "finished" in call}
        multiplier = run.check.residual_multiplier if run.check is not None else 1.0
        architecture = families.infer(self.placeholder.layer_class or "", self.placeholder.layers, calls,
                                      block_input if block_input is not None else np.zeros(0),
                                      _host(_kept(output)), logits=self.logits, residual_multiplier=multiplier)
        self.inferred = architecture
        self.calls = []
        # This block's attention probabilities and stages, as the hooks would have recorded them.
        if run.record_attention and architecture.attention is not None:
            sub, position = architecture.attention
            if sub in by_path:
                run.record_attention_output(index, sub, f"{path}.{sub}", position, by_path[sub]["raw"])
        for stage, source in architecture.stages.items():
            call = by_path[source[0]]
            run.record_stage(index, stage, source, f"{path}.{source[0]}",
                             call["input"] if source[1] == "input" else call["output"])
        run.writer.rewrite_header(_tracepoints(run.model, run.layers, architecture), {"architecture": architecture.name})
        warnings.warn(f"model_trace.torch: blocks of class {architecture.layer_class} are of no known family; the "
                      f"stages inferred from the first pass (they satisfy the stage check on layer {index}) are, to "
                      f"pass as architecture= (from model_trace.families import Architecture):\n"
                      f"{families.architecture_source(architecture)}", stacklevel=2)
        return architecture


def _kept(tensor: Any) -> Any:
    """A copy of a tensor on its device, in its dtype (None for anything else)."""
    import torch

    if not isinstance(tensor, torch.Tensor):
        return None
    return tensor.detach().clone()


def _host(tensor: Any) -> Optional[np.ndarray]:
    """A kept tensor's values as float32 in host memory (a wait for its device)."""
    import torch

    return None if tensor is None else tensor.to(torch.float32).cpu().numpy()


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

        pass_index = writer.ensure_pass()
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
