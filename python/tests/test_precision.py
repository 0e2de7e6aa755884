"""What a run computed in, in the header (``metadata.precision``), from both Python writers; the
GGUF header reader it is read with; llama.cpp's F32 copy of a GGUF (``model_trace.gguf_f32``),
whose weights must be the GGUF's dequantized values and whose trace must say where they came
from.

Cost: the torch cases on random tiny models, under a second (and transformers' import); the F32
copy of SmolLM2's GGUF (515 MiB in the test's temporary folder) 3-8 s, and llama.cpp's 6-token
passes on both files, about a second; the dequantized SmolLM2 port's two runs and diffs, 2 s
(the transformers reference is the session's ``smollm_long_prompt``).
"""

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import model_trace
from model_trace import gguf_file, precision

torch = pytest.importorskip("torch")
llama_cpp = pytest.importorskip("model_trace.llama_cpp")
import model_trace.torch  # noqa: E402
from model_trace.torch.precision import of_model  # noqa: E402

from conftest import LONG_PROMPT  # noqa: E402
from test_llama_cpp import gguf  # noqa: E402

#: Six token ids of SmolLM2's vocabulary (llama.cpp runs any).
IDS = [504, 3458, 282, 4649, 314, 253]


def header_precision(path):
    return model_trace.read_trace(str(path))[0]["metadata"]["precision"]


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    return LlamaForCausalLM(config).eval()


def traced_precision(model, path, **options):
    with torch.no_grad(), model_trace.torch.trace(model, str(path), **options):
        model(torch.tensor([[1, 2, 3]]))
    return header_precision(path)


# -- the torch tracer ---------------------------------------------------------------------------


def test_the_torch_tracer_records_the_types_the_model_computes_in(tmp_path):
    model = tiny_llama()
    trace = tmp_path / "t.ndjson"
    assert traced_precision(model, trace) == {"weights": ["F32"], "activations": "F32", "kv_cache": "F32",
                                              "source": "transformers"}
    model.to(torch.bfloat16)
    assert traced_precision(model, trace) == {"weights": ["BF16"], "activations": "BF16", "kv_cache": "BF16",
                                              "source": "transformers"}
    # Norms kept in F32 are vectors, which do not count (a GGUF's F32 norms do not either).
    for name, parameter in model.named_parameters():
        if "norm" in name:
            parameter.data = parameter.data.float()
    assert of_model(model)["weights"] == ["BF16"]
    # Autocast computes in its own type, whatever the weights.
    model.float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        found = traced_precision(model, trace)
    assert (found["weights"], found["activations"], found["kv_cache"]) == (["F32"], "BF16", "BF16")


def test_what_the_model_cannot_tell_is_given(tmp_path):
    model = tiny_llama()
    trace = tmp_path / "t.ndjson"
    given = {"dequantized_from": ["q4_k", "Q6_K"], "kv_cache": None}
    assert traced_precision(model, trace, precision=given) == {
        "weights": ["F32"], "dequantized_from": ["Q4_K", "Q6_K"], "activations": "F32", "source": "transformers"}
    # metadata's own precision replaces the record.
    assert traced_precision(model, trace, metadata={"precision": {"weights": ["F16"]}}) == {"weights": ["F16"]}
    with pytest.raises(ValueError, match="not 'dequantised_from'"):
        traced_precision(model, trace, precision={"dequantised_from": ["Q4_K"]})


def test_a_model_without_a_cache_or_transformers_says_so():
    from transformers import BertConfig, BertModel

    bert = BertModel(BertConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                num_attention_heads=2))
    assert of_model(bert) == {"weights": ["F32"], "activations": "F32", "source": "transformers"}
    assert of_model(torch.nn.Linear(4, 4).half()) == {"weights": ["F16"], "activations": "F16", "source": "torch"}
    mixed = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4).to(torch.bfloat16))
    assert of_model(mixed) == {"weights": ["BF16", "F32"], "source": "torch"}  # no one activation type


# -- the GGUF reader ---------------------------------------------------------------------------


def test_the_gguf_reader_reads_smollm2s_tensor_table():
    info = gguf_file.read(str(gguf()))
    assert info.version == 3 and info.metadata["general.architecture"] == "llama"
    assert len(info.tensors) == 272 and info.weight_types() == ["Q4_1", "Q8_0"]
    embeddings = info.tensor("token_embd.weight")
    assert (embeddings.shape, embeddings.type) == ((576, 49152), "Q8_0")
    assert info.tensor("blk.0.attn_norm.weight").type == "F32"
    assert info.metadata["tokenizer.ggml.tokens"] is None  # arrays are skipped
    assert info.dequantized_from() == []
    with pytest.raises(KeyError, match="no tensor 'blk.30.attn_q.weight'"):
        info.tensor("blk.30.attn_q.weight")


def test_ggml_type_names_are_the_librarys():
    L = llama_cpp._llama_cpp()
    library = ctypes.CDLL(os.path.join(os.path.dirname(L.__file__), "lib", "libggml-base.so"))
    library.ggml_type_name.restype = ctypes.c_char_p
    library.ggml_type_name.argtypes = [ctypes.c_int]
    for number, name in gguf_file.GGML_TYPES.items():
        assert library.ggml_type_name(number).decode().upper() == name, number
    assert gguf_file.type_name(99) == "GGML_TYPE_99"


def test_a_file_that_is_no_gguf_this_reader_reads_is_refused(tmp_path):
    cases = {"text": b"not a GGUF file", "version 1": b"GGUF\x01\x00\x00\x00" + bytes(16),
             "cut short": gguf().read_bytes()[:4096]}
    messages = {"text": "is not a GGUF file", "version 1": "GGUF version 1", "cut short": "past the end of the file"}
    for case, data in cases.items():
        path = tmp_path / "bad.gguf"
        path.write_bytes(data)
        with pytest.raises(gguf_file.GgufError, match=messages[case]):
            gguf_file.read(str(path))


# -- llama.cpp and its F32 copy -----------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm_f32(tmp_path_factory):
    """SmolLM2's GGUF copied to F32 by ``python -m model_trace.gguf_f32``."""
    out = tmp_path_factory.mktemp("gguf-f32") / "smollm-f32.gguf"
    result = subprocess.run([sys.executable, "-m", "model_trace.gguf_f32", str(gguf()), str(out)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "F32 weights dequantized from Q4_1, Q8_0" in result.stderr
    return out


def test_the_f32_copy_holds_the_ggufs_dequantized_values(smollm_f32):
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize  # what transformers' GGUF loader dequantizes with

    source, copy = gguf_file.read(str(gguf())), gguf_file.read(str(smollm_f32))
    assert copy.weight_types() == ["F32"] and copy.dequantized_from() == ["Q4_1", "Q8_0"]
    assert copy.metadata["general.file_type"] == 0  # LLAMA_FTYPE_ALL_F32
    assert {k: v for k, v in copy.metadata.items() if k not in ("general.file_type", gguf_file.DEQUANTIZED_FROM)} \
        == {k: v for k, v in source.metadata.items() if k != "general.file_type"}
    original, written = (np.memmap(path, np.uint8, "r") for path in (gguf(), smollm_f32))
    for name in ["token_embd.weight", "blk.0.attn_q.weight", "blk.29.ffn_down.weight", "blk.5.ffn_norm.weight"]:
        a, b = source.tensor(name), copy.tensor(name)
        kind = GGMLQuantizationType[a.type]
        block, size = GGML_QUANT_SIZES[kind]
        count = int(np.prod(a.shape))
        expected = dequantize(np.array(original[a.offset:a.offset + count // block * size]), kind).reshape(-1)
        values = np.array(written[b.offset:b.offset + 4 * count]).view(np.float32)
        np.testing.assert_array_equal(values, expected.astype(np.float32), err_msg=name)


def test_llama_cpp_records_its_weights_and_where_an_f32_copy_came_from(smollm_f32, tmp_path):
    quantized, copied = tmp_path / "q.ndjson", tmp_path / "f32.ndjson"
    llama_cpp.run(str(gguf()), [IDS], str(quantized))
    llama_cpp.run(str(smollm_f32), [IDS], str(copied), kv="f32")
    assert header_precision(quantized) == {"weights": ["Q4_1", "Q8_0"], "activations": "F32", "kv_cache": "F16",
                                           "source": "llama.cpp"}
    assert header_precision(copied) == {"weights": ["F32"], "dequantized_from": ["Q4_1", "Q8_0"],
                                        "activations": "F32", "kv_cache": "F32", "source": "llama.cpp"}


def test_the_f32_copy_refuses_to_overwrite_its_source_and_names_a_missing_one(tmp_path):
    from model_trace import gguf_f32

    with pytest.raises(ValueError, match="would overwrite its source"):
        gguf_f32.write_f32(str(gguf()), str(gguf()))
    result = subprocess.run([sys.executable, "-m", "model_trace.gguf_f32", str(tmp_path / "none.gguf"),
                             str(tmp_path / "out.gguf")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "no GGUF file at" in result.stderr
    assert not list(Path(tmp_path).glob("*out.gguf*"))


def test_the_record_is_the_rust_runtimes_shape():
    assert precision.record(["q4_k", "Q6_K"], activations="f32", kv_cache="f16", source="llama.cpp") == {
        "weights": ["Q4_K", "Q6_K"], "activations": "F32", "kv_cache": "F16", "source": "llama.cpp"}
    assert precision.record(["F32"], dequantized_from=[]) == {"weights": ["F32"]}


# -- the dequantized port against transformers --------------------------------------------------


def test_the_dequantized_smollm2_port_agrees_with_transformers_to_float_rounding(smollm_long_prompt):
    """SmolLM2 on its dequantized weights (``--dequantize``) against transformers on the same
    GGUF's: nothing named at 1e-4 of a tensor's RMS over the 57-token prompt, and the RMSNorm
    epsilon misread in layer 7, which a plain diff of the quantized port does not name at the
    10% its own error needs, named there. Two runs of the port, 2 s."""
    from conftest import run_example
    from test_reference_diff import diff, first

    reference = smollm_long_prompt / "ref.ndjson"
    assert header_precision(reference) == {"weights": ["F32"], "dequantized_from": ["Q4_1", "Q8_0"],
                                           "activations": "F32", "kv_cache": "F32", "source": "transformers"}
    for bug, expected in ((None, (0, None)), ("rms-eps@7", (1, (0, 7, "attn_in")))):
        out = smollm_long_prompt / f"dequantized-{bug or 'clean'}.ndjson"
        args = ["--dequantize", "--trace", "full-noquant", "--max-tokens", "1", "--trace-out", str(out),
                "--capture", "pass=0", *(["--inject-bug", bug] if bug else []), LONG_PROMPT]
        run_example("smollm", args, cwd=smollm_long_prompt)
        code, report = diff(reference, out)  # no flags: the headers say F32 against F32
        assert report["tolerance_choice"]["rule"] == "same_float_weights", report["tolerance_choice"]
        assert (code, first(report)) == expected, bug
