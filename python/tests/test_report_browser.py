"""`model-trace report` in a real browser: Debian's headless Chromium, driven by Playwright.

The page of a SmolLM2 trace (logit lens on) compared with its PyTorch reference must load with
no console error and no request leaving the file, and every section must draw something: each
plot's screenshot is checked for content (not compared with a golden image, which fonts and
browser versions would break). The controls are tried too: another pass, another head.
"""

import io
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, run_example

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    if os.environ.get("MODEL_TRACE_REQUIRE_BROWSER"):
        raise RuntimeError("MODEL_TRACE_REQUIRE_BROWSER is set but no chromium is installed (apt-get install chromium)")
    pytest.skip("no chromium on PATH: apt-get install chromium to run the browser tests", allow_module_level=True)

from PIL import Image  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402

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
    result = subprocess.run(["cargo", "run", "--quiet", "-p", "trace-cli", "--", "report", str(ours), "--against", str(ref),
                             "--check-error-stat", "norm", "--rtol", "0.1", "-o", str(page)],
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
            element = page.locator(plot)
            element.scroll_into_view_if_needed()
            box = element.bounding_box()
            assert box and box["width"] > 100 and box["height"] > 60, (plot, box)
            ink, colours = drawn(element.screenshot())
            assert ink > 0.01 and colours > 8, f"{plot} looks blank: {ink:.3%} drawn, {colours} colours"
    assert page.locator("#diff .ok").inner_text().startswith("no divergence")
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
