"""Gemma 3 270M for the tests: the GGUF that ``scripts/fetch-models`` assembles, and a cached
conversion of it that transformers loads in seconds.

transformers reads the GGUF itself (``AutoModelForCausalLM.from_pretrained(directory,
gguf_file=...)``) but dequantizes every tensor in Python: 1.5 to 4.5 minutes here, too long to
pay in every test session. ``save_pretrained`` refuses a model loaded from a GGUF, so the
conversion is a plain state-dict save: ``config.json`` and ``model.safetensors`` (float32; the
tied ``lm_head.weight`` left out, as transformers ties it again on load). When it converts, it
checks that the saved model gives bit-identical logits to the GGUF-loaded one on a prompt, and
refuses to cache it otherwise. The cache lives beside the GGUF, keyed by the GGUF's SHA-256
(``$MODEL_TRACE_MODELS/gemma3_270m/transformers-<first 16 hex digits>``), written into a
temporary directory and renamed into place, so an interrupted conversion is never taken for a
finished one.

    python python/tests/gemma3_weights.py      # converts once (prints the cache directory)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

MODELS = Path(os.environ.get("MODEL_TRACE_MODELS", os.path.expanduser("~/.cache/model-trace")))
GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
GGUF = MODELS / "gemma3_270m" / GGUF_NAME
#: The assembled file's pinned hash (GEMMA3_SHA256 in scripts/fetch-models).
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

#: "The capital of France is" in Gemma 3's vocabulary (BOS first), and the 8 tokens transformers
#: chooses greedily after it (" the capital of the country of France.").
PROMPT = "The capital of France is"
PROMPT_IDS = [2, 818, 5279, 529, 7001, 563]
GREEDY_IDS = [506, 5279, 529, 506, 2891, 529, 7001, 236761]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def gguf() -> Path:
    """The GGUF; an AssertionError naming the fetch script where it is missing."""
    assert GGUF.is_file(), f"{GGUF} is missing: scripts/fetch-models fetches and assembles it"
    return GGUF


def transformers_dir() -> Path:
    """The cached conversion's directory (``AutoModelForCausalLM.from_pretrained`` loads it),
    converted from the GGUF on first use."""
    digest = sha256_of(gguf())
    if digest != GGUF_SHA256:
        raise AssertionError(f"{GGUF} has SHA-256 {digest}, not {GGUF_SHA256}: fetch it again "
                             "(delete it, then scripts/fetch-models)")
    target = GGUF.parent / f"transformers-{digest[:16]}"
    if (target / "model.safetensors").is_file():
        return target
    staging = Path(tempfile.mkdtemp(prefix=".convert-", dir=GGUF.parent))
    try:
        _convert(staging)
        if not (target / "model.safetensors").is_file():  # another process may have finished first
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return target


def _convert(directory: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(GGUF.parent), gguf_file=GGUF_NAME, dtype=torch.float32)
    model.eval()
    state = model.state_dict()
    tied = model.config.get_text_config().tie_word_embeddings
    if tied:
        # One tensor under two names: safetensors refuses to save shared storage.
        assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()
        del state["lm_head.weight"]
    save_file({name: tensor.contiguous() for name, tensor in state.items()}, str(directory / "model.safetensors"),
              metadata={"format": "pt"})
    model.config.save_pretrained(str(directory))
    reloaded = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)
    reloaded.eval()
    ids = torch.tensor([PROMPT_IDS])
    with torch.no_grad():
        expected, actual = model(ids).logits, reloaded(ids).logits
    if not torch.equal(expected, actual):
        raise AssertionError("the saved state dict does not load back to the same logits "
                             f"(max |difference| {float((expected - actual).abs().max()):g}); nothing cached")


if __name__ == "__main__":
    print(transformers_dir())
    sys.exit(0)
