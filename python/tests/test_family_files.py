"""The family files of ``model_trace.families`` (no torch needed): each declares what its
docstring in the package promises, a new family is one new file, and the Rust runtime's
``model-trace diff --map`` presets are what the family files give."""

import difflib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from model_trace import families, llama_cpp
from model_trace.families import name_maps

PACKAGE = Path(families.__file__).resolve().parents[1]
TRACE_FORMAT = PACKAGE.parents[1] / "docs" / "trace-format.md"


def first_cells(text, header):
    """The first cell of each row of the Markdown table whose header row starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(line.split("|")[1])
    return rows


def test_the_trace_format_tables_name_every_family_and_llama_cpp_architecture():
    """docs/trace-format.md's tables are written by hand: a family file added without its rows
    (the stage table, and the llama.cpp table for a graph of its own) fails here."""
    text = TRACE_FORMAT.read_text(encoding="utf-8")
    stage_rows = first_cells(text, "| family (transformers block class) |")
    documented = {word for cell in stage_rows for word in re.findall(r"[a-z][a-z0-9_]*", cell)}
    missing = [families.family_name(f) for f in families.FAMILY_FILES if families.family_name(f) not in documented]
    assert not missing, f"{TRACE_FORMAT}: the stage table has no row for {missing}"
    graph_rows = first_cells(text, "| architecture (`general.architecture`")
    assert {re.match(r"\s*`([^`]+)`", cell).group(1) for cell in graph_rows} == set(families.TABLES)


def test_the_rust_presets_are_what_the_family_files_give():
    wanted = name_maps.rust_source()
    current = name_maps.RUST_PRESETS.read_text(encoding="utf-8")
    diff = "".join(difflib.unified_diff(current.splitlines(True), wanted.splitlines(True), str(name_maps.RUST_PRESETS),
                                        "what the family files give"))
    assert current == wanted, f"run python -m model_trace.families.name_maps:\n{diff}"
    assert name_maps.main(["--check"]) == 0


def test_the_presets_rename_what_the_tracer_records_with_module_names():
    """Each rule's left side is a name a ``names="modules"`` trace of the family records (or a
    debugger leaf), its right side the stage that module gives."""
    llama = name_maps.name_map(families.FAMILY_FILES[0])
    assert families.family_name(families.FAMILY_FILES[0]) == "llama"
    for stage, source in families.LLAMA.stages.items():
        assert f"layer.{{i}}.{name_maps.module_stage(source[0], source[1])} = layer.{{i}}.{stage}\n" in llama
    assert "layer.{i}.post_attention_layernorm:input = layer.{i}.resid_mid\n" in llama
    assert "layer.{i}.mlp.down_proj = layer.{i}.mlp_out\n" in llama
    bert = name_maps.name_map(next(f for f in families.FAMILY_FILES if families.family_name(f) == "bert"))
    # `attention` alone is reserved: BERT's attention module's output is recorded as `attention:output`.
    assert "layer.{i}.attention:output = layer.{i}.resid_mid\n" in bert
    assert "layer.{i}.output.LayerNorm = layer.{i}.output\n" in bert
    assert [families.family_name(f) for f in name_maps.mapped_families()] == ["llama", "bert"]


def test_each_family_file_declares_its_presets_order_and_table():
    orders = [family.ORDER for family in families.FAMILY_FILES]
    assert len(set(orders)) == len(orders) and orders == sorted(orders)
    for family in families.FAMILY_FILES:
        name = families.family_name(family)
        presets = family.ARCHITECTURES
        assert presets and {preset.name for preset in presets} == {name}, name
        # Variants of one class: those with a `when` first, at most one without, last.
        assert all(preset.when for preset in presets[:-1]), name
        declared = [value for value in vars(family).values() if isinstance(value, families.Architecture)]
        assert {id(value) for value in declared} == {id(preset) for preset in presets}, f"{name}: a preset not tried"
        assert family.__doc__ and family.__doc__.strip(), name
        architecture = families.gguf_architecture(family)
        assert architecture is None or architecture in families.TABLES, name
        if hasattr(family, "NODE_TABLE"):
            assert not hasattr(family, "GGUF_ARCHITECTURE"), f"{name}: its own table says its architecture"
    assert families.FAMILIES == tuple(p for f in families.FAMILY_FILES for p in f.ARCHITECTURES)
    assert llama_cpp.TABLES is families.TABLES
    gguf = {families.family_name(f): families.gguf_architecture(f) for f in families.FAMILY_FILES}
    assert gguf["mistral"] == gguf["mixtral"] == "llama" and gguf["qwen2_moe"] == "qwen2moe" and gguf["bert"] is None
    assert families.PRESETS["FALCON_SEQUENTIAL"] is families.FALCON_SEQUENTIAL


NEW_FAMILY = '''"""Phi-9: a made-up family, a copy of qwen2.py."""

from .layouts import NodeTable, llama_like, pre_norm_nodes

ORDER = 45
PHI9 = llama_like("phi9", "Phi9DecoderLayer")
ARCHITECTURES = (PHI9,)
NODE_TABLE = NodeTable("phi9", "embd", pre_norm_nodes())
'''

CHECK = '''
from model_trace import families, llama_cpp
print([a.name for a in families.FAMILIES][3:5], families.PHI9.layer_class, llama_cpp.table_for("phi9").architecture,
      families.choose(["Phi9DecoderLayer"], None) is families.PHI9)
'''


def test_a_new_family_is_one_new_file(tmp_path):
    """A copy of the package with one file added: the presets, the tracer's choice and the
    llama.cpp writer's tables have it, nothing else edited."""
    shutil.copytree(PACKAGE, tmp_path / "model_trace", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "model_trace" / "families" / "phi9.py").write_text(NEW_FAMILY, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['qwen2', 'phi9'] Phi9DecoderLayer phi9 True"


def test_a_module_that_is_no_family_file_is_an_error(tmp_path):
    shutil.copytree(PACKAGE, tmp_path / "model_trace", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "model_trace" / "families" / "helpers.py").write_text("X = 1\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", "import model_trace.families"], capture_output=True, text=True,
                            env=env, cwd=tmp_path)
    assert result.returncode != 0
    assert "helpers.py declares no ORDER or ARCHITECTURES" in result.stderr


@pytest.mark.parametrize("name", ["layouts", "inference", "name_maps"])
def test_the_shared_modules_declare_no_family(name):
    module = __import__(f"model_trace.families.{name}", fromlist=["_"])
    assert name in families.SHARED_MODULES and not hasattr(module, "ARCHITECTURES")
