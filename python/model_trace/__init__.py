"""model-trace for Python: the reference side of ``model-trace diff``.

``model_trace.format`` computes tensor summaries (statistics, fingerprint, sketch) exactly as
the Rust runtime does and reads trace files; see docs/trace-format.md in the repository.
"""

from .format import (
    FORMAT_NAME,
    SCHEMA_VERSION,
    TraceFormatError,
    fingerprint,
    read_trace,
    sketch,
    stats,
    summarize,
)

__all__ = [
    "FORMAT_NAME",
    "SCHEMA_VERSION",
    "TraceFormatError",
    "fingerprint",
    "read_trace",
    "sketch",
    "stats",
    "summarize",
]
__version__ = "0.1.0"
