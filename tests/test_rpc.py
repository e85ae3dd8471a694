"""A target split across machines with llama.cpp's RPC backend, on loopback: `localspec worker`
processes on free 127.0.0.1 ports, started and stopped by the tests."""

import json
import signal
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from localspec.config import Lending
from localspec.engine import rpc

from processes import localspec_process, stop

WORKER_START_SECONDS = 60


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Worker:
    """`localspec worker --port P` in a subprocess, ready once it answers the RPC handshake."""

    def __init__(self, home: Path, *args):
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.log_file = home / f"worker-{self.port}.log"
        home.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "wb") as log:
            self.process = localspec_process(home, "worker", "--port", self.port, *args, stdout=log,
                                             stderr=subprocess.STDOUT)
        deadline = time.monotonic() + WORKER_START_SECONDS
        while True:
            try:
                rpc.greet_worker(self.endpoint, timeout=5)
                return
            except Exception:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.process.kill()
                    raise AssertionError(f"the worker did not start: {self.log()}") from None
                time.sleep(0.2)

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    def stop(self, sig=signal.SIGINT) -> int:
        return stop(self.process, sig)


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    home = tmp_path_factory.mktemp("workers")
    started = [Worker(home), Worker(home)]
    yield started
    for worker in started:
        assert worker.stop() == 0, worker.log()


def run_json(localspec, *args) -> dict:
    result = localspec("run", *args, "--json")
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


def test_this_build_has_rpc_and_doctor_lists_the_workers_devices(localspec, workers):
    assert rpc.supports_rpc()
    endpoints = ",".join(w.endpoint for w in workers)
    result = localspec("doctor", "--rpc", endpoints, "--json")
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(result.stdout)
    remote = [d for d in report["machine"]["devices"] if d["remote"]]
    assert [d["description"] for d in remote] == [w.endpoint for w in workers]
    assert all(d["kind"] == "RPC worker" and d["free"] > 0 for d in remote)
    assert report["machine"]["rpc"] and not report["machine"]["gpu_offload"]
    shown = localspec("doctor", "--rpc", endpoints)
    assert b"With --rpc" in shown.stdout and workers[0].endpoint.encode() in shown.stdout


@pytest.mark.parametrize("drafting", [["--draft", "same", "--spec", "fixed"], ["--draft", "ngram", "--spec", "fixed"]],
                         ids=["draft model", "ngram"])
def test_a_model_split_across_two_workers_and_this_cpu_says_what_it_says_alone(localspec, tiny, workers, drafting):
    drafting = [tiny["same"] if arg == "same" else arg for arg in drafting]
    common = [tiny["target"], *drafting, "--prompt", "the cat sat on the mat", "--temp", "0", "-n", "48",
              "--p-min", "0"]
    alone = run_json(localspec, *common)
    endpoints = ",".join(w.endpoint for w in workers)
    # 2 of the tiny model's 3 layers (its 2 blocks and the output layer) go to the workers, one each
    split = run_json(localspec, *common, "--rpc", endpoints, "--gpu-layers", "2")
    assert split["text"] == alone["text"]
    assert split["stats"]["drafted"] > 0 and split["stats"]["accepted"] == alone["stats"]["accepted"]
    target = split["placement"]["target"]
    assert target["layers_on_gpu"] == 2 and target["devices"] == ["RPC0", "RPC1", "CPU"]
    if "draft" in split["placement"]:  # the draft model stays on this machine
        assert split["placement"]["draft"]["devices"] == ["CPU"]


def test_without_a_gpu_this_machine_keeps_its_share_of_the_layers(localspec, tiny, workers):
    split = run_json(localspec, tiny["target"], "--prompt", "hi", "-n", "2", "--rpc",
                     ",".join(w.endpoint for w in workers))
    # the workers run on this machine: three equal shares of free memory, two of them remote
    assert split["placement"]["target"]["layers_on_gpu"] == 2
    assert split["placement"]["target"]["devices"] == ["RPC0", "RPC1", "CPU"]


def test_an_unreachable_worker_is_refused_before_anything_loads(cli, tiny):
    closed = free_port()
    code, _, err = cli("run", tiny["target"], "--prompt", "hi", "--rpc", f"127.0.0.1:{closed}")
    assert code == 2 and f"cannot reach the RPC worker at 127.0.0.1:{closed}" in err
    assert len(err.strip().splitlines()) == 1


def test_a_server_that_is_not_a_worker_is_refused(cli, tiny):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]

        def answer_in_http() -> None:
            connection, _ = listener.accept()
            with connection:
                connection.recv(64)
                connection.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        thread = threading.Thread(target=answer_in_http)
        thread.start()
        code, _, err = cli("run", tiny["target"], "--prompt", "hi", "--rpc", f"127.0.0.1:{port}")
        thread.join(timeout=10)
    assert code == 2 and "does not speak llama.cpp's RPC protocol" in err


@pytest.mark.parametrize("value, message", [("localhost", "--rpc takes HOST:PORT"), ("127.0.0.1:0", "--rpc takes"),
                                            ("127.0.0.1:99999", "--rpc takes")])
def test_rpc_option_mistakes(cli, tiny, value, message):
    code, _, err = cli("run", tiny["target"], "--prompt", "hi", "--rpc", value)
    assert code == 2 and message in err


def test_tensor_split_mistakes(cli, tiny):
    code, _, err = cli("run", tiny["target"], "--prompt", "hi", "--tensor-split", "3,x")
    assert code == 2 and "--tensor-split takes numbers" in err
    code, _, err = cli("run", tiny["target"], "--prompt", "hi", "--tensor-split", "0,0")
    assert code == 2 and "not all 0" in err


def long_run(tiny, home: Path, endpoint: str) -> subprocess.Popen:
    """The tiny target on a worker, generating until its 4,096-token context is full (seconds)."""
    return localspec_process(home, "run", tiny["target"], "--rpc", endpoint, "--prompt", "abc", "-n", "-1",
                             "-c", "4096", "--no-draft", stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_for(condition, seconds=60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_worker_killed_mid_generation_ends_the_run_with_one_line(tiny, tmp_path):
    worker = Worker(tmp_path / "home")
    run = long_run(tiny, tmp_path / "home", worker.endpoint)
    try:
        run.stdout.read(8)  # it is generating on the worker
        worker.process.kill()
        worker.process.wait(timeout=30)
        _, err = run.communicate(timeout=60)
    finally:
        run.kill()
    lines = err.decode().strip().splitlines()
    assert run.returncode == 4
    assert lines[-1].startswith("error: llama.cpp stopped:") and f"the RPC worker at {worker.endpoint} is gone" in lines[-1]
    assert "Traceback" not in err.decode() and "backtrace" not in err.decode()


class Partition:
    """Forwards a port of 127.0.0.1 to a worker until cut(): then it stops forwarding and listening but
    keeps the connections open, silent, as when the worker's machine drops off the network."""

    def __init__(self, worker: Worker):
        self.worker_port = worker.port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.cut_off = threading.Event()
        self.connections: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.worker_port))
            self.connections += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        while True:
            try:
                data = source.recv(1 << 16)
                if self.cut_off.is_set():
                    return
                if not data:
                    sink.shutdown(socket.SHUT_WR)
                    return
                sink.sendall(data)
            except OSError:
                return

    def cut(self) -> None:
        self.cut_off.set()
        self.listener.close()

    def close(self) -> None:
        for connection in self.connections:
            connection.close()


def test_a_worker_that_drops_off_the_network_ends_the_run_within_bounded_time(tiny, tmp_path):
    worker = Worker(tmp_path / "home")
    partition = Partition(worker)
    run = long_run(tiny, tmp_path / "home", partition.endpoint)
    try:
        run.stdout.read(8)
        partition.cut()  # llama.cpp alone would wait on the silent connection for good
        _, err = run.communicate(timeout=60)
    finally:
        run.kill()
        partition.close()
        worker.stop()
    lines = err.decode().strip().splitlines()
    assert run.returncode == 4
    assert f"has waited {rpc.RPC_STALL_SECONDS} s for the RPC workers" in lines[-1]
    assert f"the RPC worker at {partition.endpoint} is gone" in lines[-1]


def test_a_batch_records_the_item_a_dead_worker_stopped_and_stops(tiny, tmp_path):
    worker = Worker(tmp_path / "home")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps(item) for item in [
        {"id": "short", "prompt": "abc", "max_tokens": 4},
        {"id": "long", "prompt": "abc", "max_tokens": 4000},
        {"id": "never", "prompt": "abc", "max_tokens": 4},
    ]) + "\n")
    answers = tmp_path / "answers.jsonl"
    batch = localspec_process(tmp_path / "home", "batch", tiny["target"], prompts, "-o", answers, "--rpc",
                              worker.endpoint, "-c", "4096", "--no-draft", "-np", "1", stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    try:
        _wait_for(lambda: answers.exists() and answers.read_text().count("\n") >= 1)
        time.sleep(0.5)  # into the long item
        worker.process.kill()
        _, err = batch.communicate(timeout=60)
    finally:
        batch.kill()
    assert batch.returncode == 4, err.decode()
    records = [json.loads(line) for line in answers.read_text().splitlines()]
    assert [r["id"] for r in records] == ["short", "long"]
    assert "text" in records[0] and records[1]["error"].startswith("llama.cpp stopped:")


def test_worker_stops_on_sigterm_and_refuses_a_port_in_use(cli, tmp_path):
    worker = Worker(tmp_path / "home")
    assert worker.stop(signal.SIGTERM) == 0
    assert "lending" in worker.log() and "stopped" in worker.log()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        code, _, err = cli("worker", "--port", taken.getsockname()[1])
    assert code == 2 and "cannot listen on 127.0.0.1" in err


def _message(connection: socket.socket, command: int, payload: bytes) -> bytes | None:
    """One RPC command as llama.cpp's client frames it, and the answer (None where the connection ended)."""
    connection.sendall(bytes([command]) + struct.pack("<Q", len(payload)) + payload)
    head = connection.recv(8)
    if len(head) < 8:
        return None
    size = struct.unpack("<Q", head)[0]
    answer = b""
    while len(answer) < size and (chunk := connection.recv(size - len(answer))):
        answer += chunk
    return answer


ALLOC_BUFFER, GET_TENSOR = 0, 8  # enum rpc_cmd in ggml-rpc.cpp


def test_a_message_llama_cpps_rpc_server_asserts_on_ends_one_session_not_the_worker(tmp_path):
    # a GET_TENSOR whose tensor lies outside its buffer ended the whole worker with GGML_ASSERT (issue 46)
    worker = Worker(tmp_path / "home")
    try:
        with socket.create_connection(("127.0.0.1", worker.port), timeout=30) as attacker:
            assert _message(attacker, rpc.RPC_HELLO, bytes(rpc.RPC_CONN_CAPS_SIZE))
            buffer = struct.unpack("<QQ", _message(attacker, ALLOC_BUFFER, struct.pack("<IQ", 0, 1024)))[0]
            tensor = struct.pack("<QIQ4I4II16ii10QQQQ64si", 1, 0, buffer, 1, 1, 1, 1, 4, 4, 4, 4, 0, *[0] * 16, 0,
                                 *[0] * 10, 0, 0, 0, b"x", 0)  # F32, in a real buffer, its data at address 0
            assert _message(attacker, GET_TENSOR, tensor + struct.pack("<QQ", 0, 4)) is None
        _wait_for(lambda: "ended (signal SIGABRT)" in worker.log(), 30)
        _wait_for(lambda: _greets(worker.endpoint), 30)  # lending again
        assert worker.process.poll() is None
    finally:
        assert worker.stop() == 0, worker.log()


def _greets(endpoint: str) -> bool:
    try:
        rpc.greet_worker(endpoint, timeout=5)
    except Exception:
        return False
    return True


def test_worker_mistakes_are_one_line_before_it_listens(cli, tmp_path):
    """A --cache-dir that is a file was a FileExistsError traceback; -t 1000 was taken (issue 30, item 13)."""
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    port = free_port()
    # an unknown device as well: without the threads check the worker fails on it instead of lending forever
    for args, message in [(("-t", "1000", "-d", "NOPE"), "threads must be at most"),
                          (("-t", "-1", "-d", "NOPE"), "threads must be >= 1"),
                          (("--cache-dir", a_file), "is a file, not a folder"),
                          (("--cache-dir", a_file / "below"), "cannot be made a folder: Not a directory")]:
        code, _, err = cli("worker", "--port", port, *args)
        assert code == 2 and message in err and len(err.splitlines()) == 1, (args, err)


def test_a_worker_others_can_reach_is_warned_about():
    assert Lending().exposure_warning is None
    assert "no authentication" in Lending(host="0.0.0.0").exposure_warning


@pytest.mark.slow
def test_real_qwen_pair_split_across_two_workers_says_what_it_says_alone(localspec, real_model, workers):
    target, draft = real_model("qwen2.5-coder-1.5b"), real_model("qwen2.5-coder-0.5b")
    # a worker computes with the weights' file layout: compare with a local run that does too
    common = [target, "--draft", draft, "--spec", "fixed", "--temp", "0", "-n", "48", "--no-repack", "--prompt",
              "Write a Python function that returns the n-th Fibonacci number."]
    alone = run_json(localspec, *common)
    split = run_json(localspec, *common, "--rpc", ",".join(w.endpoint for w in workers))
    assert split["text"] == alone["text"]
    assert split["placement"]["target"]["devices"] == ["RPC0", "RPC1", "CPU"]  # a third stays here
    assert split["placement"]["draft"]["devices"] == ["CPU"]
    assert split["stats"]["accepted"] > 0 and split["stats"]["drafted"] == alone["stats"]["drafted"]
