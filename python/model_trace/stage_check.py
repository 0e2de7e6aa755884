"""The stage check: whether a layer's recorded stages obey the identities their names promise
(docs/trace-format.md, "The stage check"), on values in host memory (numpy).

A stage map that puts ``resid_mid`` on the wrong tensor gives a trace that looks right and
diffs wrong; the identities below catch it. Per layer, from the stages it recorded, with
``A`` = ``attn_post_norm`` if recorded else ``attn_out``, ``M`` = ``mlp_post_norm`` if recorded
else ``mlp_out``, ``r`` the residual multiplier (Granite's ``residual_multiplier``, else 1):

- R1 ``resid_mid = input + r·A``; R2 ``output = resid_mid + r·M``; R3 (no ``resid_mid``: a
  parallel block) ``output = input + r·(A + M)``. Error ``‖lhs − rhs‖₂ / ‖lhs‖₂``. A post-norm
  block (BERT), which records none of the norm stages, may satisfy R1/R2 normalised:
  ``resid_mid ≈ norm(input + r·A)``.
- N1 ``attn_in ≈ norm(input)``; N2 ``mlp_in ≈ norm(resid_mid)`` (``norm(input)`` without
  ``resid_mid``); N3 ``attn_post_norm ≈ norm(attn_out)``; N4 ``mlp_post_norm ≈ norm(mlp_out)``;
  and the per-head ``q_norm``/``k_norm`` are not checked (their inputs are not stages).
  ``Y ≈ norm(X)``: RMS or LayerNorm normalisation of each row of X (with ε of
  ``NORM_EPSILONS``), a per-channel weight (and bias) fitted by least squares,
  ``‖Y − fit‖₂ ≤ τ·‖Y‖₂``. Needs at least 4 rows.

Every identity is judged against ``TOLERANCE`` (0.01). An identity whose stages were not all
recorded is not checked; one whose tensors have different element counts is "not comparable",
one over NaN or infinite values is not checked either (skipped, not failed: such values are an
anomaly of the model, which the trace's anomaly detection reports, not of the map).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional

import numpy as np

#: τ for identities checked on values: the relative error allowed.
TOLERANCE = 0.01
#: Rows a norm identity needs (a per-channel weight fitted on fewer fits almost anything).
MIN_NORM_ROWS = 4
#: The epsilons a norm identity tries (the smallest error counts): none, and the two that
#: transformers' families use (1e-6: Llama, Gemma, Qwen; 1e-5: OLMo 2, Mistral, LayerNorm's
#: default). Left out, ε misfits rows whose mean square is within two orders of it: a random
#: OLMo 2's attention output (RMS 0.012 to 0.025 against ε = 1e-5) missed by 0.6%.
NORM_EPSILONS = (0.0, 1e-6, 1e-5)
#: A norm fit this close is taken without trying the others (the rounding of float32
#: values fits to ~1e-7; bfloat16's to ~3e-3).
EXACT = 1e-4
#: The stages a post-norm block lacks: with one of them recorded, the normalised form of R1/R2
#: is not accepted (the block is pre-norm or sandwich-norm, and the additive form must hold).
NORM_STAGES = ("attn_in", "mlp_in", "attn_post_norm", "mlp_post_norm")


@dataclass
class Outcome:
    """One identity on one layer: ``error`` (None when skipped) against ``tolerance``."""

    layer: Optional[int]
    stage: str
    identity: str
    error: Optional[float]
    tolerance: float = TOLERANCE
    skipped: Optional[str] = None

    @property
    def passed(self) -> bool:
        return self.skipped is not None or (self.error is not None and self.error <= self.tolerance)

    def __str__(self) -> str:
        where = f"layer {self.layer}, " if self.layer is not None else ""
        if self.skipped is not None:
            return f"{where}{self.stage}: `{self.identity}` skipped ({self.skipped})"
        verdict = "holds" if self.passed else "fails"
        return (f"{where}{self.stage}: `{self.identity}` {verdict}: error {self.error:.3g} "
                f"{'<=' if self.passed else '>'} tolerance {self.tolerance:g}")


def relative_error(lhs: np.ndarray, rhs: np.ndarray) -> float:
    """``‖lhs − rhs‖₂ / ‖lhs‖₂`` in float64 (0 when both are zero, inf when only lhs is)."""
    lhs = np.asarray(lhs, dtype=np.float64).reshape(-1)
    rhs = np.asarray(rhs, dtype=np.float64).reshape(-1)
    difference = _norm(lhs - rhs)
    scale = _norm(lhs)
    if scale == 0.0:
        return 0.0 if difference == 0.0 else float("inf")
    return difference / scale


def _norm(values: np.ndarray) -> float:
    """‖values‖₂ without BLAS (whose threads, on a machine whose cores are busy, made one
    np.linalg.norm of 74K floats take 4 ms instead of 0.05)."""
    return float(np.sqrt(np.sum(values * values)))


def _weighted_rows(weights: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``weights @ values`` (a sum of rows) without BLAS, for the reason of :func:`_norm`."""
    return np.einsum("i,ij->j", weights, values)


def _rows(values: np.ndarray, width: int) -> np.ndarray:
    return np.asarray(values, dtype=np.float64).reshape(-1, width)


def norm_error(y: np.ndarray, x: np.ndarray) -> Optional[float]:
    """How far ``y`` is from a normalisation of ``x`` with a per-channel affine map: the smallest
    of the RMS fits' and the LayerNorm fits' ``‖Y − fit‖₂ / ‖Y‖₂`` (one of each per ε of
    ``NORM_EPSILONS``; the first within ``EXACT`` ends the search) over rows of the last
    dimension of ``y``. None when there are fewer than ``MIN_NORM_ROWS`` rows or ``x`` has
    another element count."""
    y = np.asarray(y)
    if y.size == 0 or y.ndim == 0 or np.asarray(x).size != y.size:
        return None
    width = y.shape[-1]
    ys, xs = _rows(y, width), _rows(x, width)
    if ys.shape[0] < MIN_NORM_ROWS:
        return None
    rows = ys.shape[0]
    # Each fit's residual from per-channel sums (one pass over the products, then a weighted
    # sum of rows per epsilon): with n = s·x, s the rows' scales,
    #   w_j = Σ_i s_i x_ij y_ij / Σ_i s_i² x_ij²,  ‖y − n·w‖² = Σy² − Σ_j w_j Σ_i s_i x_ij y_ij,
    # and the same about the channels' means for LayerNorm's line w_j n + b_j. The fits are
    # tried RMS first, ε = 0 first, and the first one within `EXACT` ends the search.
    y_squares = np.sum(ys * ys, axis=0)
    total = float(np.sum(y_squares))
    y_norm = float(np.sqrt(total))
    if y_norm == 0.0:
        return 0.0
    best = float("inf")
    x_y, x_x = xs * ys, xs * xs
    mean_square = np.mean(x_x, axis=1)
    for epsilon in NORM_EPSILONS:
        # RMS: n = x / sqrt(mean(x²) + ε), y_j ≈ w_j n_j.
        scale = _inverse_sqrt(mean_square + epsilon)
        ny, nn = _weighted_rows(scale, x_y), _weighted_rows(scale * scale, x_x)
        w = np.divide(ny, nn, out=np.zeros_like(ny), where=nn > 0)
        best = min(best, _residual(total - float(np.sum(w * ny)), y_norm))
        if best <= EXACT:
            return best
    y_sums = np.sum(ys, axis=0)
    centred_total = float(np.sum(y_squares - y_sums * y_sums / rows))
    centred = xs - xs.mean(axis=1, keepdims=True)
    c_y, c_c = centred * ys, centred * centred
    variance = np.mean(c_c, axis=1)
    for epsilon in NORM_EPSILONS:
        # LayerNorm: n = (x − mean(x)) / sqrt(var(x) + ε) (population), y_j ≈ w_j n_j + b_j.
        scale = _inverse_sqrt(variance + epsilon)
        n_sums, ny, nn = (_weighted_rows(scale, centred), _weighted_rows(scale, c_y),
                          _weighted_rows(scale * scale, c_c))
        dny, dnn = ny - n_sums * y_sums / rows, nn - n_sums * n_sums / rows
        w = np.divide(dny, dnn, out=np.zeros_like(dny), where=dnn > 1e-12 * np.maximum(nn, 1e-300))
        best = min(best, _residual(centred_total - float(np.sum(w * dny)), y_norm))
        if best <= EXACT:
            return best
    return best


def _inverse_sqrt(values: np.ndarray) -> np.ndarray:
    root = np.sqrt(values)
    return np.divide(1.0, root, out=np.zeros_like(root), where=root > 0)


def _residual(squared: float, y_norm: float) -> float:
    """‖residual‖₂ / ‖y‖₂ from the residual's squared norm (rounding can leave it below 0)."""
    return float(np.sqrt(max(squared, 0.0))) / y_norm


#: Why an identity over a NaN or an infinity is not checked: the values say the model broke
#: (the anomaly detection's business), not which tensor the map took.
NON_FINITE = "NaN or infinite values"


def _finite(values: np.ndarray) -> bool:
    return bool(np.isfinite(np.asarray(values)).all())


def _comparable(*values: np.ndarray) -> bool:
    return len({np.asarray(v).size for v in values}) == 1


def check_layer(stages: Mapping[str, np.ndarray], layer: Optional[int] = None, residual_multiplier: float = 1.0,
                tolerance: float = TOLERANCE) -> List[Outcome]:
    """The identities of one layer's recorded stages (stage name -> values), each checked or
    skipped with its reason; none when the layer recorded too few stages for any."""
    r = residual_multiplier
    outcomes: List[Outcome] = []
    attention_branch = "attn_post_norm" if "attn_post_norm" in stages else "attn_out"
    mlp_branch = "mlp_post_norm" if "mlp_post_norm" in stages else "mlp_out"
    scaled = "" if r == 1.0 else f"{r:g}·"
    post_norm_block = not any(name in stages for name in NORM_STAGES)

    def additive(lhs: str, terms: List[str], text: str) -> None:
        if not all(name in stages for name in [lhs, *terms]):
            return
        values = [stages[name] for name in [lhs, *terms]]
        if not _comparable(*values):
            outcomes.append(Outcome(layer, lhs, text, None, tolerance, "not comparable: element counts differ"))
            return
        if not all(_finite(v) for v in values):
            outcomes.append(Outcome(layer, lhs, text, None, tolerance, NON_FINITE))
            return
        lhs_values = np.asarray(values[0], dtype=np.float64).reshape(-1)
        rhs = np.asarray(values[1], dtype=np.float64).reshape(-1).copy()
        for term in values[2:]:
            rhs += r * np.asarray(term, dtype=np.float64).reshape(-1)
        outcome = Outcome(layer, lhs, text, relative_error(lhs_values, rhs), tolerance)
        if not outcome.passed and post_norm_block:
            normalised = norm_error(np.asarray(values[0]).reshape(np.asarray(values[0]).shape), rhs)
            if normalised is not None and normalised <= tolerance:
                bracket = text.split(" = ", 1)
                outcome = Outcome(layer, lhs, f"{bracket[0]} = norm({bracket[1]})", normalised, tolerance)
        outcomes.append(outcome)

    def branch(name: str) -> str:
        return f"{scaled}{name}"

    if "resid_mid" in stages:
        additive("resid_mid", ["input", attention_branch], f"resid_mid = input + {branch(attention_branch)}")
        additive("output", ["resid_mid", mlp_branch], f"output = resid_mid + {branch(mlp_branch)}")
    else:
        text = (f"output = input + {branch(attention_branch)} + {branch(mlp_branch)}" if r == 1.0
                else f"output = input + {r:g}·({attention_branch} + {mlp_branch})")
        additive("output", ["input", attention_branch, mlp_branch], text)

    def normed(lhs: str, source: str) -> None:
        if lhs not in stages or source not in stages:
            return
        text = f"{lhs} = norm({source})"
        if not (_finite(stages[lhs]) and _finite(stages[source])):
            outcomes.append(Outcome(layer, lhs, text, None, tolerance, NON_FINITE))
            return
        error = norm_error(stages[lhs], stages[source])
        if error is None:
            reason = ("not comparable: element counts differ" if np.asarray(stages[lhs]).size
                      != np.asarray(stages[source]).size else f"fewer than {MIN_NORM_ROWS} rows")
            outcomes.append(Outcome(layer, lhs, text, None, tolerance, reason))
        else:
            outcomes.append(Outcome(layer, lhs, text, error, tolerance))

    normed("attn_in", "input")
    normed("mlp_in", "resid_mid" if "resid_mid" in stages else "input")
    normed("attn_post_norm", "attn_out")
    normed("mlp_post_norm", "mlp_out")
    return outcomes


class StageMapError(ValueError):
    """A layer's stages break an identity their names promise: the stage map is wrong (or the
    model computes something else than its family does)."""

    def __init__(self, failures: List[Outcome], context: str = ""):
        self.failures = failures
        lines = "\n  ".join(str(f) for f in failures)
        prefix = f"{context}: " if context else ""
        super().__init__(f"{prefix}the stage map is wrong: {len(failures)} identit"
                         f"{'y' if len(failures) == 1 else 'ies'} of the stage vocabulary fail "
                         f"(docs/trace-format.md, \"The stage check\"):\n  {lines}")


@dataclass
class Report:
    """What the check saw over a run: every outcome, and the largest error of those checked."""

    outcomes: List[Outcome]

    @property
    def checked(self) -> List[Outcome]:
        return [o for o in self.outcomes if o.skipped is None]

    @property
    def failures(self) -> List[Outcome]:
        return [o for o in self.outcomes if not o.passed]

    def largest(self) -> Dict[str, float]:
        """The largest error of each identity kind (the identity's text without its layer)."""
        largest: Dict[str, float] = {}
        for outcome in self.checked:
            largest[outcome.identity] = max(largest.get(outcome.identity, 0.0), outcome.error or 0.0)
        return largest

    def largest_error(self) -> float:
        return max((o.error or 0.0 for o in self.checked), default=0.0)


def check_layers(layers: Mapping[int, Mapping[str, np.ndarray]], residual_multiplier: float = 1.0,
                 tolerance: float = TOLERANCE) -> Report:
    """Every layer's identities (layer index -> stage name -> values)."""
    outcomes: List[Outcome] = []
    for layer in sorted(layers):
        outcomes += check_layer(layers[layer], layer, residual_multiplier, tolerance)
    return Report(outcomes)


def check_captured_trace(path: str, pass_index: int = 0, tolerance: float = TOLERANCE) -> Report:
    """The check on a trace file's captured values of one pass (the stages captured with
    ``capture=``/``MODEL_TRACE_CAPTURE``; stages only summarised are not checked here), with
    the residual multiplier of its header."""
    import os

    from safetensors import safe_open

    from .format import read_trace

    header, events = read_trace(path)
    extra = (header.get("metadata") or {}).get("extra") or {}
    multiplier = parse_multiplier(extra.get("residual_multiplier"))
    directory = os.path.dirname(os.path.abspath(path))
    layers: Dict[int, Dict[str, np.ndarray]] = {}
    files: Dict[str, object] = {}
    for event in events:
        if event.get("event") != "layer" or event.get("pass") != pass_index:
            continue
        for stage in event["stages"]:
            capture = stage["tensor"].get("capture")
            if not capture:
                continue
            file = files.get(capture["file"])
            if file is None:
                file = files[capture["file"]] = safe_open(os.path.join(directory, capture["file"]), framework="np")
            layers.setdefault(event["layer"], {})[stage["name"]] = file.get_tensor(capture["tensor"])  # type: ignore[attr-defined]
    return check_layers(layers, multiplier, tolerance)


def parse_multiplier(text: Optional[str]) -> float:
    """A residual multiplier as a header's ``metadata.extra.residual_multiplier`` writes it (a
    decimal number), as a float: 1 when it is absent or not a number."""
    if text is None:
        return 1.0
    try:
        return float(text)
    except ValueError:
        return 1.0
