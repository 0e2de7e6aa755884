"""Shared helpers: where the repository is, and running its Rust examples."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: A folder of the workspace's binaries, built once by the suite's compiled-in test step with every
#: feature they need (``scripts/test`` sets it): the tests run them as they are, so that no test
#: builds Rust again. Unset, a test builds what it runs with ``cargo run`` (a developer running
#: pytest alone).
BINARIES = os.environ.get("MODEL_TRACE_BINARIES")

#: package -> the binary that ``cargo run -p PACKAGE`` runs.
DEFAULT_BINARY = {"trace-cli": "model-trace"}


def rust_command(package: str, args=(), features=None, binary=None) -> list:
    """The command that runs BINARY (by default the package's own) of PACKAGE, built with
    FEATURES, on ARGS: the prebuilt binary in ``MODEL_TRACE_BINARIES`` when it is set, else
    ``cargo run``. The prebuilt binaries have every feature the tests use (``trace``, and
    ``wgpu`` for the burn port)."""
    default = DEFAULT_BINARY.get(package, package)
    binary = binary or default
    if BINARIES:
        path = Path(BINARIES) / binary
        if not path.is_file():
            pytest.fail(f"MODEL_TRACE_BINARIES={BINARIES} has no {binary} (of {package}): the suite's "
                        "test step builds it")
        return [str(path), *map(str, args)]
    command = ["cargo", "run", "--quiet", "-p", package]
    if features:
        command += ["--features", features]
    if binary != default:
        command += ["--bin", binary]
    return [*command, "--", *map(str, args)]


def model_trace_cli(*args) -> list:
    """The ``model-trace`` command line (trace-cli) with ARGS."""
    return rust_command("trace-cli", args)


def run_example(package: str, args, cwd: Path, env=None, features="trace", check=True) -> subprocess.CompletedProcess:
    """Runs PACKAGE's binary built with FEATURES on ARGS (``rust_command``) from the repository root; the
    trace-related environment of the caller is not passed on, so the run is what ARGS (and
    ``env``, added to it: ``{"MODEL_TRACE_ISOLATE": ...}``) say. A failure fails the test,
    unless ``check`` is false (then the caller reads ``returncode``)."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("MODEL_TRACE") or k == "MODEL_TRACE_MODELS"}
    env = {**inherited, **(env or {})}
    command = rust_command(package, args, features=features)
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    if check and result.returncode != 0:
        pytest.fail(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


@pytest.fixture(scope="session")
def smollm_trace(tmp_path_factory):
    """A trace of the SmolLM2 example at the full level, 3 passes, with the tensors of layers 0
    to 3 captured (shared by the tests that read a Rust trace)."""
    out = tmp_path_factory.mktemp("smollm") / "smollm.ndjson"
    run_example(
        "smollm",
        ["--max-tokens", "3", "--trace-out", str(out), "--capture", "layer:*,tensor:*,attention:*,logits:*,pass=0..2,layer=0..3",
         "The capital of France is"],
        cwd=out.parent,
    )
    return out


def reference(script, *args):
    """Runs ``python/examples/SCRIPT ARGS`` (a reference of our examples); its stdout."""
    command = [sys.executable, str(REPO / "python" / "examples" / script), *map(str, args)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


#: Long enough for RoPE of another base to show (on the 5 tokens of "The capital of France is" it
#: moves layer 21's attention by less than the port's own error).
LONG_PROMPT = ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is "
               "named after the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to "
               "1889. The capital of France is")


@pytest.fixture(scope="session")
def smollm_long_prompt(tmp_path_factory):
    """The prompt pass of ``LONG_PROMPT`` by our SmolLM2 (``ours.ndjson``) and by transformers on
    the same ids (``ref.ndjson``), both captured (shared by the isolation and llama.cpp tests)."""
    directory = tmp_path_factory.mktemp("smollm-long-prompt")
    ours = directory / "ours.ndjson"
    run_example("smollm", ["--max-tokens", "1", "--trace-out", str(ours), "--capture", "pass=0", LONG_PROMPT],
                cwd=directory)
    reference("smollm_reference.py", "--rust", ours, "--out", directory / "ref.ndjson", "--capture", "pass=0")
    return directory
