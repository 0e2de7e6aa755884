"""The DuckDB queries of the README ("Querying traces with DuckDB"), taken from the README itself
and run on a trace of the SmolLM2 example (3 passes, 30 layers of 9 heads)."""

import math
import re
import shutil

import pytest

import model_trace

from conftest import REPO

duckdb = pytest.importorskip("duckdb")

LAYERS, HEADS = 30, 9


def readme_queries():
    """The ```sql blocks of the README's DuckDB section, in order."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    start = readme.index("## Querying traces with DuckDB")
    end = readme.index("\n## ", start + 1)
    return re.findall(r"```sql\n(.*?)```", readme[start:end], re.S)


@pytest.fixture(scope="module")
def run(smollm_trace):
    """Runs a README query on the example's trace: rows as dicts."""
    connection = duckdb.connect()

    def run(sql, source="smollm.ndjson", path=smollm_trace):
        assert f"'{source}'" in sql, f"the README's query does not read {source}"
        sql = sql.replace(f"'{source}'", f"'{path}'")
        result = connection.execute(sql)
        names = [column[0] for column in result.description]
        return [dict(zip(names, row)) for row in result.fetchall()]

    return run


@pytest.fixture(scope="module")
def passes(smollm_trace):
    _, events = model_trace.read_trace(str(smollm_trace))
    return sum(1 for e in events if e["event"] == "pass_begin")


def test_the_readme_has_the_four_queries():
    assert len(readme_queries()) == 4


def test_worst_layers_by_l2_norm(run, passes):
    rows = run(readme_queries()[0])
    assert sorted(r["layer"] for r in rows) == list(range(LAYERS))
    assert all(r["passes"] == passes for r in rows)
    norms = [r["max_l2"] for r in rows]
    assert all(math.isfinite(n) and n > 0 for n in norms)
    assert norms == sorted(norms, reverse=True)
    assert all(r["mean_l2"] <= r["max_l2"] * (1 + 1e-6) for r in rows)


def test_quantization_snr_by_layer(run, passes):
    rows = run(readme_queries()[1])
    assert [r["layer"] for r in rows] == list(range(LAYERS + 1))  # the output head is layer 30
    for row in rows[:LAYERS]:
        assert row["quant"] == "Q4_1" and row["matmuls"] == 7 * passes, row
    assert rows[LAYERS]["quant"] == "Q8_0" and rows[LAYERS]["matmuls"] == passes
    for row in rows:
        assert math.isfinite(row["min_snr_db"]) and 10 < row["min_snr_db"] <= row["median_snr_db"] < 100, row
        assert 0.99 < row["min_cosine"] <= 1.0, row


def test_attention_sinks_per_layer(run):
    rows = run(readme_queries()[2])
    assert [r["layer"] for r in rows] == list(range(LAYERS))
    assert all(r["heads"] == HEADS and 0 <= r["sink_heads"] <= HEADS for r in rows)
    assert all(0.0 <= r["mean_sink_weight"] <= 1.0 for r in rows)
    # SmolLM2's first-token sinks: most heads, but not in every layer
    sinks = [r["sink_heads"] for r in rows]
    assert sum(sinks) > LAYERS * HEADS // 2
    assert min(sinks) < HEADS // 2 < max(sinks)


def test_a_fleet_of_traces(run, smollm_trace, tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    for name in ("a.ndjson", "b.ndjson"):
        shutil.copy(smollm_trace, runs / name)
    rows = run(readme_queries()[3], source="runs/*.ndjson", path=f"{runs}/*.ndjson")
    assert [r["filename"].rsplit("/", 1)[-1] for r in rows] == ["a.ndjson", "b.ndjson"]
    _, events = model_trace.read_trace(str(smollm_trace))
    layer_calls = sum(1 for e in events if e["event"] == "layer")
    assert all(r["layer_calls"] == layer_calls and r["passes"] == 3 for r in rows)
