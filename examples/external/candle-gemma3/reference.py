"""transformers' Gemma 3 270M on the token ids of a candle-gemma3 trace, traced with every tensor
captured: the reference for ``model-trace diff``.

    CANDLE_DEQUANTIZE_ALL=1 cargo run --release --features trace -- --relations reference --out traces
    python reference.py traces/reference.ndjson --out traces/transformers.ndjson
    model-trace diff traces/transformers.ndjson traces/reference.ndjson

transformers runs on the GGUF's weights dequantized to float32 (model-trace's cached conversion,
``python/tests/gemma3_weights.py``: the numbers candle multiplies by under
``CANDLE_DEQUANTIZE_ALL=1``), eager attention, one pass. Run it with the Python that
``scripts/python-env`` prints (torch, transformers and model_trace installed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPOSITORY / "python" / "tests"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("port", help="the candle-gemma3 trace whose first pass's token ids to run")
    parser.add_argument("--out", required=True, help="the trace file to write")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    import gemma3_weights
    import model_trace.torch
    from model_trace.llama_cpp import passes_of

    ids = passes_of(args.port)[0]
    directory = gemma3_weights.transformers_dir()
    model = AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with torch.no_grad(), model_trace.torch.trace(model, args.out, capture="pass=0"):
        model(input_ids=torch.tensor([ids]), use_cache=False)
    print(f"{len(ids)} tokens through transformers ({directory}): {args.out}")


if __name__ == "__main__":
    main()
