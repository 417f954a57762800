"""Memory-profiling runs: run a command, sample the RSS of its process tree, write JSON and a plot.

``profile_command(cmd, out_prefix)`` runs ``cmd`` with ``BPE_CORE_PHASE_FILE`` set (so the
:func:`bpe_core.memmon.phase` calls of any bpe_core process in the tree are recorded), samples
:func:`bpe_core.memmon.tree_rss` of the child every ``interval`` seconds, and writes

- ``PREFIX.json``: the command, exit code, budget, peak, samples ``[seconds, rss]``, phases with
  ``start``/``end`` (seconds since the command started) and the peak of each phase;
- ``PREFIX.png``: RSS (MiB) over time, the budget as a horizontal line, phases shaded and labelled
  (matplotlib, the optional ``plot`` extra; without it only the JSON is written and a note on stderr
  says how to get the plot).

Both files are written atomically (temp file beside the target, then rename).
``tools/profile_memory.py`` is the command line; the tools' ``--profile-memory PREFIX`` flag reruns
the tool under :func:`profile_command` (see :func:`split_flag`).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Optional, Sequence

from ..errors import Terminated
from .atomic import atomic_path, atomic_write, new_temp_file, output_problem
from .budget import default_memory_limit, parse_size
from .memmon import PHASE_FILE_ENV, MemoryMonitor, read_phase_file
from .workers import terminate_on_sigterm

MiB = 1 << 20
#: Tools that plan to a memory budget: without ``--memory-limit`` they use the default one.
BUDGETED_TOOLS = ("train_bpe.py", "encode_corpus.py")
#: The same as subcommands: ``bpe-core train``, ``python -m bpe_core encode``.
BUDGETED_COMMANDS = ("train", "encode")
PLOT_HINT = "pip install matplotlib"


@dataclass
class ProfileResult:
    """What a profiling run produced."""

    exit_code: int
    peak_rss_bytes: int
    json_path: str
    png_path: Optional[str]      # None when matplotlib is missing
    data: dict


# ==== Running ===============================================================================


def profile_command(cmd: Sequence[str], out_prefix: str, interval: float = 0.1,
                    budget: Optional[int] = None, *, env: Optional[dict] = None,
                    plot: bool = True, quiet: bool = False, prog: str = "profile_memory") -> ProfileResult:
    """Run ``cmd``, sample the RSS of its process tree, write ``out_prefix.json`` and ``.png``.

    Args:
        cmd: the command and its arguments (no shell).
        out_prefix: output path without extension; its folder must exist and be writable
            (checked before ``cmd`` starts: ``ValueError`` otherwise).
        interval: seconds between samples.
        budget: the memory limit in bytes, drawn as a line (None: taken from a ``--memory-limit``
            in ``cmd`` if there is one, else the default budget when ``cmd`` runs
            ``train_bpe.py`` or ``encode_corpus.py``, else no line). ``budget_source`` in the JSON
            says which (``"--budget"``, ``"--memory-limit"``, ``"default"`` or null).
        env: the child's environment (default: this one), plus ``BPE_CORE_PHASE_FILE``.
        plot: also write the PNG (when matplotlib is importable).
        quiet: no summary line on stderr.

    Returns:
        A :class:`ProfileResult`; ``exit_code`` is the command's (127 when it cannot start; the
        negative signal number as with ``subprocess`` when it was killed).

    >>> import sys, tempfile, os, json
    >>> prefix = os.path.join(tempfile.mkdtemp(), "run")
    >>> r = profile_command([sys.executable, "-c", "pass"], prefix, plot=False, quiet=True)
    >>> r.exit_code, json.load(open(prefix + ".json"))["exit_code"]
    (0, 0)
    """
    cmd = [os.fspath(c) for c in cmd]
    if not cmd:
        raise ValueError("no command to profile")
    if interval <= 0:
        raise ValueError("interval must be > 0")
    out_prefix = os.fspath(out_prefix)
    for suffix in (".json", ".png") if plot else (".json",):      # checked before the command runs
        problem = output_problem(out_prefix + suffix)
        if problem is not None:
            raise ValueError(f"{out_prefix + suffix}: {problem}")
    budget_source = "--budget" if budget is not None else None
    if budget is None:
        budget = budget_from_command(cmd)
        budget_source = "--memory-limit" if budget is not None else None
    if budget is None and _budgeted(cmd):
        budget, budget_source = default_memory_limit(), "default"      # what the tool plans with

    fd, phase_path = new_temp_file(None, "bpe_core-phases-", ".txt")
    os.close(fd)
    child_env = dict(os.environ if env is None else env)
    child_env[PHASE_FILE_ENV] = phase_path
    t0 = time.time()
    try:
        try:
            proc = subprocess.Popen(cmd, env=child_env)
        except OSError as exc:
            print(f"{prog}: error: cannot run {cmd[0]}: {exc.strerror or exc}", file=sys.stderr)
            exit_code, samples, peak, peak_time, t_end = 127, [], 0, t0, time.time()
            peak_anon = 0
        else:
            mon = MemoryMonitor(pid=proc.pid, interval=interval, budget=budget)
            mon.start()
            try:
                exit_code = _wait(proc)
            finally:
                mon.stop()
            t_end = time.time()
            samples, peak, peak_time = mon.samples, mon.peak, mon.peak_time
            peak_anon = mon.peak_anon
        phases = read_phase_file(phase_path, with_rss=True)
    finally:
        try:
            os.unlink(phase_path)
        except OSError:
            pass

    data = build_report(cmd, exit_code, interval, budget, t0, t_end, samples, peak, peak_time, phases,
                        budget_source=budget_source)
    peak = data["peak_rss_bytes"]
    # what a budget bounds is anonymous memory (mapped files are page cache): ``over_budget`` compares
    # the RSS, ``budget_exceeded`` the anonymous peak, as the run reports do
    data["peak_anon_bytes"] = int(peak_anon)
    data["budget_exceeded"] = bool(budget) and peak_anon > budget
    json_path = out_prefix + ".json"
    png_path: Optional[str] = None
    with atomic_write(json_path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    if plot:
        try:
            png_path = write_plot(data, out_prefix + ".png")
        except ImportError:
            print(f"{prog}: note: matplotlib is not installed, so no {out_prefix}.png; "
                  f"to get the plot: {PLOT_HINT}", file=sys.stderr)
    if not quiet:
        over = ""
        if budget:
            over = f" of the {_mib(budget):,.0f} MiB budget" + (" (OVER BUDGET)" if peak > budget else "")
        outputs = json_path + (f", {png_path}" if png_path else "")
        print(f"{prog}: peak RSS {_mib(peak):,.0f} MiB{over}, {data['wall_seconds']:.1f} s, "
              f"exit code {exit_code} -> {outputs}", file=sys.stderr)
    return ProfileResult(exit_code, peak, json_path, png_path, data)


def _wait(proc: subprocess.Popen) -> int:
    """Wait for the child; a Ctrl-C or SIGTERM that reaches this process is passed on to the child
    (which cleans up and exits), and we keep waiting for it to end: no orphan is left running."""
    with terminate_on_sigterm():
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt as exc:
                try:
                    proc.send_signal(signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
                except OSError:
                    pass


def budget_from_command(cmd: Sequence[str]) -> Optional[int]:
    """The value of ``--memory-limit SIZE`` (or ``--memory-limit=SIZE``) in a command, if any.

    >>> budget_from_command(["python", "train.py", "--memory-limit", "1G"]) >> 20
    1024
    >>> budget_from_command(["x", "--memory-limit=500M"]) >> 20, budget_from_command(["x"])
    (500, None)
    """
    for i, arg in enumerate(cmd):
        value = None
        if arg == "--memory-limit" and i + 1 < len(cmd):
            value = cmd[i + 1]
        elif arg.startswith("--memory-limit="):
            value = arg.split("=", 1)[1]
        if value is not None:
            try:
                return parse_size(value)
            except ValueError:
                return None
    return None


def _budgeted(cmd: Sequence[str]) -> bool:
    """Whether ``cmd`` runs a command that plans to a memory budget (``train_bpe.py``, ``bpe-core
    train``, ``python -m bpe_core encode``).

    >>> _budgeted(["bpe-core", "train", "c.txt"]), _budgeted(["python", "-m", "bpe_core", "encode"])
    (True, True)
    >>> _budgeted(["python", "tools/train_bpe.py"]), _budgeted(["bpe-core", "export"]), _budgeted(["ls"])
    (True, False, False)
    """
    names = [os.path.basename(c) for c in cmd]
    return any(n in BUDGETED_TOOLS for n in names) or any(
        a in ("bpe-core", "bpe_core") and b in BUDGETED_COMMANDS for a, b in zip(names, names[1:]))


def split_flag(argv: Sequence[str], flag: str = "--profile-memory") -> tuple[Optional[str], list[str]]:
    """Take ``flag VALUE`` (or ``flag=VALUE``) out of ``argv``: ``(value, the rest)``.

    A tool reruns itself under the profiler with the rest:

    >>> split_flag(["in.txt", "--profile-memory", "run1", "--vocab-size", "8000"])
    ('run1', ['in.txt', '--vocab-size', '8000'])
    >>> split_flag(["--profile-memory=p", "x"]), split_flag(["x"])
    (('p', ['x']), (None, ['x']))
    """
    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1], argv[:i] + argv[i + 2:]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1], argv[:i] + argv[i + 1:]
    return None, argv


# ==== Report ================================================================================


def build_report(cmd: Sequence[str], exit_code: int, interval: float, budget: Optional[int], t0: float,
                 t_end: float, samples: Sequence[tuple[float, int]], peak: int, peak_time: float,
                 phases: Sequence[tuple], budget_source: Optional[str] = None) -> dict:
    """The JSON document: times in seconds since the command started.

    Each phase lasts until the next one starts (the last one until the command ends); its ``peak``
    is the largest sample taken inside it, or at its two ends: a phase mark ``(time, name, rss)``
    carries the RSS the process measured as it started the phase (``memmon.phase``), so a phase
    shorter than the sampling interval still has a figure.

    >>> d = build_report(["x"], 0, 0.1, None, 100.0, 103.0, [(100.5, 10), (102.5, 30)], 30, 102.5,
    ...                  [(101.0, "a", 12), (101.1, "b", 14), (102.0, "c", 20)])
    >>> [(p["name"], p["start"], p["end"], p["peak_rss_bytes"]) for p in d["phases"]]
    [('a', 1.0, 1.1, 14), ('b', 1.1, 2.0, 20), ('c', 2.0, 3.0, 30)]
    """
    rel = [(round(t - t0, 4), int(r)) for t, r in samples]
    wall = round(t_end - t0, 4)
    marks = [tuple(p) + (None,) * (3 - len(p)) for p in phases]        # (time, name, rss or None)
    out_phases = []
    for i, (t, name, rss) in enumerate(marks):
        start = min(max(0.0, t - t0), wall)
        end = min((marks[i + 1][0] if i + 1 < len(marks) else t_end) - t0, wall)
        inside = [r for s, r in rel if start <= s <= end]
        ends = [r for r in (rss, marks[i + 1][2] if i + 1 < len(marks) else None) if r is not None]
        out_phases.append({"name": name, "start": round(start, 4), "end": round(max(start, end), 4),
                           "peak_rss_bytes": max(inside + ends, default=0)})
    for t, _, rss in marks:                          # a mark above every sample is the peak
        if rss is not None and rss > peak:
            peak, peak_time = rss, t
    peak_phase = next((p["name"] for p in out_phases if p["start"] <= peak_time - t0 <= p["end"]), None)
    return {
        "command": list(cmd),
        "exit_code": exit_code,
        "interval": interval,
        "budget_bytes": budget,
        "budget_source": budget_source if budget is not None else None,
        "start_unix": round(t0, 3),
        "wall_seconds": wall,
        "peak_rss_bytes": int(peak),
        "peak_seconds": round(max(0.0, peak_time - t0), 4) if samples else None,
        "peak_phase": peak_phase,
        "over_budget": bool(budget) and peak > budget,
        "n_samples": len(rel),
        "phases": out_phases,
        "samples": rel,
    }


# ==== Plot ==================================================================================

_PHASE_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]


def write_plot(data: dict, png_path: str) -> str:
    """Draw RSS over time with the budget line and the phases; write ``png_path`` atomically.

    Uses matplotlib's object API (no pyplot, no global backend change). Raises ``ImportError``
    when matplotlib is missing.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    samples = data["samples"]
    xs = [s for s, _ in samples]
    ys = [_mib(r) for _, r in samples]
    wall = max(data["wall_seconds"], xs[-1] if xs else 0.0, 1e-3)
    budget = data.get("budget_bytes")

    fig = Figure(figsize=(11, 5), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    high = max(ys + [1.0])
    # The budget sets the scale unless it is far above the curve (then the curve would be a flat
    # line at the bottom): the line is left out and the legend says where the budget is.
    budget_on_scale = bool(budget) and _mib(budget) <= 6 * high
    top = max(high, _mib(budget) if budget_on_scale else 0.0) * 1.25    # room for the labels

    # Phases: shaded bands, a label at the top of each (staggered when bands are narrow).
    for i, ph in enumerate(data["phases"]):
        color = _PHASE_COLORS[i % len(_PHASE_COLORS)]
        ax.axvspan(ph["start"], max(ph["end"], ph["start"] + wall * 0.002), color=color, alpha=0.13, lw=0)
        ax.axvline(ph["start"], color=color, lw=0.8, alpha=0.6)
        level = 0.98 - 0.05 * (i % 3)          # staggered: short phases do not overprint
        near_end = ph["start"] > 0.85 * wall
        x = ph["end"] - wall * 0.004 if near_end else ph["start"] + wall * 0.004
        ax.text(x, level, ph["name"], color=color, fontsize=9, va="top", ha="right" if near_end else "left",
                fontweight="bold", transform=ax.get_xaxis_transform(),
                bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none", alpha=0.7))

    ax.fill_between(xs, ys, color="#1f3b73", alpha=0.18, lw=0)
    ax.plot(xs, ys, color="#1f3b73", lw=1.4, label="RSS of the process tree")
    if budget_on_scale:
        ax.axhline(_mib(budget), color="#c0392b", ls="--", lw=1.5, label=f"budget {_mib(budget):,.0f} MiB")
    elif budget:
        ax.plot([], [], color="#c0392b", ls="--", lw=1.5,
                label=f"budget {_mib(budget):,.0f} MiB (above the plot, {budget / max(data['peak_rss_bytes'], 1):.0f}x the peak)")
    if samples:
        px = data["peak_seconds"]
        py = _mib(data["peak_rss_bytes"])
        ax.plot([px], [py], marker="o", color="#c0392b" if data["over_budget"] else "#1f3b73", ms=5)
        right = px > 0.8 * wall
        ax.annotate(f"peak {py:,.0f} MiB", (px, py), textcoords="offset points", xytext=(-6 if right else 6, 6),
                    ha="right" if right else "left", fontsize=9)
    ax.set_xlim(0, wall)
    ax.set_ylim(0, top)
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("RSS (MiB)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize=9, framealpha=0.9)
    title = " ".join(os.path.basename(c) if i < 2 else c for i, c in enumerate(data["command"]))
    title = " ".join(title.split())            # one line, even for ``python -c "..."``
    if len(title) > 150:
        title = title[:147] + "..."
    status = f"exit {data['exit_code']}"
    ax.set_title(f"{title}\npeak {_mib(data['peak_rss_bytes']):,.0f} MiB, {data['wall_seconds']:.1f} s, {status}",
                 fontsize=10)

    tmp, commit = atomic_path(png_path)
    try:
        fig.savefig(tmp, format="png")
        commit()
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return png_path


def _mib(n: Optional[int]) -> float:
    return (n or 0) / MiB


__all__ = ["ProfileResult", "budget_from_command", "build_report", "profile_command", "split_flag",
           "write_plot"]
