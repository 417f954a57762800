"""Progress reports on stderr, one helper for every tool: a tqdm bar on a terminal, plain periodic
lines in a log, JSON lines for a program, or nothing.

Modes (``--progress MODE`` of the tools, ``progress=`` of the API):

- ``auto``: ``bar`` when stderr is a terminal, else ``plain`` (``True`` means ``auto``);
- ``bar``: a tqdm bar (redrawn in place; fills a log file with carriage returns, hence ``auto``);
- ``plain``: one line every 10 seconds or 10 % of the work, whichever comes first, and one at the end,
  e.g. ``encode: 45% (60.0 MB of 133.4 MB) in 5.0 s, 12.0 MB/s``;
- ``json``: the same moments as one JSON object per line: ``{"task": "encode", "done": ...,
  "total": ..., "unit": "B", "seconds": ..., "final": false}``;
- ``none``: nothing (``False`` or ``None`` mean ``none``).

>>> p = make_progress("none", total=10, desc="x"); p.update(3); p.close()
>>> resolve_mode(True) in ("bar", "plain"), resolve_mode(False), resolve_mode("json")
(True, 'none', 'json')
"""
from __future__ import annotations

import json
import sys
import time
from typing import IO, Optional, Union

MODES = ("auto", "bar", "plain", "json", "none")
#: ``plain`` and ``json``: a line at least this often (seconds) ...
PLAIN_SECONDS = 10.0
#: ... and each time this share of the total is done.
PLAIN_STEP = 0.10

ProgressMode = Union[str, bool, None]


def check_mode(mode: ProgressMode) -> ProgressMode:
    """Return ``mode`` if it is a bool, None or one of :data:`MODES`; else raise ``ValueError``.

    >>> check_mode("plain"), check_mode(True)
    ('plain', True)
    """
    if mode is None or isinstance(mode, bool) or mode in MODES:
        return mode
    raise ValueError(f"unknown progress mode {mode!r} (one of: {', '.join(MODES)})")


def resolve_mode(mode: ProgressMode, stream: Optional[IO] = None) -> str:
    """The concrete mode: ``auto`` (or ``True``) becomes ``bar`` on a terminal, else ``plain``."""
    check_mode(mode)
    if mode is None or mode is False:
        return "none"
    if mode is True or mode == "auto":
        stream = sys.stderr if stream is None else stream
        try:
            tty = stream.isatty()
        except (AttributeError, ValueError):
            tty = False
        return "bar" if tty else "plain"
    return mode


class _NoProgress:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


class _Lines:
    """``plain`` / ``json``: a line every ``PLAIN_SECONDS`` or ``PLAIN_STEP`` of the total."""

    def __init__(self, total: Optional[int], desc: str, unit: str, unit_scale: bool, as_json: bool,
                 stream: IO, clock=time.monotonic):
        self.total, self.desc, self.unit, self.unit_scale = total, desc, unit, unit_scale
        self.as_json, self.stream, self.clock = as_json, stream, clock
        self.done = 0
        self.t0 = self.last_t = clock()
        self.next_share = PLAIN_STEP
        self.closed = False

    def update(self, n: int = 1) -> None:
        self.done += n
        now = self.clock()
        # The line at 100 % is close()'s, so a finished task is reported once.
        share_due = bool(self.total) and self.next_share <= self.done / self.total < 1.0
        if share_due or now - self.last_t >= PLAIN_SECONDS:
            self._emit(now, final=False)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._emit(self.clock(), final=True)

    def _emit(self, now: float, final: bool) -> None:
        self.last_t = now
        if self.total:
            share = self.done / self.total
            while self.next_share <= share + 1e-12:
                self.next_share += PLAIN_STEP
        secs = now - self.t0
        if self.as_json:
            line = json.dumps({"task": self.desc, "done": self.done, "total": self.total, "unit": self.unit,
                               "seconds": round(secs, 3), "final": final})
        else:
            rate = f", {self._fmt(self.done / secs, rate=True)}/s" if secs > 0 else ""
            if self.total:
                done = self._fmt(self.done) if self.unit_scale else f"{self.done:,}"
                line = (f"{self.desc}: {100 * self.done / self.total:.0f}% ({done} of "
                        f"{self._fmt(self.total)}) in {secs:.1f} s{rate}")
            else:
                line = f"{self.desc}: {self._fmt(self.done)} in {secs:.1f} s{rate}"
            if final:
                line += ", done"
        print(line, file=self.stream, flush=True)

    def _fmt(self, n: float, rate: bool = False) -> str:
        """``1.5 MB`` with ``unit_scale`` (decimal, as the bar), else ``1,500 merges`` (a rate:
        ``1,500 merge``, for ``merge/s``)."""
        if self.unit_scale:
            for prefix in ("", "k", "M", "G", "T"):
                if abs(n) < 1000 or prefix == "T":
                    return f"{n:.1f} {prefix}{self.unit}" if prefix else f"{n:.0f} {self.unit}"
                n /= 1000
        plural = not rate and f"{n:,.0f}" != "1" and self.unit.isalpha() and not self.unit.endswith("s")
        return f"{n:,.0f} {self.unit}{'s' if plural else ''}"


def make_progress(mode: ProgressMode, total: Optional[int] = None, desc: str = "", unit: str = "it",
                  unit_scale: bool = False, stream: Optional[IO] = None, **tqdm_kwargs):
    """A progress reporter with ``update(n)`` and ``close()`` for ``mode`` (see the module docstring).

    ``tqdm_kwargs`` go to tqdm in ``bar`` mode only (``smoothing``, ...). Sizes are decimal in
    every mode (``100.0 MB``, ``100M``): a ``unit_divisor`` is ignored.

    >>> import io; s = io.StringIO()
    >>> p = make_progress("plain", total=4, desc="merges", unit="merge", stream=s)
    >>> for _ in range(4): p.update(1)
    >>> p.close(); s.getvalue().splitlines()[-1].startswith("merges: 100% (4 of 4 merges) in ")
    True
    """
    stream = sys.stderr if stream is None else stream
    mode = resolve_mode(mode, stream)
    if mode == "none":
        return _NoProgress()
    if mode == "bar":
        from tqdm import tqdm

        tqdm_kwargs["unit_divisor"] = 1000          # decimal, as the plain lines (not 95.4M for 100 MB)
        return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit_scale, file=stream,
                    dynamic_ncols=True, **tqdm_kwargs)
    return _Lines(total, desc, unit, unit_scale, mode == "json", stream)


def progress_bar(mode: ProgressMode, **kwargs):
    """``make_progress(mode, **kwargs)``, or None when the mode reports nothing (``"none"``).

    The one place the library makes progress reporters (counting, merging, encoding, SuperBPE).
    """
    if resolve_mode(mode) == "none":
        return None
    return make_progress(mode, **kwargs)


def add_progress_flag(parser) -> None:
    """``--progress MODE`` and its old spelling ``--no-progress`` (= ``--progress none``)."""
    parser.add_argument("--progress", choices=MODES, default="auto", metavar="MODE",
                        help="progress on stderr: auto (a bar on a terminal, else plain), bar, plain "
                             "(a line every 10 s or 10%%), json (JSON lines), none (default: auto)")
    parser.add_argument("--no-progress", action="store_const", const="none", dest="progress",
                        help="same as --progress none")


__all__ = ["MODES", "add_progress_flag", "check_mode", "make_progress", "progress_bar", "resolve_mode"]
