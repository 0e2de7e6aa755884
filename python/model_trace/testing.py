"""Golden traces in Python tests: :func:`assert_matches_golden` checks a trace file against a
golden file committed beside the test, as the Rust crate's ``model_trace::golden`` does, in the
same golden format (docs/trace-format.md, *Golden files*), so either side's golden files are read
by the other and by every ``model-trace`` command::

    from model_trace.testing import assert_matches_golden

    def test_reference_did_not_move(tmp_path):
        trace = tmp_path / "ref.ndjson"
        with torch.no_grad(), model_trace.torch.trace(model, str(trace)):
            model(input_ids)
        assert_matches_golden(trace, "tests/golden/reference.ndjson")

A golden file keeps, per pass, every layer's stages, attention probabilities and logits (shape,
short fingerprint, mean, std, min, max, and the logits' top tokens), one line per layer.
``MODEL_TRACE_BLESS=1`` writes (or rewrites) it from the trace (under CI too); a missing one is written and the
assertion fails ("review and commit it"), except under CI (``CI`` set), where it fails without
writing. On the machine that blessed it the check is bit-exact (every fingerprint equal); with a
tolerance asked for, or on a machine with other vector instructions or another processor model
(whose kernels round differently), it compares the statistics, each within ``atol + rtol·scale``
(the scale of a mean or a standard deviation is the golden tensor's RMS, of a minimum or a
maximum its largest magnitude: the bounds ``model-trace diff`` applies to summaries), by default
:data:`CROSS_MACHINE_RTOL` and :data:`CROSS_MACHINE_ATOL` on another machine.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from .floats import f32_text
from .format import read_float, read_trace

GOLDEN_FORMAT_NAME = "model-trace-golden"
GOLDEN_VERSION = 1
#: Writes the golden file from the trace instead of checking (``1``).
BLESS_ENV_VAR = "MODEL_TRACE_BLESS"
#: The tolerance on a machine other than the one that blessed the golden file (the Rust crate's).
CROSS_MACHINE_RTOL = 1e-3
CROSS_MACHINE_ATOL = 1e-5
#: ``model-trace diff``'s default tolerances, for a check given only one of the two.
DEFAULT_RTOL = 1e-5
DEFAULT_ATOL = 1e-5

#: The vector instructions a golden file's machine names, as Rust's ``is_x86_feature_detected!``
#: and ``/proc/cpuinfo`` spell them.
_X86_FEATURES = [("avx", "avx"), ("avx2", "avx2"), ("fma", "fma"), ("f16c", "f16c"), ("avx512f", "avx512f")]
_ARM_FEATURES = [("neon", "asimd"), ("fp16", "fphp")]

Path_ = Union[str, "os.PathLike[str]"]


def machine() -> str:
    """This machine as a golden file names it: the architecture, the vector instructions and the
    processor's model, as the Rust crate's ``machine()`` writes it (``x86_64 avx avx2 fma f16c;
    AMD EPYC``)."""
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine())
    flags: List[str] = []
    model: Optional[str] = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("flags", "Features") and not flags:
                    flags = value.split()
                elif key == "model name" and model is None:
                    model = " ".join(value.split()) or None
    except OSError:
        pass
    table = _X86_FEATURES if arch == "x86_64" else _ARM_FEATURES if arch == "aarch64" else []
    parts = [arch] + [name for name, flag in table if flag in flags]
    text = " ".join(parts)
    return f"{text}; {model}" if model else text


def golden_text(trace: Path_, machine_name: Optional[str] = None) -> str:
    """The golden file of a trace file: its passes and, per layer, the stages, attention
    probabilities and logits in the order they were computed (docs/trace-format.md)."""
    _, events = read_trace(str(trace))
    header = {"format": GOLDEN_FORMAT_NAME, "version": GOLDEN_VERSION,
              "machine": machine() if machine_name is None else machine_name}
    lines = [_dumps(header)]
    held: List[Tuple[int, int, int, str, Dict[str, Any], Optional[Dict[str, Any]]]] = []

    def flush() -> None:
        held.sort(key=lambda h: h[0])
        groups: Dict[Tuple[int, int], List[str]] = {}
        for _, pass_, layer, name, tensor, row in held:
            groups.setdefault((pass_, layer), []).append(_tensor_text(name, tensor, row))
        for (pass_, layer), tensors in groups.items():
            lines.append(f'{{"pass":{pass_},"layer":{layer},"tensors":[{",".join(tensors)}]}}')
        held.clear()

    for event in events:
        kind = event.get("event")
        if kind == "pass_begin":
            flush()
            text = f'{{"pass":{event["pass"]},"position":{event["position"]}'
            if event.get("tokens") is not None:
                text += f',"tokens":{_dumps(event["tokens"])}'
            lines.append(text + "}")
        elif kind == "pass_end":
            flush()
        elif kind == "layer":
            for stage in event["stages"]:
                held.append((stage["seq"], event["pass"], event["layer"], stage["name"], stage["tensor"], None))
        elif kind == "attention":
            held.append((event["seq"], event.get("pass") or 0, event["layer"], "attention", event["probs"], None))
        elif kind == "logits":
            rows = event.get("batch_rows") or []
            held.append((event["seq"], event["pass"], event["layer"], "logits", event["logits"],
                         rows[0] if rows else None))
    flush()
    return "\n".join(lines) + "\n"


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _tensor_text(name: str, tensor: Dict[str, Any], row: Optional[Dict[str, Any]]) -> str:
    stats = tensor["stats"]
    fingerprint = tensor.get("fingerprint")
    parts = [_dumps(name), _dumps(tensor["shape"]), _dumps(fingerprint[:16]) if fingerprint else "null"]
    parts += [f32_text(read_float(stats[key])) for key in ("mean", "std", "min", "max")]
    extra = []
    if tensor.get("dtype", "f32") != "f32":
        extra.append(f'"dtype":{_dumps(tensor["dtype"])}')
    if stats.get("nan_count", 0):
        extra.append(f'"nan":{stats["nan_count"]}')
    if stats.get("inf_count", 0):
        extra.append(f'"inf":{stats["inf_count"]}')
    if row is not None and row.get("top_tokens"):
        pairs = ",".join(f"[{token},{f32_text(read_float(logit))}]"
                         for token, logit in zip(row["top_tokens"], row["top_logits"]))
        extra.append(f'"top":[{pairs}]')
    if extra:
        parts.append("{" + ",".join(extra) + "}")
    return "[" + ",".join(parts) + "]"


@dataclass(frozen=True)
class GoldenTensor:
    """A tensor of a golden file."""

    pass_: int
    layer: int
    name: str
    shape: Tuple[int, ...]
    fingerprint: Optional[str]
    mean: float
    std: float
    min: float
    max: float
    nan: int
    inf: int

    def describe(self) -> str:
        return f"pass {self.pass_}, layer {self.layer}, {self.name}"


def read_golden(text: str, source: str = "<golden>") -> Tuple[Dict[str, Any], List[GoldenTensor]]:
    """A golden file's header and its tensors, in the order they were computed."""
    lines = text.split("\n")
    try:
        header = json.loads(lines[0])
    except json.JSONDecodeError as error:
        raise ValueError(f"{source}:1: not a golden file ({error})") from None
    if header.get("format") != GOLDEN_FORMAT_NAME:
        raise ValueError(f"{source}:1: not a golden file (format {header.get('format')!r})")
    if int(header.get("version", 0)) > GOLDEN_VERSION:
        raise ValueError(f"{source}:1: golden format version {header['version']} is newer than {GOLDEN_VERSION}")
    tensors: List[GoldenTensor] = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            for item in obj.get("tensors", []):
                extra = item[7] if len(item) == 8 else {}
                tensors.append(GoldenTensor(
                    obj["pass"], obj["layer"], item[0], tuple(item[1]), item[2],
                    *(read_float(v) for v in item[3:7]), extra.get("nan", 0), extra.get("inf", 0)))
        except (json.JSONDecodeError, KeyError, IndexError, TypeError, ValueError) as error:
            raise ValueError(f"{source}:{number}: bad golden line ({error!r})") from None
    return header, tensors


class GoldenMismatch(AssertionError):
    """A trace that does not match its golden file; the message names the first tensor that
    differs and where this run's golden file was written."""


@dataclass(frozen=True)
class GoldenMatch:
    """A check that passed: how many tensors, how many bit-identical, whether it blessed, the
    tolerance ``(rtol, atol)`` it compared the statistics within (None: bit-exact) and the machine
    that blessed the golden file when it is not this one."""

    tensors: int
    bit_identical: int
    blessed: bool
    tolerance: Optional[Tuple[float, float]]
    other_machine: Optional[str]


def assert_matches_golden(trace: Path_, golden: Path_, *, rtol: Optional[float] = None,
                          atol: Optional[float] = None, bless: Optional[bool] = None,
                          ci: Optional[bool] = None) -> GoldenMatch:
    """Asserts that the trace file ``trace`` matches the golden file ``golden`` (see the module's
    documentation); returns what it compared. ``bless`` and ``ci`` default to the environment
    (``MODEL_TRACE_BLESS=1``; ``CI`` set to anything but ``false`` or ``0``)."""
    golden = Path(golden)
    if bless is None:
        bless = os.environ.get(BLESS_ENV_VAR) == "1"
    if ci is None:
        ci = os.environ.get("CI", "") not in ("", "false", "0")
    text = golden_text(trace)
    _, recorded = read_golden(text, str(trace))
    if not recorded:
        raise GoldenMismatch(f"golden check {golden}: the trace {trace} has no tensor")
    new_path = golden.with_name(f"{golden.stem}.new{golden.suffix or '.ndjson'}")
    if bless:
        if not golden.exists() or golden.read_text(encoding="utf-8") != text:
            _write(golden, text)
        _remove(new_path)
        return GoldenMatch(len(recorded), len(recorded), True, None, None)
    if not golden.exists():
        if ci:
            raise GoldenMismatch(
                f"golden file {golden} does not exist, and under CI (`CI` is set) a golden file is not written: "
                f"run the test with {BLESS_ENV_VAR}=1 where you work, review the file and commit it")
        _write(golden, text)
        raise GoldenMismatch(
            f"golden file {golden} did not exist: written now from this run; review it and commit it "
            "(the check passes against it from the next run on)")
    header, reference = read_golden(golden.read_text(encoding="utf-8"), str(golden))
    blessed_on = header.get("machine", "")
    other_machine = blessed_on if blessed_on != machine() else None
    tolerance: Optional[Tuple[float, float]] = None
    if rtol is not None or atol is not None:
        tolerance = (DEFAULT_RTOL if rtol is None else rtol, DEFAULT_ATOL if atol is None else atol)
    elif other_machine is not None:
        tolerance = (CROSS_MACHINE_RTOL, CROSS_MACHINE_ATOL)
    ours = {(t.pass_, t.layer, t.name): t for t in recorded}
    keys = {(t.pass_, t.layer, t.name) for t in reference}
    missing = [t for t in reference if (t.pass_, t.layer, t.name) not in ours]
    extra = [t for t in recorded if (t.pass_, t.layer, t.name) not in keys]
    first: Optional[Tuple[GoldenTensor, str]] = None
    differing = identical = compared = 0
    for want in reference:
        got = ours.get((want.pass_, want.layer, want.name))
        if got is None:
            continue
        compared += 1
        if want.fingerprint is not None and want.fingerprint == got.fingerprint:
            identical += 1
            continue
        why = _difference(want, got, tolerance)
        if why is not None:
            differing += 1
            if first is None:
                first = (want, why)
    if first is None and not missing and not extra:
        _remove(new_path)
        return GoldenMatch(compared, identical, False, tolerance, other_machine)
    _write(new_path, text)
    mode = ("bit-exact (this machine blessed it)" if tolerance is None
            else f"by statistics within rtol {tolerance[0]} atol {tolerance[1]}"
            + (f": blessed on another machine ({other_machine})" if other_machine else ""))
    lines = [f"golden check failed: {golden}"]
    if first is not None:
        lines.append(f"  first difference: {first[0].describe()}: {first[1]}")
    within = compared - differing - identical
    within_text = f", {within} within tolerance" if within else ""
    lines.append(f"  compared {mode}: {differing} of {compared} tensors differ{within_text}, {identical} bit-identical")
    for what, tensors in (("only in the golden file", missing), ("only in this run", extra)):
        if tensors:
            lines.append(f"  {len(tensors)} {what}, the first {tensors[0].describe()}")
    flags = "--atol 0 --rtol 0 " if tolerance is None else f"--atol {tolerance[1]} --rtol {tolerance[0]} "
    lines.append(f"  this run's golden file: {new_path}")
    lines.append(f"  see every tensor:       model-trace diff {flags}{golden} {new_path}")
    lines.append(f"  accept this run:        run this test again with {BLESS_ENV_VAR}=1, then review the golden file's diff "
                 "and commit it")
    raise GoldenMismatch("\n".join(lines))


def _difference(want: GoldenTensor, got: GoldenTensor, tolerance: Optional[Tuple[float, float]]) -> Optional[str]:
    """Why ``got`` is not ``want`` (None when it is, within ``tolerance``)."""
    if [d for d in want.shape if d != 1] != [d for d in got.shape if d != 1]:
        return f"shape {list(want.shape)} became {list(got.shape)}"
    if (want.nan, want.inf) != (got.nan, got.inf):
        return f"NaN and infinity counts ({want.nan}, {want.inf}) became ({got.nan}, {got.inf})"
    rms = (want.std ** 2 + want.mean ** 2) ** 0.5
    magnitude = max(abs(want.min), abs(want.max))
    # In the order the Rust check lists them, so that both name the same statistic.
    checks = [("min", want.min, got.min, magnitude), ("max", want.max, got.max, magnitude),
              ("mean", want.mean, got.mean, rms), ("std", want.std, got.std, rms)]
    if tolerance is None:
        changed = next(((what, a, b) for what, a, b, _ in checks if a != b), None)
        if changed is None:
            return "other bits (its fingerprint changed), the same statistics"
        return f"other bits (its fingerprint changed); {changed[0]} {f32_text(changed[1])} became {f32_text(changed[2])}"
    rtol, atol = tolerance
    worst = None
    for what, a, b, scale in checks:
        difference = abs(b - a) if (a == a and b == b) else (0.0 if (a != a and b != b) else float("inf"))
        allowed = atol + rtol * scale
        ratio = difference / allowed if allowed > 0 else (0.0 if difference == 0 else float("inf"))
        if ratio > 1 and (worst is None or ratio > worst[3]):
            worst = (what, a, b, ratio)
    if worst is None:
        return None
    return f"{worst[0]} {f32_text(worst[1])} became {f32_text(worst[2])} ({worst[3]:.3f}× the allowance)"


def _write(path: Path, text: str) -> None:
    """Writes ``text`` whole or not at all (a temporary file renamed over ``path``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        _remove(Path(temporary))
        raise


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
