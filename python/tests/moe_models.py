"""The small random mixture-of-experts models the routing tests run on both sides (transformers
and llama.cpp) and the candle port reads: no small MoE weights are packaged where we can fetch
them, so transformers' own classes make them from a fixed seed.

Two models (``CASES``):

- ``qwen3_moe``: transformers' ``Qwen3MoeForCausalLM``: 4 layers, width 64, 4 heads of 16 (2 KV
  heads), vocabulary 256; every layer a mixture of 8 experts (width 32), top-2 by
  ``softmax(logits)``, the two weights renormalised (``norm_topk_prob``). llama.cpp runs it as
  ``qwen3moe`` (which always renormalises: GGUF does not store ``norm_topk_prob``).
- ``deepseek_v3``: transformers' ``DeepseekV3ForCausalLM``: 4 layers, width 64, MLA attention
  (4 heads; ``q_lora_rank`` 32, ``kv_lora_rank`` 32, ``qk_nope_head_dim`` 16,
  ``qk_rope_head_dim`` 8, ``v_head_dim`` 16, interleaved RoPE), layer 0 dense
  (``first_k_dense_replace`` 1), layers 1-3 a mixture of 16 routed experts (width 32) and one
  shared expert: scores ``sigmoid(logits)``, experts chosen by the scores plus
  ``e_score_correction_bias`` among the 2 best of 4 groups of 4 consecutive experts
  (``n_group`` 4, ``topk_group`` 2; a group scored by its two best), top-4, the four weights
  (unbiased sigmoid scores) renormalised and multiplied by ``routed_scaling_factor`` 2.5.
  config.json also carries ``scoring_func: "sigmoid"`` and ``topk_method: "noaux_tc"`` as
  DeepSeek's own config does: transformers ignores them, llama.cpp's converter reads
  ``scoring_func`` into ``deepseek2.expert_gating_func`` (2, sigmoid; without it llama.cpp
  takes softmax). llama.cpp runs it as ``deepseek2``.

The weights are transformers' random initialisation (``torch.manual_seed(0)``), the norms'
weights moved off 1 (``+ 0.1·N(0, 1)``) so that a norm is not an identity, and then the routers
set so that the routing means something (seeded generator, :func:`shape_routers`):

- each router's weight is redrawn as ``N(0, 1) · ROUTER_SCALE / sqrt(width)`` so that the router
  logits spread by about ``ROUTER_SCALE`` (transformers' own init, std 0.02, gives logits of
  ~0.1 where almost every choice is close);
- in one layer (``NEAR_TIE_LAYER``) two experts' router rows are made almost equal (the second is
  the first plus ``N(0, NEAR_TIE_EPS)``): their logits then differ by ~1e-5 for every token, so
  the tokens where they are the weakest chosen and the runner-up are near-ties, whose choice a
  float error can flip;
- DeepSeek-V3's ``e_score_correction_bias`` is drawn as ``N(0, BIAS_SCALE)`` (its init is zeros)
  so that the bias changes some choices (the tests count how many).

A model's directory (:func:`cached`, ``$MODEL_TRACE_MODELS/moe-models-transformers-<version>-
llama-cpp-python-0.3.36/<case>-<digest of the config and of this recipe>/``) holds exactly:

- ``config.json``: transformers' config (``save_pretrained``);
- ``generation_config.json``: written by ``save_pretrained`` (not read by the tests);
- ``model.safetensors``: every weight in float32, under transformers 5's names
  (``model.layers.N.mlp.gate.weight`` the router ``[experts, width]``;
  ``model.layers.N.mlp.gate.e_score_correction_bias`` ``[experts]`` for DeepSeek-V3; each
  expert on its own, ``model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight``, as transformers
  5.23's ``save_pretrained`` writes them back from its fused experts; DeepSeek-V3's
  ``model.layers.N.mlp.shared_experts.{gate,up,down}_proj.weight`` and layer 0's dense
  ``model.layers.0.mlp.{gate,up,down}_proj.weight``);
- ``<case>.gguf``: the same model converted by llama.cpp's own ``convert_hf_to_gguf.py``
  (llama-cpp-python 0.3.36's, :func:`tiny_gguf.converter`) to F32, with llama.cpp's ``none``
  vocabulary of 256 dummy tokens: there is no tokenizer, feed token ids.

The same versions give the same bytes (made twice into two folders: every file identical).
llama.cpp (llama-cpp-python 0.3.36, f32 KV cache) loads both GGUFs and its logits of 24 tokens
are within 4e-4 of transformers' (logits' std 0.16). Made once (~15 s):

    python python/tests/moe_models.py qwen3_moe deepseek_v3   # prints each case's directory
    python python/tests/moe_models.py --measure   # their margins over 64 tokens, the bias's effect
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Mapping, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_gguf  # noqa: E402  (the converter and the models' folder)

#: The fields of each case's transformers config (its ``model_type`` first).
CONFIGS: Dict[str, Dict[str, Any]] = {
    "qwen3_moe": dict(
        model_type="qwen3_moe", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False),
    "deepseek_v3": dict(
        model_type="deepseek_v3", vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
        q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        n_routed_experts=16, n_shared_experts=1, num_experts_per_tok=4, moe_intermediate_size=32,
        n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1,
        tie_word_embeddings=False, scoring_func="sigmoid", topk_method="noaux_tc"),
}

#: Router logits spread by about this much (the routers' weights' scale times ``sqrt(width)``).
ROUTER_SCALE = 1.5
#: The layer where two experts' router rows are made almost equal, and how far apart they are.
NEAR_TIE_LAYER = 2
NEAR_TIE_EPS = 2e-6
#: The spread of DeepSeek-V3's selection bias.
BIAS_SCALE = 0.1
#: Bumped when the recipe (the steps of :func:`make`) changes, so that the cache is remade.
RECIPE = 1

CASES = tuple(CONFIGS)

DIRECTORY = (tiny_gguf.MODELS / "moe-models-transformers-{transformers}-llama-cpp-python-"
             f"{tiny_gguf.LLAMA_CPP_PYTHON}")


def config(case: str):
    """transformers' config of ``case``."""
    from transformers import AutoConfig

    fields = dict(CONFIGS[case])
    return AutoConfig.for_model(fields.pop("model_type"), **fields)


def digest(case: str) -> str:
    """12 hex digits of the case's config fields and of this module's recipe constants."""
    recipe = [CONFIGS[case], ROUTER_SCALE, NEAR_TIE_LAYER, NEAR_TIE_EPS, BIAS_SCALE, RECIPE]
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def gguf(directory: Path) -> Path:
    """The GGUF in a case's directory."""
    return directory / f"{directory.name.rsplit('-', 1)[0]}.gguf"


def cached(cases: Sequence[str] = CASES) -> Dict[str, Path]:
    """Each case's directory (see the module's docstring), made once."""
    import transformers

    unknown = [case for case in cases if case not in CONFIGS]
    if unknown:
        raise ValueError(f"no MoE test model {', '.join(unknown)}: the cases are {', '.join(CASES)}")
    root = Path(str(DIRECTORY).format(transformers=transformers.__version__))
    directories = {case: root / f"{case}-{digest(case)}" for case in cases}
    missing = {case: d for case, d in directories.items() if not gguf(d).is_file()}
    if missing:
        root.mkdir(parents=True, exist_ok=True)
        make(missing)
    return directories


def make(directories: Mapping[str, Path]) -> None:
    """Writes each case's directory: the transformers model, then its GGUF (one converter
    process); each directory renamed into place when whole."""
    with tempfile.TemporaryDirectory(dir=next(iter(directories.values())).parent, prefix=".moe-") as staging:
        jobs = []
        for case, directory in directories.items():
            model = random_model(case)
            staged = Path(staging) / directory.name
            model.save_pretrained(staged)
            jobs += [str(staged), str(gguf(staged))]
        package_root = str(Path(tiny_gguf.families.__file__).resolve().parents[2])
        path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
        result = subprocess.run([sys.executable, tiny_gguf.__file__, "--convert", *jobs], capture_output=True,
                                text=True, timeout=900, env={**os.environ, "PYTHONPATH": path})
        if result.returncode != 0:
            raise RuntimeError(f"converting {', '.join(directories)} to GGUF failed:\n{result.stderr[-3000:]}")
        for case, directory in directories.items():
            if directory.exists():
                shutil.rmtree(directory)
            os.replace(Path(staging) / directory.name, directory)


def random_model(case: str):
    """transformers' model of ``case``: seeded random weights, norms off 1, routers shaped."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config(case), dtype=torch.float32)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.add_(0.1 * torch.randn_like(parameter))
    shape_routers(model)
    return model.eval()


def routers(model) -> Dict[int, Any]:
    """Layer -> its router module (``mlp.gate``), for the layers that have one."""
    return {i: layer.mlp.gate for i, layer in enumerate(model.model.layers)
            if hasattr(getattr(layer.mlp, "gate", None), "top_k")}


def shape_routers(model) -> None:
    """The routers' weights (and DeepSeek-V3's selection bias) as the module's docstring says."""
    import torch

    generator = torch.Generator().manual_seed(44)
    with torch.no_grad():
        for layer, router in routers(model).items():
            experts, width = router.weight.shape
            router.weight.copy_(torch.randn(experts, width, generator=generator) * ROUTER_SCALE / width ** 0.5)
            if layer == NEAR_TIE_LAYER:
                router.weight[1].copy_(router.weight[0] + NEAR_TIE_EPS * torch.randn(width, generator=generator))
            bias = getattr(router, "e_score_correction_bias", None)
            if bias is not None:
                bias.copy_(BIAS_SCALE * torch.randn(experts, generator=generator))
                if layer == NEAR_TIE_LAYER:
                    bias[1] = bias[0]


def grouped_choice(logits: Any, bias: Any, groups: int, top_groups: int, k: int) -> Any:
    """DeepSeek-V3's choice in numpy, each row's experts sorted: sigmoid scores plus ``bias``,
    the best ``top_groups`` groups by the sum of their two best, the top ``k`` among them (the
    other groups masked with ``-inf``, as transformers and llama.cpp do)."""
    import numpy as np

    scores = 1.0 / (1.0 + np.exp(-np.asarray(logits, dtype=np.float64))) + bias
    by_group = scores.reshape(len(scores), groups, -1)
    group_scores = np.sort(by_group, axis=-1)[..., -2:].sum(-1)
    best_groups = np.argsort(-group_scores, axis=-1, kind="stable")[:, :top_groups]
    mask = np.full(by_group.shape, -np.inf)
    np.put_along_axis(mask, best_groups[..., None], 0.0, axis=1)
    masked = (by_group + mask).reshape(len(scores), -1)
    return np.sort(np.argsort(-masked, axis=-1, kind="stable")[:, :k], axis=-1)


def measure(tokens: int = 64) -> None:
    """Prints, for each case, the distribution of transformers' ``logit_margin`` over
    ``tokens`` token ids (``(37 i + 11) mod 256``) and every MoE layer, and for DeepSeek-V3 how
    many tokens' choices the selection bias changes (the same logits chosen with a zero bias)."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from model_trace.routing import routing_record

    ids = torch.tensor([[(37 * i + 11) % 256 for i in range(tokens)]])
    for case, directory in cached().items():
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
        outputs: Dict[int, Any] = {}
        hooks = [gate.register_forward_hook(lambda _m, _a, out, layer=layer: outputs.__setitem__(layer, out))
                 for layer, gate in routers(model).items()]
        with torch.no_grad():
            model(ids)
        for hook in hooks:
            hook.remove()
        margins, changed = [], 0
        for layer, (logits, weights, experts) in outputs.items():
            gate = routers(model)[layer]
            bias = getattr(gate, "e_score_correction_bias", None)
            groups = (gate.num_group, gate.topk_group) if hasattr(gate, "num_group") else None
            record = routing_record(logits.numpy(), experts.numpy(), weights.numpy(),
                                    "sigmoid" if bias is not None else "softmax",
                                    None if bias is None else bias.numpy(), groups)
            margins += [t["logit_margin"] for t in record["tokens"]]
            if bias is not None:
                chosen = np.sort(experts.numpy(), axis=-1)
                unbiased = grouped_choice(logits.numpy(), 0.0, gate.num_group, gate.topk_group, gate.top_k)
                changed += int((unbiased != chosen).any(-1).sum())
        values = np.array(margins)
        counts = {f"<{bound:g}": int((values < bound).sum()) for bound in (1e-5, 1e-4, 1e-3, 1e-2, 1e-1)}
        print(f"{case}: {values.size} choices ({tokens} tokens x {len(outputs)} layers); logit_margin quantiles "
              f"1% {np.quantile(values, 0.01):.3g}, 10% {np.quantile(values, 0.1):.3g}, "
              f"median {np.median(values):.3g}, 90% {np.quantile(values, 0.9):.3g}; counts {counts}")
        if changed:
            print(f"{case}: the selection bias changes {changed} of {values.size} choices")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--measure"]:
        measure()
    else:
        for name, folder in cached(sys.argv[1:] or CASES).items():
            print(name, folder)
