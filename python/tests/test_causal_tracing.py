"""Activation patching as interpretability users know it (ROME's causal tracing), on SmolLM2
through model-trace's interventions: the clean run of "The capital of France is" patched into
the run of "The capital of Italy is" one (layer, position) at a time. The answer " Paris" comes
back where the fact is carried: at the subject's position in the early and middle layers, at
the last position in the late ones; nowhere else. `model-trace report` draws the heatmap.
"""

import json
import re
import subprocess

import numpy as np

from conftest import REPO, model_trace_cli, rust_command


def test_causal_tracing_finds_the_subject_then_the_last_position(tmp_path):
    out = tmp_path / "causal"
    command = rust_command("smollm", ["--out", out, "--json"], features="trace", binary="causal_trace")
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-4000:]
    found = json.loads(result.stdout)
    patched = np.array(found["patched"])  # [layer][position]
    layers, positions = patched.shape
    assert found["tokens"] == ["The", " capital", " of", " Italy", " is"]
    assert (layers, positions) == (30, 5) and found["runs"] == 2 + layers * positions
    assert found["clean"] > 0.5 and found["corrupted"] < 0.01, (found["clean"], found["corrupted"])
    subject, last = 3, positions - 1
    # Before the subject nothing carries the fact: those patches change nothing.
    assert patched[:, :subject].max() < 0.01
    # The subject's position in the early layers, the last position in the late ones, each
    # restore most of the clean probability.
    assert patched[:8, subject].min() > 0.5 * found["clean"], patched[:8, subject]
    assert patched[-4:, last].min() > 0.5 * found["clean"], patched[-4:, last]
    # And the handover happens once: from the layer where the last position takes over, the
    # subject's patch no longer helps.
    handover = int(np.argmax(patched[:, last] > 0.5 * found["clean"]))
    assert 8 < handover < layers - 4 and patched[handover:, subject].max() < 0.01, (handover, patched[:, subject])
    print(f"causal tracing: {found['runs']} runs in {found['seconds']:.1f} s; the subject's position carries "
          f"' Paris' up to layer {handover - 1}, the last position from layer {handover}")

    page = tmp_path / "patched.html"
    report = subprocess.run(model_trace_cli("report", found["patched_trace"], "-o", page), cwd=REPO,
                            capture_output=True, text=True, timeout=600)
    assert report.returncode == 0, report.stderr
    data = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>',
                                page.read_text(), re.S).group(1))
    heatmap = data["patching"]
    assert (heatmap["layers"], heatmap["positions"]) == (layers, positions)
    assert heatmap["answer"] == " Paris" and heatmap["tokens"] == found["tokens"]
    assert abs(heatmap["unpatched"] - found["corrupted"]) < 1e-6
    probs = np.frombuffer(__import__("base64").b64decode(heatmap["probs"]), dtype="<f4").reshape(positions, layers)
    np.testing.assert_allclose(probs.T, patched, rtol=1e-5)

    # The heatmap in a real browser, when there is one (test_report_browser.py requires it in CI).
    import shutil

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        return
    from test_report_browser import drawn
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        tab = browser.new_page(viewport={"width": 1280, "height": 900})
        problems = []
        tab.on("pageerror", lambda e: problems.append(str(e)))
        tab.goto(page.as_uri())
        tab.wait_for_load_state("load")
        plot = tab.locator("#patching-plot canvas")
        plot.scroll_into_view_if_needed()
        ink, colours = drawn(plot.screenshot())
        browser.close()
    assert problems == [] and ink > 0.3 and colours > 8, (problems, ink, colours)
