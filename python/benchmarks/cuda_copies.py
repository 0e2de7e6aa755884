"""Checks, on a CUDA device, how ``model_trace.torch`` reads device tensors, and times where its
attention analysis should run:

    python python/benchmarks/cuda_copies.py [--device cuda] [--json OUT]

1. A non-blocking copy of a CUDA tensor to the CPU lands in pinned memory (what
   ``model_trace.torch.host.HostCopy`` relies on: a copy into pageable memory would wait).
2. The seeded SmolLM2-shaped model of tracer_overhead.py (float32 and bfloat16): a 16-token
   prefill and 3 decode steps traced three ways, which must give the same trace (the ``*_ns``
   times apart): as the tracer does it (asynchronous copies, read after one synchronisation a
   pass; small attention tensors analysed in host memory), the same again (to tell the GPU's
   own nondeterminism from a difference), and with blocking copies (``.cpu()``, as before).
   Then, for information, with every attention tensor analysed on the device (the tracer
   before ``DEVICE_ANALYSIS_MIN_ELEMENTS``): its attention rows beside the host analysis's.
3. The analysis of one attention tensor on the device (``attention_rows``, which waits for
   its results) and in host memory (``attention_rows_of_many``), by size: where they meet is
   what ``DEVICE_ANALYSIS_MIN_ELEMENTS`` should be.

Exit status 1 when a check fails. ``--device cpu`` runs the same code on the CPU (CPU tensors
taken through the CUDA path, the synchronisation a no-op), to try the script without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List

import numpy as np
import torch
import transformers

import model_trace
import model_trace.torch
from model_trace.attention import attention_rows, attention_rows_of_many
from tracer_overhead import CASES, on_device


def timeless(path: str) -> List[Dict[str, Any]]:
    return [{k: v for k, v in e.items() if not k.endswith("_ns")} for e in model_trace.read_trace(path)[1]]


def traced(model: Any, inputs: Dict[str, Any], path: str, steps: int) -> List[Dict[str, Any]]:
    """A prefill and ``steps`` greedy decode steps inside one trace."""
    cache = transformers.DynamicCache(config=model.config)
    ids = inputs["input_ids"]
    with torch.no_grad(), model_trace.torch.trace(model, path):
        logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits
        for step in range(steps):
            token = logits[:, -1].argmax(-1, keepdim=True)
            position = torch.tensor([[ids.shape[1] + step]], device=ids.device)
            logits = model(input_ids=token, past_key_values=cache, position_ids=position, use_cache=True).logits
    return timeless(path)


def differences(a: List[Dict[str, Any]], b: List[Dict[str, Any]]) -> List[str]:
    found = []
    if len(a) != len(b):
        found.append(f"{len(a)} events against {len(b)}")
    for x, y in zip(a, b):
        if x != y:
            keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
            found.append(f"{x.get('event')} seq {x.get('seq')} layer {x.get('layer')}: {keys}")
    return found


def rows_compared(a: List[Dict[str, Any]], b: List[Dict[str, Any]]) -> Dict[str, Any]:
    """How the attention rows of two traces of the same passes differ, number by number."""
    same = differ = 0
    worst = 0.0
    for x, y in zip(a, b):
        if x.get("event") != "attention":
            continue
        for r, s in zip(x["rows"], y["rows"]):
            for key in ("top_k_positions", "top_k_weights", "tail_mass", "entropy", "sink_weight"):
                u, v = r[key], s[key]
                if u == v:
                    same += 1
                else:
                    differ += 1
                    if key in ("tail_mass", "entropy"):
                        worst = max(worst, abs(float(u) - float(v)) / max(abs(float(u)), 1e-30))
    return {"same": same, "different": differ, "largest_relative_difference": worst}


def check_traces(device: torch.device, dtype: torch.dtype, directory: str) -> Dict[str, Any]:
    _, build, _ = CASES["smollm"]
    model, inputs = on_device(build, device, dtype)
    path = os.path.join(directory, "t.ndjson")
    module = model_trace.torch
    copies, threshold = module.ASYNC_COPY_DEVICES, module.DEVICE_ANALYSIS_MIN_ELEMENTS
    if device.type == "cpu":
        module.ASYNC_COPY_DEVICES = ("cpu",)
        module._SYNCHRONIZERS[device] = lambda: None
    result: Dict[str, Any] = {}
    try:
        asynchronous = traced(model, inputs, path, 3)
        again = traced(model, inputs, path, 3)
        module.ASYNC_COPY_DEVICES = ()
        blocking = traced(model, inputs, path, 3)
        module.DEVICE_ANALYSIS_MIN_ELEMENTS = 0
        on_the_device = traced(model, inputs, path, 3)
    finally:
        module.ASYNC_COPY_DEVICES, module.DEVICE_ANALYSIS_MIN_ELEMENTS = copies, threshold
    result["events"] = len(asynchronous)
    result["deterministic"] = not differences(asynchronous, again)
    result["async_vs_blocking"] = differences(asynchronous, blocking)[:10]
    result["rows_host_vs_device"] = rows_compared(blocking, on_the_device)
    # Everything but the attention rows is the same whichever analysis made them.
    strip = [[{k: v for k, v in e.items() if k != "rows"} for e in t] for t in (blocking, on_the_device)]
    result["device_analysis_changes_only_rows"] = not differences(*strip)
    result["ok"] = result["deterministic"] and not result["async_vs_blocking"] and result["device_analysis_changes_only_rows"]
    return result


def median_time(run: Any, repeats: int = 15) -> float:
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def analysis_times(device: torch.device) -> List[Dict[str, Any]]:
    """One attention tensor's analysis on the device and in host memory, by size."""
    made = []
    for heads, queries, keys in ((9, 1, 17), (9, 16, 16), (9, 64, 64), (9, 96, 96), (9, 128, 128), (9, 256, 256),
                                 (9, 512, 512)):
        scores = torch.randn(1, heads, queries, keys, generator=torch.Generator().manual_seed(0))
        probs = torch.softmax(scores, dim=-1)
        on_device_ = probs.to(device)
        host = probs.numpy()
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        sync()
        device_s = median_time(lambda: attention_rows(on_device_))
        host_s = median_time(lambda: attention_rows_of_many([host]))
        made.append({"shape": [1, heads, queries, keys], "elements": probs.numel(),
                     "device_ms": device_s * 1e3, "host_ms": host_s * 1e3})
        print(f"  {probs.numel():8d} elements: on the device {device_s * 1e3:7.3f} ms, in host memory {host_s * 1e3:7.3f} ms",
              flush=True)
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args()
    device = torch.device(args.device)
    report: Dict[str, Any] = {"torch": torch.__version__, "transformers": transformers.__version__,
                              "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    ok = True
    if device.type == "cuda":
        copy = torch.ones(1000, device=device).to("cpu", non_blocking=True)
        torch.cuda.synchronize(device)
        report["non_blocking_copy_is_pinned"] = copy.is_pinned()
        ok &= copy.is_pinned()
        print(f"a non-blocking copy to the CPU is pinned: {copy.is_pinned()}", flush=True)
    with tempfile.TemporaryDirectory() as directory:
        for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
            result = check_traces(device, dtype, directory)
            report[f"traces_{name}"] = result
            ok &= result["ok"]
            print(f"{name}: {json.dumps(result)}", flush=True)
    print("attention analysis of one tensor, medians:", flush=True)
    report["analysis_times"] = analysis_times(device)
    report["ok"] = bool(ok)
    print("cuda_copies:", "ok" if ok else "FAILED", flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
