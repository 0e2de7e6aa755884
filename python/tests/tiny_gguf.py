"""Tiny random GGUFs of each family llama.cpp's node tables cover, so that llama.cpp runs every
table (``model_trace.llama_cpp.TABLES``) rather than the tests only reading it.

A family's model is transformers' own class from a small random config (2 layers, width 64),
saved with ``save_pretrained`` and converted by llama.cpp's own ``convert_hf_to_gguf.py`` of the
llama.cpp that llama-cpp-python 0.3.36 vendors (so the GGUF's tensor names, shapes and keys are
what llama.cpp expects of that architecture). The converter is taken from that version's sdist
(``pip download``; pip's cache holds it where scripts/python-env built the wheel), only its
converter files extracted, once, into ``$MODEL_TRACE_MODELS/llama-cpp-python-0.3.36-convert``.
There is no tokenizer: the GGUF's vocabulary is llama.cpp's ``none`` type with
``vocab_size`` dummy tokens, and the tests feed token ids.

    python python/tests/tiny_gguf.py MODEL_TYPE...     # makes (once) and prints their GGUFs
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any, Dict, Sequence

MODELS = Path(os.environ.get("MODEL_TRACE_MODELS", os.path.expanduser("~/.cache/model-trace")))
LLAMA_CPP_PYTHON = "0.3.36"
CONVERTER = MODELS / f"llama-cpp-python-{LLAMA_CPP_PYTHON}-convert"

_SMALL: Dict[str, Any] = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)

#: A case's name (transformers' model_type, or a variant of it: ``falcon_new``) -> its small
#: config's fields (on top of _SMALL, but for GPT-2).
CONFIGS: Dict[str, Dict[str, Any]] = {
    "llama": {},
    "mistral": {"sliding_window": None},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2": {},
    "qwen2_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "shared_expert_intermediate_size": 64, "decoder_sparse_step": 1, "mlp_only_layers": []},
    "qwen3": {"head_dim": 16},
    "qwen3_moe": {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "decoder_sparse_step": 1, "mlp_only_layers": []},
    "gemma": {"head_dim": 16},
    "gemma2": {"head_dim": 16, "sliding_window": 64},
    "gemma3_text": {"head_dim": 16, "sliding_window": 64, "layer_types": ["sliding_attention", "full_attention"]},
    "phi3": {"pad_token_id": 0},
    "olmo2": {},
    "granite": {"residual_multiplier": 0.5, "embedding_multiplier": 3.0, "logits_scaling": 2.0,
                "attention_multiplier": 0.25},
    "starcoder2": {"use_bias": True},
    "stablelm": {},
    "falcon": {"num_key_value_heads": 1, "num_kv_heads": 1, "new_decoder_architecture": False, "parallel_attn": True,
               "multi_query": True, "alibi": False,
               "bias": False},
    # Falcon 40B's layout: ln_attn and ln_mlp, grouped KV heads, parallel.
    "falcon_new": {"num_kv_heads": 2, "new_decoder_architecture": True, "parallel_attn": True, "alibi": False,
                   "bias": False},
    "gpt2": {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 128, "n_ctx": 128},
}


def converter() -> Path:
    """The directory holding ``convert_hf_to_gguf.py``, ``conversion/`` and ``gguf-py/`` of the
    vendored llama.cpp, extracted once from the sdist."""
    if (CONVERTER / "convert_hf_to_gguf.py").is_file():
        return CONVERTER
    CONVERTER.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CONVERTER.parent, prefix=".convert-") as staging:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
                        "llama-cpp-python", f"llama-cpp-python=={LLAMA_CPP_PYTHON}", "-d", staging], check=True)
        sdist = next(Path(staging).glob("llama_cpp_python-*.tar.gz"))
        prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/"
        wanted = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/gguf/")
        target = Path(staging) / "convert"
        # tarfile's extraction filters came with Python 3.11.4 (Debian 12 has 3.11.2): where there
        # are none, only regular files whose path stays inside the target are extracted anyway.
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        with tarfile.open(sdist) as archive:
            for member in archive:
                relative = member.name[len(prefix):] if member.name.startswith(prefix) else None
                if (relative and member.isfile() and relative.startswith(wanted)
                        and ".." not in Path(relative).parts):
                    member.name = relative
                    archive.extract(member, target, **safe)
        if not (CONVERTER / "convert_hf_to_gguf.py").is_file():
            target.rename(CONVERTER)
    return CONVERTER


def config(case: str):
    """A small random config of transformers' class for ``case`` (a key of CONFIGS)."""
    from transformers import AutoConfig

    fields = dict(CONFIGS[case])
    model_type = case.split("_new")[0]
    if model_type != "gpt2":
        fields = {**_SMALL, **fields}
    else:
        fields["vocab_size"] = 256
    return AutoConfig.for_model(model_type, **fields)


def cached(cases: Sequence[str]) -> Dict[str, Path]:
    """The tiny GGUF of each of ``cases``, made once (one converter process for those not
    made yet) and kept in ``$MODEL_TRACE_MODELS/tiny-gguf-<transformers version>``: seeded,
    so the same versions give the same files."""
    import transformers

    directory = MODELS / f"tiny-gguf-transformers-{transformers.__version__}-llama-cpp-python-{LLAMA_CPP_PYTHON}"
    paths = {case: directory / f"{case}.gguf" for case in cases}
    missing = [case for case, path in paths.items() if not path.is_file()]
    if missing:
        directory.mkdir(parents=True, exist_ok=True)
        write(missing, directory)
    return paths


def write(cases: Sequence[str], out: Path) -> None:
    """``OUT/<case>.gguf`` of a random model of each of ``cases`` (float32),
    converted in one process; each file renamed into place when whole."""
    import torch
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as staging:
        jobs = []
        for case in cases:
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(config(case), dtype=torch.float32)
            with torch.no_grad():  # random norms' weights, so that a norm is not an identity
                for name, parameter in model.named_parameters():
                    if "norm" in name or "ln_" in name:
                        parameter.add_(0.1 * torch.randn_like(parameter))
            directory = Path(staging) / case
            model.save_pretrained(directory)
            # Gemma's converter counts the real vocabulary from tokenizer.json to trim the embeddings.
            vocab = model.config.get_text_config().vocab_size
            (directory / "tokenizer.json").write_text(json.dumps(
                {"model": {"vocab": {f"<{i}>": i for i in range(vocab)}}, "added_tokens": []}))
            jobs += [str(directory), str(Path(staging) / f"{case}.gguf")]
        result = subprocess.run([sys.executable, __file__, "--convert", *jobs], capture_output=True, text=True,
                                timeout=900)
        if result.returncode != 0:
            raise RuntimeError(f"converting random {', '.join(cases)} to GGUF failed:\n{result.stderr[-3000:]}")
        for case in cases:
            os.replace(Path(staging) / f"{case}.gguf", out / f"{case}.gguf")


def _convert_all(jobs: Sequence[str]) -> None:
    """Runs the converter on each model directory of ``jobs`` (model directory, GGUF path, ...),
    every model class writing the ``none`` vocabulary with the config's vocabulary size."""
    root = converter()
    sys.path[:0] = [str(root), str(root / "gguf-py")]
    import convert_hf_to_gguf

    def no_vocab(self) -> None:
        self.gguf_writer.add_tokenizer_model("none")
        self.gguf_writer.add_vocab_size(self.hparams.get("vocab_size") or self.hparams["n_vocab"])

    original = convert_hf_to_gguf.get_model_class

    def get_model_class(*args, **kwargs):
        cls = original(*args, **kwargs)
        cls.set_vocab = no_vocab
        return cls

    convert_hf_to_gguf.get_model_class = get_model_class
    for directory, out in zip(jobs[0::2], jobs[1::2]):
        sys.argv = ["convert_hf_to_gguf.py", directory, "--outfile", out, "--outtype", "f32"]
        convert_hf_to_gguf.main()


if __name__ == "__main__":
    if sys.argv[1] == "--convert":
        _convert_all(sys.argv[2:])
    else:
        for case, path in cached(sys.argv[1:]).items():
            print(case, path)
