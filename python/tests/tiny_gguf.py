"""Tiny random GGUFs of each family llama.cpp's node tables cover, so that llama.cpp runs every
table (``model_trace.llama_cpp.TABLES``) rather than the tests only reading it.

A family's model is transformers' own class from a small random config (2 layers, width 64: its
family file's ``TINY_MODELS``, by default its name as the model type with no fields of its own),
saved with ``save_pretrained`` and converted by llama.cpp's own ``convert_hf_to_gguf.py`` of the
llama.cpp that llama-cpp-python 0.3.36 vendors (so the GGUF's tensor names, shapes and keys are
what llama.cpp expects of that architecture). The converter is taken from that version's sdist
(``pip download``; pip's cache holds it where scripts/python-env built the wheel), only its
converter files extracted, once, into ``$MODEL_TRACE_MODELS/llama-cpp-python-0.3.36-convert``.
There is no tokenizer: the GGUF's vocabulary is llama.cpp's ``none`` type with
``vocab_size`` dummy tokens, and the tests feed token ids.

    python python/tests/tiny_gguf.py CASE...     # makes (once) and prints their GGUFs (a case: llama, falcon_new)
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, Mapping, Sequence, Tuple

from model_trace import families
from model_trace.families import TinyModel

MODELS = Path(os.environ.get("MODEL_TRACE_MODELS", os.path.expanduser("~/.cache/model-trace")))
LLAMA_CPP_PYTHON = "0.3.36"
CONVERTER = MODELS / f"llama-cpp-python-{LLAMA_CPP_PYTHON}-convert"

#: The fields every tiny model's config starts from (a family's ``TinyModel.config`` on top).
SMALL: Dict[str, Any] = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)

#: A case's name -> (its family file, its :class:`~model_trace.families.TinyModel`): every family
#: file's tiny models (``model_trace.families.tiny_models``), so that a new family file is run
#: with no edit here.
CASES: Dict[str, Tuple[ModuleType, TinyModel]] = {
    case: (family, tiny) for family in families.FAMILY_FILES for case, tiny in families.tiny_models(family).items()}


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
    """A small random config of transformers' class for ``case`` (a key of CASES)."""
    from transformers import AutoConfig

    tiny = CASES[case][1]
    return AutoConfig.for_model(tiny.model_type, **{**SMALL, **tiny.config})


def file_name(case: str) -> str:
    """``<case>-<digest>.gguf``: the digest of its model type and fields, so that a family file
    whose tiny model changed gets a new GGUF rather than the cached one."""
    tiny = CASES[case][1]
    fields = json.dumps([tiny.model_type, {**SMALL, **tiny.config}], sort_keys=True)
    return f"{case}-{hashlib.sha256(fields.encode()).hexdigest()[:12]}.gguf"


def cached(cases: Sequence[str]) -> Dict[str, Path]:
    """The tiny GGUF of each of ``cases``, made once (one converter process for those not
    made yet) and kept in ``$MODEL_TRACE_MODELS/tiny-gguf-<transformers version>``: seeded,
    so the same versions give the same files."""
    import transformers

    directory = MODELS / f"tiny-gguf-transformers-{transformers.__version__}-llama-cpp-python-{LLAMA_CPP_PYTHON}"
    paths = {case: directory / file_name(case) for case in cases}
    missing = {case: path for case, path in paths.items() if not path.is_file()}
    if missing:
        directory.mkdir(parents=True, exist_ok=True)
        write(missing)
    return paths


def write(paths: Mapping[str, Path]) -> None:
    """The GGUF of a random model of each case of ``paths`` (case -> where it goes; float32),
    converted in one process; each file renamed into place when whole."""
    import torch
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as staging:
        jobs = []
        for case in paths:
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
        # The converter's process imports this module, so model_trace too: the one this process has.
        package_root = str(Path(families.__file__).resolve().parents[2])
        path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
        result = subprocess.run([sys.executable, __file__, "--convert", *jobs], capture_output=True, text=True,
                                timeout=900, env={**os.environ, "PYTHONPATH": path})
        if result.returncode != 0:
            raise RuntimeError(f"converting random {', '.join(paths)} to GGUF failed:\n{result.stderr[-3000:]}")
        for case, path in paths.items():
            os.replace(Path(staging) / f"{case}.gguf", path)


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
