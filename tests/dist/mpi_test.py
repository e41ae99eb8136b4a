#!/usr/bin/env python3
"""Expert parallelism under OpenMPI's mpirun on loopback: `ds41 run|serve|bench` across 2 and 4 ranks
against one process, on the tiny preset, and the job's failures.

Checked: greedy tokens and every step's top-5 logits (run --json) identical to one process for a
150-token prefill + decode, chunked prefill, DSpark, a saved session continued, each rank's experts
streamed from disk, per-host copies made by `ds41 split`; `ds41 serve` answers (single, concurrent = batched
steps, streamed) identical to a single-process server's; `ds41 bench` per-rank figures; a rank
whose checkpoint is truncated, a rank with another binary, and a rank killed mid-job each end the
job with an error on rank 0 and no hang.

Usage: mpi_test.py DS41_BINARY SHARED_DIR
Exit 77 (CTest: skipped) when mpirun is not installed.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
from server_process import BANNER  # noqa: E402  (the startup line that names the port)

DS41 = None
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")
TIMEOUT = 240  # seconds any one job may take (a hang fails the test instead of blocking CI)


def mpirun(n, args):
    return ["mpirun", "--oversubscribe", "-np", str(n), DS41] + args


def run(cmd, check=True, cwd=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=TIMEOUT, cwd=cwd)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p


def run_json(ranks, args):
    cmd = [DS41] + args if ranks == 1 else mpirun(ranks, args)
    out = json.loads(run(cmd).stdout)
    assert out["ranks"] == ranks, (out["ranks"], ranks)
    return out


def same_run(a, b, what):
    assert a["generated"] == b["generated"], (what, a["generated"], b["generated"])
    assert a["steps"] == b["steps"], (what, "top-5 logits differ")


class Server:
    """`ds41 serve --port 0` (alone or under mpirun): the server binds a free port itself and its
    banner says which. A port picked here and passed in could be taken meanwhile, e.g. by one of
    mpirun's own TCP listeners, which then receives our HTTP probes."""

    def __init__(self, cmd):
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=ENV)
        self.lines = []
        self.port = None
        self.banner = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line)
            m = BANNER.search(line)
            if m and self.port is None:
                self.port = int(m.group(1))
                self.banner.set()
        self.banner.set()

    def stderr(self):
        self.reader.join(timeout=10)
        return "".join(self.lines)

    def wait_ready(self):
        if not self.banner.wait(TIMEOUT) or self.port is None:
            self.proc.wait(timeout=10)
            raise AssertionError("server ended before listening: " + self.stderr()[-3000:])
        self.base = f"http://127.0.0.1:{self.port}"
        for _ in range(1200):
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise AssertionError("server ended: " + self.stderr()[-3000:])
            time.sleep(0.1)
        raise AssertionError("server not ready")


def post(base, body):
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
        return r.read().decode()


def serve_answers(ranks, model):
    """Answers of a server: one request, four at once (batched steps), one streamed."""
    args = ["serve", "-m", model, "--model-name", "m", "--port", "0", "--threads", "1", "--temp", "0",
            "--max-batch", "4"]
    server = Server([DS41] + args if ranks == 1 else mpirun(ranks, args))
    proc = server.proc
    try:
        server.wait_ready()
        base = server.base
        answers = {}

        def ask(key, text, n, stream=False):
            body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": n, "stream": stream}
            raw = post(base, body)
            if stream:
                parts = []
                for line in raw.splitlines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        for ch in json.loads(line[6:]).get("choices", []):
                            parts.append(ch.get("delta", {}).get("content") or "")
                answers[key] = "".join(parts)
            else:
                answers[key] = json.loads(raw)["choices"][0]["message"]["content"]

        ask("single", "Tell me about the sea.", 12)
        threads = [threading.Thread(target=ask, args=(f"batch{i}", f"Question number {i}: why?", 10 + i))
                   for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ask("stream", "Tell me about the sea.", 12, stream=True)
        assert answers["stream"] == answers["single"], answers
        return answers
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError("the server did not stop on SIGINT")


def check_run_modes(model, tmp):
    prompt = ",".join(str((i * 7919) % 120000) for i in range(1, 151))
    base = ["run", "-m", model, "--tokens", prompt, "-n", "10", "--threads", "1", "--json"]
    one = run_json(1, base)
    for ranks in (2, 4):
        same_run(one, run_json(ranks, base), f"run, {ranks} ranks")
    same_run(one, run_json(2, base + ["--chunk", "37"]), "chunked prefill, 2 ranks")
    dspark_one = run_json(1, base + ["--dspark"])
    same_run(one, dspark_one, "dspark, 1 rank")
    for ranks in (2, 4):
        same_run(dspark_one, run_json(ranks, base + ["--dspark"]), f"dspark, {ranks} ranks")
    # A session saved under mpirun and continued in one process, and the other way round.
    sess = os.path.join(tmp, "s.ds41")
    first = ["run", "-m", model, "--tokens", prompt, "-n", "6", "--threads", "1", "--json", "--save-session", sess]
    run_json(2, first)
    cont = ["run", "-m", model, "--tokens", "11,12,13", "-n", "6", "--threads", "1", "--json", "--load-session", sess]
    same_run(run_json(1, cont), run_json(4, cont), "session continued")
    # Each rank streams its experts from disk through 2 slots of its own.
    streamed = run(mpirun(2, base + ["--expert-slots", "2"]))
    assert streamed.stderr.count("streamed from disk through 2 slots") == 2, streamed.stderr
    same_run(one, json.loads(streamed.stdout), "experts streamed from disk, 2 ranks")
    # Per-host copies (`ds41 split`): each rank runs in its own directory holding only its part.
    for r in range(2):
        os.makedirs(os.path.join(tmp, f"host{r}"))
        run([DS41, "split", "-m", model, "--ranks", "2", "--rank", str(r), "--out", os.path.join(tmp, f"host{r}", "m"),
             "--quiet"])
    rel = ["run", "-m", "m"] + base[3:]
    cmd = ["mpirun", "--oversubscribe", "-np", "1", "-wdir", os.path.join(tmp, "host0"), DS41] + rel + \
          [":", "-np", "1", "-wdir", os.path.join(tmp, "host1"), DS41] + rel
    same_run(one, json.loads(run(cmd).stdout), "split copies, 2 ranks")
    print("run: 1/2/4 ranks identical (plain, chunked, dspark, session, experts streamed, split copies)")


def check_bench(model):
    out = json.loads(run(mpirun(2, ["bench", "-m", model, "--threads", "1", "--json", "--prefill-lengths", "8",
                                    "--decode-contexts", "0", "--decode-tokens", "8", "--no-scalar", "--gemm-rows",
                                    "0", "--warm-up", "0", "--triad-mb", "8"])).stdout)
    assert out["ranks"] == 2
    per = out["expert_parallel"]["per_rank"]
    assert [r["rank"] for r in per] == [0, 1]
    for r in per:
        for key in ("compute_seconds_per_token", "communication_seconds_per_token", "waiting_seconds_per_token"):
            assert r[key] >= 0, r
    # Rank 0 sends each follower its tokens' rows and receives as many bytes of expert rows back as
    # the follower sends: the two counts are of the same traffic.
    assert per[0]["bytes_received_per_token"] == per[1]["bytes_sent_per_token"] > 0, per
    # What rank 0 sent, the follower received, plus the 8-byte statistics query itself.
    steps = out["expert_parallel"]["steps"]
    assert abs((per[1]["bytes_received_per_token"] - per[0]["bytes_sent_per_token"]) * steps - 8) < 1e-6, per
    assert per[1]["expert_rows_per_token"] == per[0]["expert_rows_per_token"] > 0, per
    print("bench: per-rank figures", [round(r["bytes_sent_per_token"]) for r in per])


def check_failures(model, tmp):
    # A follower whose checkpoint (same relative path, its own working directory) is truncated.
    good, bad = os.path.join(tmp, "good"), os.path.join(tmp, "bad")
    os.makedirs(good)
    os.makedirs(bad)
    os.symlink(model, os.path.join(good, "m"))
    shutil.copytree(model, os.path.join(bad, "m"))
    shard = sorted(f for f in os.listdir(os.path.join(bad, "m")) if f.endswith(".safetensors"))[-1]
    path = os.path.join(bad, "m", shard)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    args = ["run", "-m", "m", "--tokens", "1,2,3", "-n", "2", "--threads", "1"]
    cmd = ["mpirun", "--oversubscribe", "-np", "1", "-wdir", good, DS41] + args + \
          [":", "-np", "1", "-wdir", bad, DS41] + args
    p = run(cmd, check=False)
    assert p.returncode != 0 and "rank 1" in p.stderr and shard in p.stderr, p.stderr[-2000:]
    # A follower whose checkpoint has the same shapes but other weights (another seed).
    other_model = os.path.join(tmp, "otherseed", "m")
    run([DS41, "mkmodel", "--preset", "tiny", "--seed", "7", "--out", other_model, "--quiet", "--threads", "2"])
    for f in os.listdir(model):  # the same files beside the weights (tokenizer, Engram map)
        if not f.endswith(".safetensors") and not f.endswith(".json") and not os.path.exists(os.path.join(other_model, f)):
            shutil.copy(os.path.join(model, f), other_model)
    cmd = ["mpirun", "--oversubscribe", "-np", "1", "-wdir", good, DS41] + args + \
          [":", "-np", "1", "-wdir", os.path.dirname(other_model), DS41] + args
    p = run(cmd, check=False)
    assert p.returncode != 0 and "rank 1" in p.stderr and "checkpoint differs" in p.stderr, p.stderr[-2000:]
    # A follower running another binary (a copy with one more byte).
    other = os.path.join(tmp, "ds41-other")
    shutil.copy(DS41, other)
    with open(other, "ab") as f:
        f.write(b"\0")
    p = run(["mpirun", "--oversubscribe", "-np", "1", DS41] + args + [":", "-np", "1", other] + args, check=False)
    assert p.returncode != 0 and "a different ds41 binary" in p.stderr, p.stderr[-2000:]
    # A follower killed while the job serves: the job ends (no hang), with a non-zero status.
    marker = f"killed-follower-{os.getpid()}"  # finds this job's rank 1 among the processes
    server = Server(mpirun(2, ["serve", "-m", model, "--port", "0", "--model-name", marker, "--threads", "1"]))
    proc = server.proc
    try:
        server.wait_ready()
        follower = None
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            if b"OMPI_COMM_WORLD_RANK=1" in env and marker.encode() in cmdline:
                follower = int(pid)
        assert follower, "no follower process found"
        os.kill(follower, signal.SIGKILL)
        status = proc.wait(timeout=120)
        err = server.stderr()
        assert status != 0, err[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    print("failures: truncated shard on rank 1, other weights on rank 1, other binary, killed rank: each ended the job with an error")


def main():
    global DS41
    DS41, shared = os.path.abspath(sys.argv[1]), os.environ.get("DS41_SHARED_DIR", sys.argv[2])
    if shutil.which("mpirun") is None:
        print("SKIP: mpirun not installed (apt install openmpi-bin libopenmpi-dev)")
        return 77
    tokenizer = os.path.join(shared, "assets", "deepseek_v3_tokenizer", "tokenizer.json")
    tmp = tempfile.mkdtemp(prefix="ds41-mpi-")
    try:
        model = os.path.join(tmp, "tiny")
        mk = [DS41, "mkmodel", "--preset", "tiny", "--out", model, "--quiet", "--threads", "2"]
        if os.path.exists(tokenizer):
            mk += ["--tokenizer", tokenizer]
        run(mk)
        check_run_modes(model, tmp)
        one = serve_answers(1, model)
        for ranks in (2, 4):
            assert serve_answers(ranks, model) == one, f"serve, {ranks} ranks"
        print("serve: 1/2/4 ranks identical (single, 4 concurrent, streamed)")
        check_bench(model)
        check_failures(model, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
