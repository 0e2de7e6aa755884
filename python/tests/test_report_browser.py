"""`model-trace report` in a real browser: Debian's headless Chromium, driven by Playwright.

The page of a SmolLM2 trace (logit lens on) compared with its PyTorch reference must load with
no console error and no request leaving the file, and every section must draw something: each
plot's screenshot is checked for content (not compared with a golden image, which fonts and
browser versions would break). The controls are tried too: another pass, another head. The
floor's plots (`--floor`) are drawn from small traces the Python writer makes, with known errors,
and the experts' load heat map from router events written beside them as the format says.
"""

import io
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, model_trace_cli, run_example

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    if os.environ.get("MODEL_TRACE_REQUIRE_BROWSER"):
        raise RuntimeError("MODEL_TRACE_REQUIRE_BROWSER is set but no chromium is installed (apt-get install chromium)")
    pytest.skip("no chromium on PATH: apt-get install chromium to run the browser tests", allow_module_level=True)

from PIL import Image  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

from model_trace.writer import TraceWriter  # noqa: E402

#: Each section and the plots in it that must show something.
SECTIONS = {
    "layers": ["#layers-plot"],
    "passes": ["#passes-plot"],
    "attention": ["#attention-grid", "#attention-entropy", "#attention-pattern"],
    "logits": ["#logits-plot"],
    "quantization": ["#quant-snr", "#quant-cosine"],
    "kv": ["#kv-positions", "#kv-memory"],
    "time": ["#time-layers", "#time-passes"],
    "diff": ["#diff-layers", "#diff-passes"],
}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    directory = tmp_path_factory.mktemp("report")
    ours, ref, page = directory / "smollm.ndjson", directory / "ref.ndjson", directory / "report.html"
    run_example("smollm", ["--max-tokens", "8", "--logit-lens", "--trace-out", str(ours), "The capital of France is"],
                cwd=directory)
    subprocess.run([sys.executable, str(REPO / "python" / "examples" / "smollm_reference.py"), "--rust", str(ours),
                    "--out", str(ref)], check=True, capture_output=True, timeout=1800)
    result = subprocess.run(model_trace_cli("report", ours, "--against", ref,
                                             "--check-error-stat", "norm", "--rtol", "0.1", "-o", page),
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "no divergence" in result.stdout, result.stdout
    return page


def drawn(png: bytes) -> tuple[float, int]:
    """The share of pixels that are not background, and how many distinct colours there are."""
    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).reshape(-1, 3).astype(int)
    colours, counts = np.unique(pixels, axis=0, return_counts=True)
    background = colours[counts.argmax()]
    ink = (np.abs(pixels - background).sum(axis=1) > 60).mean()
    return float(ink), len(colours)


def assert_drawn(page, plot):
    """The element ``plot`` (a selector) has a real size and something drawn in it."""
    element = page.locator(plot)
    element.scroll_into_view_if_needed()
    box = element.bounding_box()
    assert box and box["width"] > 100 and box["height"] > 60, (plot, box)
    ink, colours = drawn(element.screenshot())
    assert ink > 0.01 and colours > 8, f"{plot} looks blank: {ink:.3%} drawn, {colours} colours"


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


def open_page(browser, path):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems, requests = [], []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("request", lambda r: requests.append(r.url))
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    return page, problems, requests


def test_the_report_loads_cleanly_and_every_section_draws(report, browser):
    size = report.stat().st_size
    assert size < 2_000_000, f"{size} bytes"
    page, problems, requests = open_page(browser, report)
    assert problems == []
    assert [u for u in requests if not u.startswith(("file:", "data:"))] == [], "the page must need no network"
    toc = page.locator("#toc a").all_inner_texts()
    assert len(toc) == len(SECTIONS), toc
    for section, plots in SECTIONS.items():
        assert page.locator(f"section#{section}").count() == 1, f"no section {section}"
        for plot in plots:
            assert_drawn(page, plot)
    assert page.locator("#diff-verdict").inner_text().startswith("no divergence")
    # The reference, fed this trace's tokens, may choose another one where two were nearly tied
    # (it did at pass 5 in CI): the page must say so, and call it a near-tie, not a divergence.
    first_token = page.locator("#diff-first-token")
    if first_token.count():
        text = first_token.inner_text()
        assert "a near-tie" in text and first_token.get_attribute("class") == "ok", text
    words = re.findall(r"\b(?:null|undefined|NaN|\[object \w+\])", page.locator("body").inner_text())
    assert words == [], "a script value leaked into the page's text"
    assert problems == []


def test_the_controls_redraw(report, browser):
    page, problems, _ = open_page(browser, report)
    plot = page.locator("#layers-plot")
    before = plot.screenshot()
    page.locator("#layers select").nth(1).select_option(index=3)  # pass 3
    after = plot.screenshot()
    assert before != after
    # another head: its pattern replaces the first one
    title = page.locator("#attention-pattern h3")
    first = title.inner_text()
    page.locator("#attention-grid rect").nth(0).click()
    assert title.inner_text() != first and title.inner_text().startswith("layer 0 head 0")
    # statistics that are not positive fall back to a linear axis without errors
    page.locator("#layers select").nth(0).select_option(label="mean")
    assert drawn(plot.screenshot())[0] > 0.01
    assert problems == []


#: The floor traces' layers and the stages of each, and the factor of the floor's error allowed.
FLOOR_LAYERS = 6
FLOOR_STAGES = ["input", "attn_out", "mlp_out", "output"]
FLOOR_FACTOR = 2
#: (pass, layer, stage) where this trace's error is past FLOOR_FACTOR times the floor's.
BEYOND_FLOOR = (1, 4, "mlp_out")


def floor_error(p, layer, stage):
    """The floor's relative error: 1e-4 in layer 0's input, doubling with each layer, larger
    for each later stage."""
    return 1e-4 * 2 ** layer * (1 + 0.4 * FLOOR_STAGES.index(stage))


def other_error(p, layer, stage):
    """This trace's: 1.2 to 1.8 times the floor's by stage, 3 times at BEYOND_FLOOR."""
    factor = 3 if (p, layer, stage) == BEYOND_FLOOR else 1.2 + 0.2 * FLOOR_STAGES.index(stage)
    return floor_error(p, layer, stage) * factor


def write_floor_trace(path, error):
    """Two passes of FLOOR_LAYERS layers, each stage's tensor the reference's times 1 ± error
    (the sign alternating by element), every tensor captured."""
    writer = TraceWriter(str(path), capture="*")
    elements = np.arange(64)
    sign = np.where(elements % 2 == 0, 1.0, -1.0)
    for p in range(2):
        writer.begin_pass(p)
        for layer in range(FLOOR_LAYERS):
            writer.begin_layer(layer, "block", "model.block")
            for k, stage in enumerate(FLOOR_STAGES):
                reference = np.sin((elements + 1) * 0.37 + layer + 0.5 * p + k) + 2
                writer.stage(stage, (reference * (1 + sign * error(p, layer, stage))).astype(np.float32), wants_capture=True)
            writer.end_layer()
        writer.end_pass()
    writer.close()


@pytest.fixture(scope="module")
def floor_pages(tmp_path_factory):
    """The report of a trace against its reference with a floor, and without one."""
    directory = tmp_path_factory.mktemp("floor")
    ours, ref, floor = directory / "ours.ndjson", directory / "ref.ndjson", directory / "floor.ndjson"
    write_floor_trace(ref, lambda p, layer, stage: 0.0)
    write_floor_trace(floor, floor_error)
    write_floor_trace(ours, other_error)
    pages = {}
    for name, options in [("floored", ["--floor", str(floor), "--floor-factor", str(FLOOR_FACTOR)]), ("plain", [])]:
        pages[name] = directory / f"{name}.html"
        result = subprocess.run(model_trace_cli("report", ours, "--against", ref,
                                                 *options, "-o", pages[name]), cwd=REPO, capture_output=True, text=True, timeout=600)
        assert result.returncode in (0, 1), result.stderr
        assert pages[name].exists(), result.stderr
    return pages


def svg_lines(page, plot):
    """Each line a plot draws: its colour, its dashes, and how many points it joins."""
    return page.locator(f"{plot} svg path").evaluate_all(
        "paths => paths.map((p) => [p.getAttribute('stroke'), p.getAttribute('stroke-dasharray'),"
        " (p.getAttribute('d').match(/[ML]/g) || []).length])")


def test_the_floor_plots_draw_this_trace_and_the_floor(floor_pages, browser):
    page, problems, requests = open_page(browser, floor_pages["floored"])
    assert problems == []
    assert [u for u in requests if not u.startswith(("file:", "data:"))] == []
    diff = page.evaluate("JSON.parse(document.getElementById('report-data').textContent).diff")
    assert diff["floor"]["factor"] == FLOOR_FACTOR and diff["curve_pass"] == BEYOND_FLOOR[0]
    assert sorted(diff["stages"]) == sorted(FLOOR_STAGES)
    assert page.locator("#diff-verdict").inner_text() == "first divergence: pass 1, layer 4, mlp_out"
    for plot in ["#diff-floor", "#diff-floor-ratio"]:
        assert_drawn(page, plot)
    # The errors: per stage, this trace's line solid and the floor's dashed in the same colour,
    # each through every layer.
    errors = svg_lines(page, "#diff-floor")
    solid = [line for line in errors if line[1] is None]
    dashed = [line for line in errors if line[1] is not None]
    assert len(solid) == len(dashed) == len(FLOOR_STAGES), errors
    assert [line[0] for line in solid] == [line[0] for line in dashed]
    assert len({line[0] for line in solid}) == len(FLOOR_STAGES)
    assert all(line[2] == FLOOR_LAYERS for line in errors), errors
    assert len(set(page.locator("#diff-floor svg path").evaluate_all("ps => ps.map((p) => p.getAttribute('d'))"))) == len(errors)
    legend = page.locator("#diff-floor .legend-row").inner_text()
    assert all(stage in legend for stage in FLOOR_STAGES) and "the floor" in legend
    # The ratio: one solid line a stage through every layer, the red line at y = K, and above
    # it only the point of the tensor past K times the floor's error.
    ratios = svg_lines(page, "#diff-floor-ratio")
    assert [line[1] for line in ratios] == [None] * len(FLOOR_STAGES) and all(line[2] == FLOOR_LAYERS for line in ratios)
    assert [line[0] for line in ratios] == [line[0] for line in solid]
    limit = page.locator("#diff-floor-ratio svg line[stroke='#c62828'][stroke-dasharray='5 4']")
    assert limit.count() == 1
    assert f"{FLOOR_FACTOR}× the floor's" in page.locator("#diff-floor-ratio svg").inner_html()
    y = float(limit.get_attribute("y1"))
    dots = page.locator("#diff-floor-ratio svg circle[r='2.6']").evaluate_all(
        "dots => dots.map((d) => [d.getAttribute('fill'), +d.getAttribute('cx'), +d.getAttribute('cy')])")
    assert len(dots) == len(FLOOR_STAGES) * FLOOR_LAYERS
    above = [dot for dot in dots if dot[2] < y]
    mlp_out = ratios[diff["stages"].index(BEYOND_FLOOR[2])][0]
    assert len(above) == 1 and above[0][0] == mlp_out, (above, y)
    columns = sorted({dot[1] for dot in dots})
    assert columns.index(above[0][1]) == BEYOND_FLOOR[1]
    words = re.findall(r"\b(?:null|undefined|NaN|\[object \w+\])", page.locator("body").inner_text())
    assert words == [], "a script value leaked into the page's text"
    assert problems == []


def test_without_a_floor_there_are_no_floor_plots(floor_pages, browser):
    page, problems, _ = open_page(browser, floor_pages["plain"])
    assert page.locator("#diff-layers").count() == 1
    assert page.locator("#diff-floor").count() == 0 and page.locator("#diff-floor-ratio").count() == 0
    assert page.evaluate("JSON.parse(document.getElementById('report-data').textContent).diff.floor") is None
    assert problems == []


#: The router trace: its layers and experts, and the one token routed against its own scores.
ROUTER_LAYERS, ROUTER_EXPERTS, ROUTER_ROWS = 3, 8, 6
NOT_TOP_K = (1, 4)  # (layer, row)


def router_event(layer):
    """One top-2 router call of ROUTER_ROWS tokens: token r chose experts (r + layer) % 8 and
    (r + layer + 3) % 8; at NOT_TOP_K it chose its runner-up instead of its second (margin < 0)."""
    tokens, load = [], [0] * ROUTER_EXPERTS
    for row in range(ROUTER_ROWS):
        chosen = [(row + layer) % ROUTER_EXPERTS, (row + layer + 3) % ROUTER_EXPERTS]
        runner_up, margin = (row + layer + 5) % ROUTER_EXPERTS, 0.14
        if (layer, row) == NOT_TOP_K:
            chosen[1], runner_up, margin = runner_up, chosen[1], -0.14
        for e in chosen:
            load[e] += 1
        tokens.append({"row": row, "experts": chosen, "weights": [0.73, 0.27], "runner_up": runner_up,
                       "margin": margin, "logit_margin": max(margin, 0.0) * 3, "logits": [3.0, 2.0, 1.0]})
    stats = {"count": ROUTER_ROWS * ROUTER_EXPERTS, "min": 0.0, "max": 3.0, "mean": 0.5, "std": 1.0,
             "l2_norm": 10.0, "nan_count": 0, "inf_count": 0}
    return {"event": "router", "seq": 0, "pass": 0, "layer": layer, "tracepoint": "route", "function": "moe.route",
            "scoring": "softmax", "selection_bias": False, "num_experts": ROUTER_EXPERTS, "top_k": 2,
            "logits": {"shape": [ROUTER_ROWS, ROUTER_EXPERTS], "dtype": "f32", "stats": stats},
            "tokens": tokens, "load": load}


def test_the_expert_load_heat_map_draws(tmp_path, browser):
    """A trace with router calls gets the layer × expert load heat map and says which layer
    routed a token against its own scores; the router events are written as docs/trace-format.md
    specifies them, beside the layers the Python writer writes."""
    path, page_path = tmp_path / "moe.ndjson", tmp_path / "moe.html"
    writer = TraceWriter(str(path))
    writer.begin_pass(0)
    for layer in range(ROUTER_LAYERS):
        writer.begin_layer(layer, "block", "model.block")
        writer.stage("output", np.sin(np.arange(64) * 0.3 + layer).astype(np.float32))
        writer.end_layer()
    writer.end_pass()
    writer.close()
    lines = path.read_text().splitlines()
    end = next(i for i, line in enumerate(lines) if json.loads(line)["event"] == "pass_end")
    lines[end:end] = [json.dumps(router_event(layer)) for layer in range(ROUTER_LAYERS)]
    path.write_text("\n".join(lines) + "\n")
    result = subprocess.run(model_trace_cli("report", path, "-o", page_path), cwd=REPO, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    page, problems, _ = open_page(browser, page_path)
    assert "Expert load" in page.locator("#toc").inner_text()
    assert_drawn(page, "#routers-load")
    warning = page.locator("#routers-not-top-k").inner_text()
    assert warning.startswith(f"layer {NOT_TOP_K[0]}: 1 of {ROUTER_ROWS} tokens chose experts that are not the top-2"), warning
    assert problems == []
