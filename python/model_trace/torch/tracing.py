"""The tracer: :func:`trace`, the hooks it puts on a model and what they record."""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple, Union

from .. import families, stage_check
from ..families import HEADS_FIRST, Architecture
from ..families.name_maps import module_stage
from ..filter import CaptureFilter, Tracepoint
from ..writer import Pending, TraceWriter
from . import host, routers
from .blocks import Block, Submodules, blocks_of, config_value, first_tensor, output_head, tracepoints
from .first_pass_check import FirstPassCheck
from .host import HostCopy, copied_later
from .inference import Inference
from .isolation import Captures
from .precision import of_model as precision_of


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
    precision: Optional[Dict[str, Any]] = None,
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
    logits: the head's path, ``lm_head``; a mixture-of-experts router, recorded as a ``router``
    event per call (:mod:`model_trace.torch.routers`): its path in the block, ``mlp.gate``); as its function, the module's path in
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

    The header's ``metadata.precision`` (:mod:`model_trace.precision`) says what the model
    computes in, read from it as the trace begins (:func:`model_trace.torch.precision.of_model`):
    ``weights`` the float types of its matrices (``["F32"]``, ``["BF16"]``), ``activations``
    autocast's type where autocast is on, else the weights' type, ``kv_cache`` the activations'
    type for a model that generates, ``source`` ``transformers`` (``torch`` for a module of
    another library). ``precision``: what the model cannot tell, put on top, a key ``None``
    dropping it; for a model loaded from a GGUF (transformers dequantizes it to float),
    ``precision={"dequantized_from": model_trace.gguf_file.weight_types(gguf_path)}``. A
    ``precision`` key of ``metadata`` replaces the whole record.
    """
    # One walk of the module tree: it costs as much as a small model's forward pass.
    modules = dict(model.named_modules())
    inference: Optional[Inference] = None
    if architecture is None:
        architecture = families.choose([type(m).__name__ for m in modules.values()], getattr(model, "config", None))
        if architecture is None:
            inference = Inference.plan(model, modules)
            architecture = inference.placeholder
    if names not in ("stages", "modules"):
        raise ValueError(f"names must be 'stages' or 'modules', not {names!r}")
    captures = CaptureFilter(capture)
    layers = blocks_of(architecture, modules)
    head = output_head(model, modules, architecture)
    meta = _metadata(architecture, getattr(model, "config", None), names, metadata, precision_of(model, precision))
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
    replay = Captures(isolate) if isolate is not None else None
    interventions = [f"stage=input replace({isolate})"] if isolate is not None else []
    writer = TraceWriter(path, config=run_config, metadata=meta, tracepoints=tracepoints(model, layers, architecture),
                         capture=capture, digest=digest, interventions=interventions, isolate=isolate)
    run = Run(writer, model, modules, layers, architecture, names, captures if capture else None,
              record_attention, replay, FirstPassCheck(writer, multiplier) if check_stages else None)
    run.hook_model(head, recorded_logits)
    for index, block_path, block in layers:
        run.hook_layer(index, block_path, block, inference if index == layers[0][0] else None)
    try:
        yield writer
    finally:
        run.remove()
        writer.close()
    if run.check is not None and inference is None and run.check.passed([index for index, _, _ in layers]):
        _PASSED.setdefault(model, set()).add(checked_key)


def _metadata(architecture: Architecture, config: Any, names: str, metadata: Optional[Dict[str, Any]],
              precision: Dict[str, Any]) -> Dict[str, Any]:
    """The header's metadata: ``precision``, and its ``extra`` the architecture's name,
    ``names``, and the config values the architecture asks for (``config_metadata``); the
    caller's ``metadata`` joined to it (a caller's ``extra`` keys join the tracer's, theirs
    winning; its other keys replace the tracer's)."""
    extra: Dict[str, str] = {"architecture": architecture.name, "names": names}
    for key in architecture.config_metadata:
        value = config_value(config, key)
        if value is not None:
            extra[key] = repr(float(value)) if isinstance(value, (int, float)) else str(value)
    meta: Dict[str, Any] = {"precision": precision, "extra": extra}
    for key, value in (metadata or {}).items():
        meta[key] = {**extra, **value} if key == "extra" else value
    return meta


def pass_position(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Union[int, Pending]:
    """The position of a pass's first token: ``cache_position[0]``, else the cache's length. A
    CUDA tensor's first value is copied like the tensors (reading it now would wait for the
    device)."""
    cache_position = kwargs.get("cache_position")
    if cache_position is not None:
        first = cache_position.reshape(-1)[:1]
        if copied_later(first):
            return HostCopy(first)
        return int(first[0])
    past = kwargs.get("past_key_values")
    if past is not None and hasattr(past, "get_seq_length"):
        return int(past.get_seq_length())
    return 0


def pass_tokens(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Union[List[int], Pending, None]:
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
    if copied_later(flat):
        return HostCopy(flat)
    return flat.tolist()


def _oriented(tensor: Any, layout: str) -> Any:
    """A stage's tensor as the vocabulary records it: a heads-first one ([batch, heads, seq,
    head_dim]) with its positions before its heads."""
    if layout == HEADS_FIRST and getattr(tensor, "ndim", 0) == 4:
        return tensor.transpose(1, 2).contiguous()
    return tensor


class Run:
    """The hooks of one ``trace`` call and what they share."""

    def __init__(self, writer: TraceWriter, model: Any, modules: Dict[str, Any], layers: List[Block],
                 architecture: Architecture, names: str, captures: Optional[CaptureFilter], record_attention: bool,
                 replay: Optional[Captures], check: Optional[FirstPassCheck]):
        self.writer, self.model, self.modules, self.layers = writer, model, modules, layers
        self.architecture, self.names, self.captures = architecture, names, captures
        self.record_attention, self.replay, self.check = record_attention, replay, check
        self.layer_name = type(layers[0][2]).__name__
        self.handles: List[Any] = []
        self.routers = routers.RouterRecorder(self)
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
        values, dtype = host.to_numpy(tensor)
        self.writer.stage(name, values, self.wants("tensor", name, path, index), dtype)
        if self.check is not None:
            self.check.keep(index, stage, tensor)

    def hook_model(self, head: Optional[str], recorded_logits: bool) -> None:
        """The hooks of the model's forward (a pass: begun before it; its logits recorded and the
        pass ended after it) and of its head (``head``: its path)."""
        model, writer, architecture = self.model, self.writer, self.architecture
        final_layer = max(index for index, _, _ in self.layers) + 1
        head_output: List[Any] = []

        def top_pre(_module: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
            head_output.clear()
            writer.begin_pass(position=pass_position(args, kwargs), function=type(model).__name__,
                              tokens=pass_tokens(args, kwargs))

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
                    values, dtype = host.to_numpy(logits)
                    writer.logits(values, final_layer, name, name, self.wants("logits", name, name, final_layer),
                                  dtype=dtype)
            writer.end_pass()

        self.handles.append(model.register_forward_pre_hook(top_pre, with_kwargs=True))
        self.handles.append(model.register_forward_hook(top_post))
        head_module = self.modules.get(head) if head is not None else None
        if recorded_logits and head_module is not None:
            def on_head(_module: Any, _args: Any, output: Any) -> None:
                head_output.append(first_tensor(output))

            self.handles.append(head_module.register_forward_hook(on_head))

    def hook_layer(self, index: int, path: str, block: Any, inference: Optional[Inference]) -> None:
        writer, check = self.writer, self.check

        def pre(_module: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
            writer.begin_layer(index, self.layer_name, path)
            hidden = args[0] if args else kwargs.get("hidden_states")
            changed = None
            if hidden is not None and self.replay is not None:
                hidden, changed = self.replay.feed(writer, index, hidden, args, kwargs)
            if hidden is not None:
                values, dtype = host.to_numpy(hidden)
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
            values, dtype = host.to_numpy(hidden)
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
        modules = Submodules(block, path, self.modules)
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
        router = architecture.router
        module = modules.get(router.module) if router is not None else None
        if module is not None:  # a dense layer of a model with both has none
            self.handles.append(module.register_forward_hook(
                self.routers.hook(router, module, index, f"{path}.{router.module}")))

    def _attention_hook(self, index: int, attention_sub: str, attention_path: str, position: int) -> Any:
        def on_attention(_module: Any, _args: Any, output: Any) -> None:
            self.record_attention_output(index, attention_sub, attention_path, position, output)

        return on_attention

    def record_attention_output(self, index: int, attention_sub: str, attention_path: str, position: int,
                                output: Any) -> None:
        probs = output[position] if isinstance(output, (tuple, list)) and len(output) > position else None
        if probs is not None:
            values, dtype = host.to_numpy(probs)
            rows = host.device_attention_rows(probs)
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
