"""``tracer_overhead.py``'s forward-pass cases timed as the process's CPU time, beside wall time:
on a machine that other programs keep busy, the wall time of both runs scatters with the
scheduler, and the CPU time much less.

    python python/benchmarks/tracer_cpu_time.py [--rounds 21] [--case minilm,smollm]
        [--threads 1] [--no-check] [--json OUT]

Runs ``tracer_overhead.measure`` (untraced and traced interleaved, alternating which goes
first, after one warm-up of each) with its ``timed`` replaced by one that reads
``time.process_time()`` (every thread of the process) as well as ``time.perf_counter()``, and
reports the medians of both and their ratios. ``--threads`` sets torch's threads (default 1);
``--no-check`` traces with ``check_stages=False``. Run it with the installed package (not
``PYTHONPATH=python``) to measure what a user's install gives.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import tracer_overhead  # noqa: E402

import model_trace  # noqa: E402
import model_trace.floats  # noqa: E402
import model_trace.torch  # noqa: E402

#: The cases that time one forward pass (the decode cases time steps inside one trace).
PASS_CASES = [name for name, (_, _, decodes) in tracer_overhead.CASES.items() if not decodes]


class Clock:
    """``tracer_overhead.timed`` that returns CPU time and keeps each wall time, in order."""

    def __init__(self) -> None:
        self.walls: List[float] = []

    def timed(self, run: Callable[[], object], synchronize: Callable[[], None]) -> float:
        synchronize()
        wall, cpu = time.perf_counter(), time.process_time()
        run()
        synchronize()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        self.walls.append(wall)
        return cpu


def wall_medians(walls: List[float], rounds: int) -> Dict[str, float]:
    """The median wall times of the untraced and traced runs: ``walls`` in ``measure``'s order
    (one warm-up each, then per round untraced first in even rounds, traced first in odd)."""
    untraced, traced = [], []
    for index in range(rounds):
        first, second = walls[2 + 2 * index], walls[3 + 2 * index]
        if index % 2 == 0:
            untraced.append(first)
            traced.append(second)
        else:
            traced.append(first)
            untraced.append(second)
    plain, with_trace = statistics.median(untraced), statistics.median(traced)
    return {"untraced_wall_ms": plain * 1e3, "traced_wall_ms": with_trace * 1e3, "wall_ratio": with_trace / plain}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--case", default="minilm,smollm", help=f"comma-separated, of {', '.join(PASS_CASES)}")
    parser.add_argument("--threads", type=int, default=1, help="torch's threads (default 1)")
    parser.add_argument("--no-check", action="store_true", help="trace with check_stages=False")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    names = [name.strip() for name in args.case.split(",") if name.strip()]
    unknown = [name for name in names if name not in PASS_CASES]
    if unknown or not names:
        parser.error(f"unknown case {', '.join(unknown)!r}: choose among {', '.join(PASS_CASES)}")
    torch.set_num_threads(args.threads)
    if args.no_check:
        tracer_overhead.model_trace.torch.trace = functools.partial(model_trace.torch.trace, check_stages=False)
    clock = Clock()
    tracer_overhead.timed = clock.timed
    report: Dict[str, Any] = {
        "model_trace": model_trace.__file__, "orjson": model_trace.floats._orjson is not None,
        "check_stages": not args.no_check, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "cpu": tracer_overhead.cpu_name(), "rounds": args.rounds, "cases": {},
    }
    print(f"model_trace from {os.path.dirname(model_trace.__file__)}, orjson {'on' if report['orjson'] else 'off'}, "
          f"check_stages {report['check_stages']}, torch {torch.__version__}, {torch.get_num_threads()} threads",
          flush=True)
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "trace.ndjson")
        for name in names:
            label, build, _ = tracer_overhead.CASES[name]
            if build is tracer_overhead.minilm and not os.path.isdir(tracer_overhead.MINILM_DIR):
                print(f"{label}: skipped, no weights in {tracer_overhead.MINILM_DIR} (scripts/fetch-models)")
                continue
            clock.walls.clear()
            load = os.getloadavg()[0]
            result = tracer_overhead.measure(build, args.rounds, path, torch.device("cpu"), torch.float32,
                                             lambda: None, None)
            result = {"untraced_cpu_ms": result["untraced_ms"], "traced_cpu_ms": result["traced_ms"],
                      "cpu_ratio": result["ratio"], **wall_medians(clock.walls, args.rounds),
                      "load_average": [load, os.getloadavg()[0]]}
            print(f"{label}: CPU time {result['untraced_cpu_ms']:.1f} -> {result['traced_cpu_ms']:.1f} ms, "
                  f"ratio {result['cpu_ratio']:.2f}x; wall time {result['untraced_wall_ms']:.1f} -> "
                  f"{result['traced_wall_ms']:.1f} ms, ratio {result['wall_ratio']:.2f}x (medians of {args.rounds}; "
                  f"load average {load:.1f})", flush=True)
            report["cases"][name] = {"label": label, **result}
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=1)
            out.write("\n")


if __name__ == "__main__":
    main()
