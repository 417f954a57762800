"""The fault harness: a real ``dask scheduler`` and ``dask worker`` processes (127.0.0.1, one thread,
no dashboard), and the tools run against them as a user runs them; faults are made at a known phase.

The phase is made deterministic by ``executors.TASK_GATE_ENV``: each task of the run writes a
``started-<pid>-...`` file into a folder, then waits for a ``go`` file there. A test waits for the
first task to start, makes its fault (kills the scheduler, one worker, every worker; sends SIGINT
or SIGTERM), then lets the tasks go. Each run must end within its bound with the single-node result
(merges, ids: byte for byte) or one clean line on stderr (exit 75 for the cluster, 130 / 143 for a
signal), nothing written, and no process left behind (everything the tool started is in its
session: none may outlive it).

One case of each kind runs by default; ``--slow`` runs the others (the other tool, the other signal
delivery, SIGTERM, a local cluster's workers killed). Every subprocess has a timeout and is killed in teardown.
"""
from paths import FIXTURES, TOOLS, package_parent
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

pytest.importorskip("distributed")
psutil = pytest.importorskip("psutil")

from bpe_core.errors import ClusterError  # noqa: E402
from bpe_core.runtime import executors  # noqa: E402
from bpe_core.runtime.executors import TASK_GATE_ENV, open_executor  # noqa: E402

#: ``--cluster-timeout`` of the runs here: how long a run may go without a worker.
TIMEOUT = 3
#: What a run may take beyond its bound on a loaded 2-core machine (start-up, the watch's period).
SLACK = 25
#: The most any subprocess of this module may live.
HARD = 120
slow = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra) -> dict:
    env = dict(os.environ, PYTHONPATH=package_parent(), **extra)
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    return env


def _kill_tree(pid: int) -> None:
    try:
        procs = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass


def _session(sid: int) -> list:
    """The live processes of session ``sid`` (what a tool started as a session leader left)."""
    out = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getsid(p.pid) == sid:
                out.append(p)
        except (OSError, psutil.Error):
            pass
    return out


class Cluster:
    """``dask scheduler`` and ``n`` ``dask worker`` processes (each with its nanny), each in its own
    session; ``close`` kills whatever is left."""

    def __init__(self, n_workers: int):
        self.port = _free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.procs: list = []
        self.scheduler = self._start(["dask", "scheduler", "--host", "127.0.0.1", "--port", str(self.port),
                                      "--no-dashboard"])
        self.workers = []
        try:
            self._wait_listening()
            for _ in range(n_workers):
                self.workers.append(self._start(["dask", "worker", self.address, "--nthreads", "1",
                                                 "--no-dashboard", "--host", "127.0.0.1"]))
            if n_workers:
                self._wait_workers(n_workers)
        except BaseException:
            self.close()
            raise

    def _start(self, cmd):
        exe = os.path.join(os.path.dirname(sys.executable), "dask")
        p = subprocess.Popen([exe if os.path.exists(exe) else cmd[0], *cmd[1:]], env=_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(p)
        return p

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("the scheduler did not start")

    def _wait_workers(self, n: int) -> None:
        import distributed

        with distributed.Client(self.address, timeout="30s") as c:
            c.wait_for_workers(n, timeout=60)

    def worker_pids(self, worker) -> list[int]:
        """The nanny's pid and its worker process's."""
        try:
            return [worker.pid] + [c.pid for c in psutil.Process(worker.pid).children(recursive=True)]
        except psutil.Error:
            return [worker.pid]

    def kill_worker_of(self, pid: int) -> None:
        """SIGKILL the worker process ``pid`` and its nanny."""
        for w in self.workers:
            if pid in self.worker_pids(w):
                _kill_tree(w.pid)
                return
        raise AssertionError(f"no worker process {pid}")

    def kill_workers(self) -> None:
        for w in self.workers:
            _kill_tree(w.pid)

    def kill_scheduler(self) -> None:
        self.scheduler.kill()

    def close(self) -> None:
        for p in self.procs:
            _kill_tree(p.pid)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


@pytest.fixture
def cluster2():
    c = Cluster(2)
    yield c
    c.close()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """About 140 KB of English with document separators: 35 shards of 4 KiB."""
    text = (FIXTURES / "corpus.en").read_bytes()
    stories = (FIXTURES / "tinystories_sample.txt").read_bytes()
    parts = text.split(b"\n\n")
    body = b"<|endoftext|>".join(parts[i] + (stories if i % 50 == 0 else b"") for i in range(len(parts)))
    path = tmp_path_factory.mktemp("faults") / "corpus.txt"
    path.write_bytes(body)
    return str(path)


TRAIN = ["--vocab-size", "400", "--chunk-bytes", "4K", "--progress", "none"]


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """The single-node merges and model, a tokenizer, and the single-node ids."""
    d = tmp_path_factory.mktemp("reference")
    r = subprocess.run([sys.executable, str(TOOLS / "train_bpe.py"), corpus, *TRAIN, "--out", str(d / "tok")],
                       env=_env(), capture_output=True, timeout=HARD)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, str(TOOLS / "encode_corpus.py"), corpus, "--tokenizer", str(d / "tok"),
                        "--out", str(d / "ids.npy"), "--progress", "none"], env=_env(), capture_output=True,
                       timeout=HARD)
    assert r.returncode == 0, r.stderr
    return {"merges": (d / "tok" / "merges.txt").read_bytes(), "tok": str(d / "tok"),
            "ids": np.load(d / "ids.npy")}


class Run:
    """A tool run in its own session with the task gate at ``gate``; ``wait`` returns (exit code,
    stderr lines, seconds) and checks that nothing of the session outlives it."""

    def __init__(self, tool: str, args: list, gate, preexec=None):
        self.gate = gate
        gate.mkdir(exist_ok=True)
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, str(TOOLS / tool), *args], env=_env(**{TASK_GATE_ENV: str(gate)}),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True, preexec_fn=preexec or _default_sigint)

    def started(self, timeout: float = 90) -> int:
        """The pid of the worker process that runs the first task, once it started."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            names = [n for n in os.listdir(self.gate) if n.startswith("started-")]
            if names:
                return int(names[0].split("-")[1])
            if self.proc.poll() is not None:
                raise AssertionError(f"the run ended before a task started: {self.proc.stderr.read()!r}")
            time.sleep(0.02)
        raise AssertionError("no task started")

    def workers_spawned(self, n: int = 2, timeout: float = 90) -> None:
        """Once ``n`` worker processes of a local cluster exist (they are still starting)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                kids = psutil.Process(self.proc.pid).children(recursive=True)
                if sum("--multiprocessing-fork" in " ".join(k.cmdline()) for k in kids) >= n:
                    return
            except psutil.Error:
                pass
            time.sleep(0.01)
        raise AssertionError("the worker processes did not start")

    def go(self) -> None:
        (self.gate / "go").touch()

    def wait(self, timeout: float = HARD):
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.communicate()
            raise AssertionError(f"still running after {timeout} s") from None
        seconds = time.monotonic() - self.t0
        deadline = time.monotonic() + 10           # workers that see their parent go exit at once
        while _session(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = _session(self.proc.pid)
        for p in left:
            p.kill()
        assert not left, f"processes left behind: {[' '.join(p.cmdline())[:80] for p in left]}"
        return self.proc.returncode, err.decode(errors="replace").splitlines(), seconds

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.communicate()


@pytest.fixture
def runs():
    started: list = []
    yield started
    for r in started:
        r.kill()


def _train(runs, tmp_path, corpus, cluster, *extra, preexec=None):
    r = Run("train_bpe.py", [corpus, *TRAIN, "--out", str(tmp_path / "tok"), "--cluster", cluster,
                             "--cluster-timeout", str(TIMEOUT), *extra], tmp_path / "gate", preexec)
    runs.append(r)
    return r


def _encode(runs, tmp_path, corpus, reference, cluster, *extra, preexec=None):
    r = Run("encode_corpus.py", [corpus, "--tokenizer", reference["tok"], "--out", str(tmp_path / "ids.npy"),
                                 "--chunk-size", "4K", "--progress", "none", "--cluster", cluster,
                                 "--cluster-timeout", str(TIMEOUT), *extra], tmp_path / "gate", preexec)
    runs.append(r)
    return r


def _one_line(code, err, want_code, *words):
    assert code == want_code and len(err) == 1 and "Traceback" not in err[0], (code, err)
    for w in words:
        assert w in err[0], err


def _nothing_written(tmp_path):
    assert not (tmp_path / "tok").exists() and not (tmp_path / "ids.npy").exists()
    assert not [n for n in os.listdir(tmp_path) if n not in ("gate",)], os.listdir(tmp_path)


# ==== Not a scheduler: one line within CONNECT_SECONDS ========================================


class _Server:
    """A TCP server on 127.0.0.1 that says nothing, answers HTTP, or sends garbage."""

    def __init__(self, kind: str):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.1)
        self.address = f"tcp://127.0.0.1:{self.sock.getsockname()[1]}"
        self.kind, self.conns, self.stop = kind, [], threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.conns.append(conn)
            try:
                if self.kind == "http":
                    conn.settimeout(5)
                    conn.recv(4096)
                    conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                elif self.kind == "garbage":
                    conn.sendall(b"\xff" * 64)
            except OSError:
                pass

    def close(self):
        self.stop.set()
        self.thread.join()
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.mark.parametrize("kind, words", [("silent", "sent nothing in 1 s"), ("garbage", "not Dask's protocol"),
                                         ("http", "sent nothing in 1 s")])
def test_not_a_scheduler_is_one_line_within_the_connect_bound(monkeypatch, kind, words):
    """A server that accepts and says nothing (Dask waited for ever), an HTTP server (it waits for a
    request: the same), garbage (Dask read it as a frame length: 'Unable to allocate 3.07 EiB')."""
    monkeypatch.setattr(executors, "CONNECT_SECONDS", 1.0)
    server = _Server(kind)
    try:
        t0 = time.monotonic()
        with pytest.raises(ClusterError) as info:
            with open_executor(server.address):
                pass
        assert time.monotonic() - t0 < 1.0 + 3
    finally:
        server.close()
    message = str(info.value)
    assert "is not a Dask scheduler" in message and words in message and "\n" not in message
    assert "MemoryError" not in message and "allocate" not in message


def test_a_reply_that_looks_like_dask_but_is_not(monkeypatch):
    """Eight bytes of a plausible length, then no handshake: refused, not handed to Dask."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def serve():
        conn, _ = srv.accept()
        with conn:
            conn.sendall((40).to_bytes(8, "little") + b"x" * 40)
            time.sleep(0.5)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with pytest.raises(ClusterError, match="not Dask's protocol"):
            executors._check_reachable(f"tcp://127.0.0.1:{srv.getsockname()[1]}", timeout=2)
    finally:
        t.join(5)
        srv.close()


# ==== A scheduler without workers: "no worker joined" within the bound ==========================


@pytest.mark.parametrize("tool", ["train", pytest.param("encode", marks=slow)])
def test_a_scheduler_without_workers_is_one_line(tmp_path, corpus, reference, runs, tool):
    c = Cluster(0)
    try:
        r = _train(runs, tmp_path, corpus, c.address) if tool == "train" else \
            _encode(runs, tmp_path, corpus, reference, c.address)
        code, err, seconds = r.wait()
    finally:
        c.close()
    _one_line(code, err, 75, "no worker joined the Dask scheduler", c.address, "--cluster-timeout")
    assert seconds < TIMEOUT + SLACK
    _nothing_written(tmp_path)


# ==== Faults mid-run on an external cluster ========================================================


@pytest.mark.parametrize("tool", ["train", pytest.param("encode", marks=slow)])
def test_losing_one_worker_of_two_changes_nothing(tmp_path, corpus, reference, cluster2, runs, tool):
    """The worker running the first task dies with its nanny (SIGKILL) while the task waits; Dask
    runs it again on the other: the same merges / ids, byte for byte."""
    r = _train(runs, tmp_path, corpus, cluster2.address) if tool == "train" else \
        _encode(runs, tmp_path, corpus, reference, cluster2.address)
    victim = r.started()
    cluster2.kill_worker_of(victim)
    r.go()
    code, err, seconds = r.wait()
    assert code == 0, err
    if tool == "train":
        assert (tmp_path / "tok" / "merges.txt").read_bytes() == reference["merges"]
    else:
        assert np.array_equal(np.load(tmp_path / "ids.npy"), reference["ids"])


@pytest.mark.parametrize("tool", [pytest.param("train", marks=slow), "encode"])
def test_losing_every_worker_is_one_line_within_the_bound(tmp_path, corpus, reference, cluster2, runs, tool):
    """Every worker and nanny SIGKILLed while the first tasks wait: Dask would wait for a worker for
    ever; the run stops ``--cluster-timeout`` seconds later, writes nothing, leaves nothing."""
    r = _train(runs, tmp_path, corpus, cluster2.address) if tool == "train" else \
        _encode(runs, tmp_path, corpus, reference, cluster2.address)
    r.started()
    t_fault = time.monotonic()
    cluster2.kill_workers()
    code, err, _ = r.wait()
    _one_line(code, err, 75, "every worker of the Dask cluster", "is gone", "dask worker")
    assert time.monotonic() - t_fault < TIMEOUT + SLACK
    _nothing_written(tmp_path)


@pytest.mark.parametrize("tool", ["train", pytest.param("encode", marks=slow)])
def test_losing_the_scheduler_is_one_line(tmp_path, corpus, reference, cluster2, runs, tool):
    """The scheduler SIGKILLed while tasks run: not 60-76 lines of FutureCancelledError."""
    r = _train(runs, tmp_path, corpus, cluster2.address) if tool == "train" else \
        _encode(runs, tmp_path, corpus, reference, cluster2.address)
    r.started()
    t_fault = time.monotonic()
    cluster2.kill_scheduler()
    code, err, _ = r.wait()
    _one_line(code, err, 75, "lost the Dask scheduler", cluster2.address)
    assert time.monotonic() - t_fault < TIMEOUT + SLACK
    _nothing_written(tmp_path)


# ==== Ctrl-C and SIGTERM with --cluster local:2 ===================================================


def _signal_group(r):
    os.killpg(r.proc.pid, signal.SIGINT)


def _signal_parent(r):
    r.proc.send_signal(signal.SIGINT)


def _default_sigint():
    """As from a terminal: a test run in the background of a script inherits SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("tool, send, when", [
    ("train", "group", "tasks"),
    ("train", "group", "start"),
    pytest.param("train", "parent", "tasks", marks=slow),
    pytest.param("encode", "group", "tasks", marks=slow),
    pytest.param("encode", "group", "start", marks=slow),
    pytest.param("encode", "parent", "tasks", marks=slow),
])
def test_ctrl_c_with_a_local_cluster_is_one_line(tmp_path, corpus, reference, runs, tool, send, when):
    """SIGINT to the whole process group (a terminal's Ctrl-C) or to the tool alone, while the
    workers run tasks or while they start (import): one line, 130, no worker's KeyboardInterrupt
    traceback, no process left."""
    r = _train(runs, tmp_path, corpus, "local:2") if tool == "train" else \
        _encode(runs, tmp_path, corpus, reference, "local:2")
    if when == "tasks":
        r.started()
    else:
        r.workers_spawned()
    (_signal_group if send == "group" else _signal_parent)(r)
    code, err, seconds = r.wait()
    _one_line(code, err, 130, "interrupted")
    _nothing_written(tmp_path)


@slow
@pytest.mark.parametrize("tool", ["train", "encode"])
def test_sigterm_with_a_local_cluster_is_one_line(tmp_path, corpus, reference, runs, tool):
    r = _train(runs, tmp_path, corpus, "local:2") if tool == "train" else \
        _encode(runs, tmp_path, corpus, reference, "local:2")
    r.started()
    r.proc.send_signal(signal.SIGTERM)
    code, err, _ = r.wait()
    _one_line(code, err, 143, "terminated (SIGTERM)")
    _nothing_written(tmp_path)


@pytest.mark.parametrize("tool", ["train", pytest.param("encode", marks=slow)])
def test_sigint_to_a_background_job_with_a_local_cluster_changes_nothing(tmp_path, corpus, reference, runs, tool):
    """A background job of a script ignores SIGINT (SIG_IGN): a Ctrl-C to its process group neither
    stops the run nor kills its workers (the run hung); it ends as without it."""
    r = _train(runs, tmp_path, corpus, "local:2", preexec=_ignore_sigint) if tool == "train" else \
        _encode(runs, tmp_path, corpus, reference, "local:2", preexec=_ignore_sigint)
    r.started()
    _signal_group(r)
    time.sleep(0.5)
    r.go()
    code, err, _ = r.wait()
    assert code == 0, err
    if tool == "train":
        assert (tmp_path / "tok" / "merges.txt").read_bytes() == reference["merges"]
    else:
        assert np.array_equal(np.load(tmp_path / "ids.npy"), reference["ids"])


@slow
@pytest.mark.parametrize("tool", ["train", "encode"])
def test_local_workers_killed_mid_run(tmp_path, corpus, reference, runs, tool):
    """Both worker processes of ``local:2`` SIGKILLed while tasks run: their nannies start new ones
    and Dask runs the tasks again (the same result), or, if a task keeps losing its worker, one line."""
    r = _train(runs, tmp_path, corpus, "local:2") if tool == "train" else \
        _encode(runs, tmp_path, corpus, reference, "local:2")
    r.started()
    for p in psutil.Process(r.proc.pid).children(recursive=True):
        if "multiprocessing-fork" in " ".join(p.cmdline()) and "resource_tracker" not in " ".join(p.cmdline()):
            p.kill()
    r.go()
    code, err, _ = r.wait()
    if code == 0:
        if tool == "train":
            assert (tmp_path / "tok" / "merges.txt").read_bytes() == reference["merges"]
        else:
            assert np.array_equal(np.load(tmp_path / "ids.npy"), reference["ids"])
    else:
        _one_line(code, err, 75)
        _nothing_written(tmp_path)


# ==== Workers there, but no task finishes ===========================================================


def _echo(x):
    return x


def test_no_task_finishing_is_one_error_within_the_stall_bound(tmp_path, monkeypatch):
    """Workers connected but every task stuck (here: held by the gate): ``ClusterError`` after
    ``stall_seconds`` (4 timeouts for tasks that read nothing), not a wait for ever."""
    import logging

    import distributed

    monkeypatch.setenv(TASK_GATE_ENV, str(tmp_path))
    cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                       dashboard_address="127.0.0.1:0", silence_logs=logging.CRITICAL)
    client = distributed.Client(cluster)
    try:
        with open_executor(client, timeout=0.5) as ex:
            assert ex.stall_seconds([1, 2]) == 2.0
            t0 = time.monotonic()
            with pytest.raises(ClusterError, match=r"no task finished for 2 s .* \(1 worker\(s\) connected\)"):
                ex.map(_echo, [1, 2])
            assert 2.0 <= time.monotonic() - t0 < 2.0 + 10
    finally:
        (tmp_path / "go").touch()
        client.close()
        cluster.close()
