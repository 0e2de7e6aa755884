"""A trace of one randomly initialised model on a given device, for ``model-trace diff`` to
compare what two devices compute from the same weights and tokens:

    python python/benchmarks/device_traces.py --device cpu --out smollm-cpu.ndjson
    python python/benchmarks/device_traces.py --device cuda --out smollm-cuda.ndjson
    model-trace diff smollm-cpu.ndjson smollm-cuda.ndjson

Cases (``--case``), those of tracer_overhead.py: ``smollm`` (default), the SmolLM2-shaped
``LlamaForCausalLM``'s prefill of 16 tokens; ``minilm-shaped``, the MiniLM-shaped ``BertModel``
on 7 tokens. In float32, eager attention, under ``torch.no_grad()``. The weights come from a
fixed seed on the CPU and are then moved to the device, so they are the same on every device
(of one torch version: its CPU generator makes them). On a GPU, float32 matrix products run as
torch's default has them (no TF32, ``torch.get_float32_matmul_precision()`` is ``highest``):
the trace's metadata records that precision.
"""

from __future__ import annotations

import argparse

import torch

import model_trace.torch
from tracer_overhead import CASES, cpu_name, on_device

TRACED = ("smollm", "minilm-shaped")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], required=True)
    parser.add_argument("--out", required=True, help="the trace file to write")
    parser.add_argument("--case", choices=TRACED, default="smollm")
    args = parser.parse_args()
    label, build, _ = CASES[args.case]
    device = torch.device(args.device)
    model, inputs = on_device(build, device, torch.float32)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    metadata = {
        "model": f"{label} ({type(model).__name__}, seeded random weights)",
        "dtype": "f32",
        # Not in `extra`: the tracer's own keys (the architecture) are there.
        "device": f"{args.device} ({device_name}), torch {torch.__version__}, "
                  f"float32 matmul precision {torch.get_float32_matmul_precision()}",
    }
    with torch.no_grad(), model_trace.torch.trace(model, args.out, metadata=metadata):
        model(**inputs)
    print(f"{label} on {device_name}: {args.out}")


if __name__ == "__main__":
    main()
