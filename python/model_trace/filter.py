"""The Rust runtime's tracepoint filter (``MODEL_TRACE``) and capture filter
(``MODEL_TRACE_CAPTURE``), with the same syntax and the same answers.

A filter is a comma-separated list of patterns ``[-][kind:]glob[@file[:line]]``; surrounding
whitespace is ignored and empty entries are skipped:

* ``kind`` is one of ``model``, ``layer``, ``attention``, ``logits``, ``kv_cache``, ``quant``,
  ``tensor``; without it any kind matches.
* ``glob`` matches the tracepoint's name, or, when it contains ``::``, its path
  ``module::function`` (the module alone when the function is empty). ``*`` matches any run of
  characters and ``?`` one character; nothing else is special, and whitespace, ``[``, ``]``,
  ``{``, ``}`` and ``!`` are errors in a glob (this is not :mod:`fnmatch`).
* ``@file`` keeps the tracepoints whose file path ends with ``file``, whole components only
  (``\\`` read as ``/``); ``@file:line`` also needs the line.
* A leading ``-`` excludes what the pattern matches.

A tracepoint is admitted when it matches no exclusion and, if there is any inclusion, at least
one inclusion; the empty filter admits everything. Stages and forward passes follow the rules
of the Rust ``TraceFilter``: :meth:`TraceFilter.records_stage` and
:meth:`TraceFilter.traces_pass`.

The cases in ``tests/data/filter_cases.json`` at the repository's root are checked against
this module and against the Rust ``TraceFilter`` and ``CaptureFilter``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

#: Tracepoint kinds, in the Rust registry's order.
KINDS = ("model", "layer", "attention", "logits", "kv_cache", "quant", "tensor", "router")

#: Unicode's White_Space characters: what Rust's ``str::trim`` and ``char::is_whitespace`` take
#: (``str.isspace`` also takes U+001C..U+001F, which Rust does not).
WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"

_NOT_IN_GLOB = "[]{}!"
_U32_MAX = (1 << 32) - 1
_USIZE_MAX = (1 << 64) - 1


@dataclass(frozen=True)
class Tracepoint:
    """What a pattern is matched against: the Rust ``Tracepoint``'s fields (``module`` is its
    ``module_path``)."""

    kind: str
    name: str
    function: str = ""
    module: str = ""
    file: str = ""
    line: int = 0

    def path(self) -> str:
        """``module::function``, or the module alone when the function is empty."""
        return f"{self.module}::{self.function}" if self.function else self.module


class FilterError(ValueError):
    """A filter that does not parse; the message names the pattern and why, as Rust's does."""

    def __init__(self, pattern: str, reason: str):
        super().__init__(f"invalid trace filter pattern `{pattern}`: {reason}")
        self.pattern = pattern
        self.reason = reason


def glob_match(glob: str, text: str) -> bool:
    """Whether ``glob`` matches all of ``text``: ``*`` any run of characters, ``?`` one, every
    other character itself. Iterative with one backtrack point, as the Rust matcher."""
    g = t = 0
    star: Optional[Tuple[int, int]] = None
    while t < len(text):
        if g < len(glob) and glob[g] == "*":
            star = (g, t)
            g += 1
        elif g < len(glob) and glob[g] in ("?", text[t]):
            g += 1
            t += 1
        elif star is not None:
            g, t = star[0] + 1, star[1] + 1
            star = (star[0], star[1] + 1)
        else:
            return False
    return all(c == "*" for c in glob[g:])


def _parse_unsigned(text: str, largest: int) -> Optional[int]:
    """Rust's ``str::parse`` of an unsigned integer: an optional ``+`` and ASCII digits."""
    digits = text[1:] if text.startswith("+") else text
    if not digits or not all("0" <= c <= "9" for c in digits):
        return None
    value = int(digits)
    return value if value <= largest else None


@dataclass(frozen=True)
class _Location:
    file: str
    line: Optional[int]

    @staticmethod
    def parse(text: str) -> "_Location":
        file, line = text, None
        if ":" in text:
            file, line_text = text.rsplit(":", 1)
            line = _parse_unsigned(line_text.strip(WHITESPACE), _U32_MAX)
            if line is None:
                raise ValueError(f"`{line_text}` after `{file}:` is not a line number")
            file = file.strip(WHITESPACE)
        if not file:
            raise ValueError("the file after `@` is empty")
        return _Location(file.replace("\\", "/"), line)

    def matches(self, tracepoint: Tracepoint) -> bool:
        if self.line is not None and self.line != tracepoint.line:
            return False
        path = tracepoint.file.replace("\\", "/")
        if not path.endswith(self.file):
            return False
        before = path[: len(path) - len(self.file)]
        return before == "" or before.endswith("/")


@dataclass(frozen=True)
class _Pattern:
    text: str
    exclude: bool
    kind: Optional[str]
    glob: str
    location: Optional[_Location]

    @staticmethod
    def parse(text: str) -> "_Pattern":
        try:
            return _Pattern._parse(text)
        except ValueError as error:
            raise FilterError(text, str(error)) from None

    @staticmethod
    def _parse(text: str) -> "_Pattern":
        exclude = text.startswith("-")
        rest = text[1:].lstrip(WHITESPACE) if exclude else text
        location = None
        if "@" in rest:
            rest, where = rest.split("@", 1)
            rest = rest.rstrip(WHITESPACE)
            location = _Location.parse(where.strip(WHITESPACE))
        kind, glob = _split_kind(rest)
        if not glob:
            raise ValueError("the glob after the kind is empty (use `*` for all)")
        bad = next((c for c in glob if c in WHITESPACE or c in _NOT_IN_GLOB), None)
        if bad is not None:
            raise ValueError(f"`{bad}` is not allowed in a glob (only `*` and `?` are special)")
        return _Pattern(text, exclude, kind, glob, location)

    def matches(self, tracepoint: Tracepoint) -> bool:
        if self.kind is not None and self.kind != tracepoint.kind:
            return False
        if self.location is not None and not self.location.matches(tracepoint):
            return False
        if "::" in self.glob:
            return glob_match(self.glob, tracepoint.path())
        return glob_match(self.glob, tracepoint.name)


def _split_kind(text: str) -> Tuple[Optional[str], str]:
    """``kind:glob``; a single ``:`` can only introduce a kind, since paths use ``::``."""
    at = text.find(":")
    if at < 0 or text.startswith("::", at):
        return None, text
    kind = text[:at].strip(WHITESPACE)
    if kind not in KINDS:
        raise ValueError(f"unknown kind `{kind}` (expected one of {', '.join(KINDS)})")
    return kind, text[at + 1:].strip(WHITESPACE)


class TraceFilter:
    """Which tracepoints a session records (the syntax above); ``TraceFilter("")`` admits all.
    Raises :class:`FilterError` for a pattern that does not parse."""

    def __init__(self, text: Optional[str] = ""):
        self.text = (text or "").strip(WHITESPACE)
        self.patterns: List[_Pattern] = [
            _Pattern.parse(item) for item in (part.strip(WHITESPACE) for part in (text or "").split(",")) if item
        ]

    def __str__(self) -> str:
        return self.text

    def admits(self, tracepoint: Tracepoint) -> bool:
        """Whether the session records ``tracepoint``."""
        includes = [p for p in self.patterns if not p.exclude]
        if self.excludes(tracepoint):
            return False
        return not includes or any(p.matches(tracepoint) for p in includes)

    def excludes(self, tracepoint: Tracepoint) -> bool:
        """Whether an exclusion matches ``tracepoint``: not recorded, even as a stage of an
        admitted layer or as a forward pass."""
        return any(p.exclude and p.matches(tracepoint) for p in self.patterns)

    def records_stage(self, stage: Tracepoint, layer: Tracepoint) -> bool:
        """Whether a stage (a ``tensor`` tracepoint) recorded inside ``layer`` is recorded: when
        the filter admits it, or when it admits the layer and no exclusion matches the stage."""
        return self.admits(stage) or (self.admits(layer) and not self.excludes(stage))

    def traces_pass(self, tracepoint: Tracepoint) -> bool:
        """Whether the forward passes of a ``model`` tracepoint are traced: no exclusion matches
        it, and if there are inclusions of kind ``model``, one of them matches it."""
        if self.excludes(tracepoint):
            return False
        models = [p for p in self.patterns if not p.exclude and p.kind == "model"]
        return not models or any(p.matches(tracepoint) for p in models)

    def unmatched(self, tracepoints: Sequence[Tracepoint]) -> List[str]:
        """The patterns, as written, that match none of ``tracepoints``: most likely typos."""
        return [p.text for p in self.patterns if not any(p.matches(tp) for tp in tracepoints)]


def _span(text: str) -> Tuple[int, int]:
    """``N``, ``A..B`` (``B`` excluded), ``A..=B``, ``A..`` or ``..B`` as an inclusive range."""

    def number(part: str) -> int:
        value = _parse_unsigned(part.strip(WHITESPACE), _USIZE_MAX)
        if value is None:
            raise ValueError(f"`{part}` is not an index (expected N, A..B, A..=B, A.. or ..B)")
        return value

    if ".." not in text:
        start = end = number(text)
    else:
        low, high = text.split("..", 1)
        start = number(low) if low.strip(WHITESPACE) else 0
        if high.startswith("="):
            end = number(high[1:])
        elif not high.strip(WHITESPACE):
            end = _USIZE_MAX
        else:
            excluded = number(high)
            if excluded == 0:
                raise ValueError(f"`{text}` is empty")
            end = excluded - 1
    if start > end:
        raise ValueError(f"`{text}` is empty")
    return start, end


class CaptureFilter:
    """Which tensors are saved in full: :class:`TraceFilter`'s patterns plus ``pass=RANGE`` and
    ``layer=RANGE`` items (``RANGE``: ``N``, ``A..B``, ``A..=B``, ``A..``, ``..B``). A tensor is
    captured when its tracepoint is admitted by the patterns (a layer's input and output belong
    to its ``layer`` tracepoint, a stage to its ``tensor`` tracepoint) and its pass and layer
    fall in the ranges; ranges alone stand for ``*``. An empty filter captures nothing."""

    def __init__(self, text: Optional[str] = ""):
        self.text = (text or "").strip(WHITESPACE)
        patterns: List[str] = []
        self.ranges = {}
        for item in (part.strip(WHITESPACE) for part in self.text.split(",")):
            if not item:
                continue
            key = next((k for k in ("pass", "layer") if item.startswith(k + "=")), None)
            if key is None:
                patterns.append(item)
                continue
            if key in self.ranges:
                raise FilterError(item, f"`{key}=` is given twice")
            try:
                self.ranges[key] = _span(item[len(key) + 1:])
            except ValueError as error:
                raise FilterError(item, str(error)) from None
        if not patterns and self.ranges:
            patterns.append("*")
        self.patterns = TraceFilter(",".join(patterns))

    def __str__(self) -> str:
        return self.text

    def is_empty(self) -> bool:
        """Whether nothing can be captured."""
        return not self.patterns.patterns

    def captures(self, tracepoint: Tracepoint, pass_index: Optional[int], layer: Optional[int]) -> bool:
        """Whether a tensor of ``tracepoint``, recorded in ``pass_index`` and ``layer``, is saved."""
        if self.is_empty():
            return False
        for key, index in (("pass", pass_index), ("layer", layer)):
            span = self.ranges.get(key)
            if span is not None and (index is None or not span[0] <= index <= span[1]):
                return False
        return self.patterns.admits(tracepoint)
