#!/usr/bin/python3
"""Live checks of the deployed stack on loopback: a real mutwo-server and a CPU
`mutwo-worker serve`, the Python client (the `mutwo` package,
client/python/mutwo) and its example, then a scrape of both
/metrics endpoints against every metric the Grafana dashboard and the alert
rules read, and a real Prometheus (Debian's) scraping both and evaluating
every dashboard expression.

Usage: PYTHONPATH=client/python test_live_stack.py BIN_DIR
(BIN_DIR: the built mutwo binaries; ctest sets PYTHONPATH.)
Without a worker binary with `serve`, the worker's part is skipped, unless
MUTWO_REQUIRE_WORKER=1 (ctest sets it when the worker is built).
Run with /usr/bin/python3 (torch makes the test model; grpcio, protobuf and
yaml come from Debian).
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_lib as dl  # noqa: E402

import grpc  # noqa: E402
import mutwo  # noqa: E402  (client/python, on PYTHONPATH)
from mutwo.v1 import planner_pb2, planner_pb2_grpc  # noqa: E402

ROOT = dl.SOURCE_DIR
CLIENT_DIR = os.path.join(ROOT, "client", "python")
BIN_DIR = None
# Labels Prometheus adds at scrape time (not in the exposition) and the
# histogram bucket label.
TARGET_LABELS = {"instance", "job", "le"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("timed out after %.0f s waiting for %s" % (timeout_s, what))


def read_text(path):
    with open(path) as f:
        return f.read()


def http_get(url, timeout_s=5):
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return r.read().decode()


def make_model(path):
    """A small CNN whose activations, not its weights, dominate the training
    step's memory, so recompute schedules exist for budgets below the
    baseline peak."""
    import torch

    class Cnn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = torch.nn.Conv2d(3, 16, 3, padding=1)
            self.c2 = torch.nn.Conv2d(16, 16, 3, padding=1)
            self.c3 = torch.nn.Conv2d(16, 16, 3, padding=1)
            self.fc = torch.nn.Linear(16, 10)

        def forward(self, x):
            h = torch.relu(self.c1(x))
            h = torch.tanh(self.c2(h))
            h = torch.relu(self.c3(h))
            return self.fc(h.mean(dim=(2, 3)))

    torch.manual_seed(0)
    torch.jit.script(Cnn()).save(path)


class LiveStackTest(unittest.TestCase):
    procs = []

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="mutwo-deploy-")
        tmp = cls.tmp.name
        cls.model = os.path.join(tmp, "cnn.pt")
        make_model(cls.model)

        cls.server_log = os.path.join(tmp, "server.log")
        cls.server = cls.start(
            [os.path.join(BIN_DIR, "mutwo-server"), "--listen=127.0.0.1:0",
             "--metrics_listen=127.0.0.1:0", "--data_dir=" + os.path.join(tmp, "data"),
             "--lease_timeout_ms=20000"], cls.server_log)
        m = wait_for(lambda: re.search(r"\(port (\d+)\), metrics on port (\d+)",
                                       read_text(cls.server_log)),
                     30, "the server's listening line")
        cls.grpc_port, cls.metrics_port = int(m.group(1)), int(m.group(2))
        cls.target = "127.0.0.1:%d" % cls.grpc_port

        worker = os.path.join(BIN_DIR, "mutwo-worker")
        help_text = ""
        if os.access(worker, os.X_OK):
            help_text = subprocess.run([worker, "--help"], capture_output=True,
                                       text=True).stdout
        cls.has_worker = bool(re.search(r"^\s+serve\b", help_text, re.M))
        if os.environ.get("MUTWO_REQUIRE_WORKER") == "1" and not cls.has_worker:
            raise AssertionError(
                "MUTWO_REQUIRE_WORKER=1 (MUTWO_BUILD_WORKER=ON) but %s has no "
                "`serve` command" % worker)
        cls.worker_metrics_port = None
        if cls.has_worker:
            worker_log = os.path.join(tmp, "worker.log")
            cls.worker = cls.start(
                [worker, "serve", "--server=" + cls.target, "--device=cpu",
                 "--metrics_listen=127.0.0.1:0",
                 "--work_dir=" + os.path.join(tmp, "worker")], worker_log)
            m = wait_for(lambda: re.search(r"metrics on port (\d+)",
                                           read_text(worker_log)),
                         30, "the worker's metrics line")
            cls.worker_metrics_port = int(m.group(1))
            with mutwo.Client(cls.target) as c:
                wait_for(lambda: len(c.workers()) == 1, 60,
                         "the worker to register")

    @classmethod
    def start(cls, argv, log_path):
        with open(log_path, "w") as log:
            p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        cls.procs.append((p, log_path))
        return p

    @classmethod
    def tearDownClass(cls):
        for p, log_path in reversed(cls.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        cls.tmp.cleanup()

    def logs(self):
        return "\n".join("--- %s\n%s" % (path, read_text(path)[-3000:])
                         for _, path in self.procs)

    def client(self):
        return mutwo.Client(self.target, timeout_s=10)

    # Tests run in name order: the example's job feeds the metrics checks.

    def test_1_health(self):
        with self.client() as c:
            self.assertEqual(c.health(), "SERVING")
        # The CLI the images' HEALTHCHECK runs.
        r = subprocess.run([os.path.join(BIN_DIR, "mutwo"), "health",
                            "--server=" + self.target, "--timeout_ms=3000"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        r = subprocess.run([os.path.join(BIN_DIR, "mutwo"), "health",
                            "--server=127.0.0.1:%d" % free_port(), "--timeout_ms=1000"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 4, "unreachable server: exit 4")

    def test_2_client_api(self):
        with open(self.model, "rb") as f:
            data = f.read()
        with self.client() as c:
            first = c.upload(self.model)
            self.assertEqual(first.size_bytes, len(data))
            again = c.upload(data, name="same.pt")
            self.assertTrue(again.already_stored)
            self.assertEqual(again.sha256, first.sha256)

            spec = dict(inputs=["x:float32[B,3,32,32]"], batch_sizes=[2],
                        budgets=["70%"], name="api-mlp", device_kind="cpu")
            a = c.submit(first, client_request_id="deploy-test-1", **spec)
            b = c.submit(first, client_request_id="deploy-test-1", **spec)
            # The retried submit is answered with the first job.
            self.assertEqual(a.job_id, b.job_id)
            job = c.job(a)
            self.assertEqual(job.model_name, "api-mlp")
            self.assertEqual(list(job.proto.spec.inputs[0].dims),
                             [-1, 3, 32, 32])  # -1: the batch dimension B
            self.assertEqual(job.proto.spec.budgets[0].fraction_of_baseline,
                             0.7)
            listed = [j.job_id for j in c.jobs(model_sha256=first.sha256)]
            self.assertIn(a.job_id, listed)
            workers = c.workers()
            self.assertEqual(len(workers), 1 if self.has_worker else 0)
            if self.has_worker:
                self.assertTrue(workers[0].device, workers[0])
                try:
                    final = c.wait(a, timeout_s=300, progress=False,
                                   raise_on_failure=False)
                except TimeoutError as e:
                    # The processes' logs say where it stopped (a CI run saw
                    # this job not final after 300 s once, and not again).
                    self.fail("%s: %s\n%s" % (e, c.job(a), self.logs()))
                self.assertEqual(final.state, "SUCCEEDED",
                                 final.error + self.logs())

            # Errors name the bad input.
            with self.assertRaisesRegex(ValueError, r"x:float33\[B\]"):
                mutwo.make_job_spec(first.sha256, ["x:float33[B]"], [2])
            with self.assertRaisesRegex(ValueError, "tokens"):
                mutwo.parse_tensor_spec("tokens:int64[B,8]")
            with self.assertRaisesRegex(ValueError, "150%"):
                mutwo.parse_budget("150%")
            self.assertEqual(mutwo.parse_budget("1.5GiB").bytes, 1610612736)
            self.assertEqual(mutwo.parse_budget("80%dev").fraction_of_device,
                             0.8)
            with self.assertRaises(mutwo.MutwoError) as e:
                c.submit("0" * 64, inputs=["x:float32[B,3,32,32]"],
                         batch_sizes=[2])
            self.assertEqual(e.exception.code, grpc.StatusCode.NOT_FOUND)
            # A header whose sha256 does not match the bytes is refused.
            bad = iter([planner_pb2.UploadModelRequest(
                header=planner_pb2.UploadModelHeader(
                    size_bytes=len(data), sha256="f" * 64, name="bad.pt")),
                planner_pb2.UploadModelRequest(chunk=data)])
            with grpc.insecure_channel(self.target) as channel:
                with self.assertRaises(grpc.RpcError) as e:
                    planner_pb2_grpc.PlannerStub(channel).UploadModel(
                        bad, timeout=10)
            self.assertEqual(e.exception.code(),
                             grpc.StatusCode.INVALID_ARGUMENT)

    def test_3_example(self):
        argv = ["/usr/bin/python3", os.path.join(CLIENT_DIR, "example.py"),
                "--server=" + self.target, "--model=" + self.model,
                "--name=example-cnn", "--input=x:float32[B,3,32,32]", "--batch=4,8",
                "--budget=60%", "--budget=90%", "--device_kind=cpu",
                "--wait_timeout_s=300"]
        if not self.has_worker:
            argv.append("--no_wait")
        r = subprocess.run(argv, capture_output=True, text=True, timeout=400)
        out = r.stdout
        self.assertEqual(r.returncode, 0, out + r.stderr + self.logs())
        self.assertRegex(out, r"uploaded [0-9a-f]{12}")
        self.assertRegex(out, r"submitted job \S+")
        if not self.has_worker:
            self.assertIn(": QUEUED (0/2 tasks)", out)
            self.assertIn("0 worker(s)", out)
            return
        self.assertIn(": SUCCEEDED (", out)
        for batch in (4, 8):
            self.assertRegex(out, r"batch %d: baseline peak [\d.]+ [KMG]iB" % batch)
        # One schedule per budget and batch size, each with its measurement.
        self.assertEqual(len(re.findall(r"budget 60%\s+MUTWO: ", out)), 2, out)
        self.assertEqual(len(re.findall(r"budget 90%\s+MUTWO: ", out)), 2, out)
        # Each feasible schedule is proved by execution (validation); an
        # infeasible one says why. Measurements must match the plain step.
        schedule_lines = re.findall(r"budget (?:60|90)%\s+MUTWO: (.*)", out)
        feasible = [l for l in schedule_lines if l.startswith("predicted peak")]
        self.assertTrue(feasible, out)
        for line in schedule_lines:
            self.assertRegex(line, r"^(predicted peak [\d.]+ [KMG]iB|infeasible: \S)")
        measured = re.findall(r"measured: peak .*", out)
        self.assertEqual(len(measured), len(feasible), out)
        for line in measured:
            self.assertIn("gradients match: yes", line)
        # The server's verdict per budget: a feasible schedule measured
        # within its budget fits (CPU predictions are exact).
        verdicts = re.findall(r"fits: (.*)", out)
        self.assertEqual(len(verdicts), len(schedule_lines), out)
        self.assertEqual(
            len([v for v in verdicts if v == "yes, after 1 round(s)"]),
            len(feasible), out)
        self.assertRegex(out, r"max batch on [\d.]+ [KMG]iB: \d+ without "
                              r"checkpointing, \d+ with a schedule")

    def scrape(self):
        texts = {"server": http_get("http://127.0.0.1:%d/metrics" % self.metrics_port)}
        if self.has_worker:
            texts["worker"] = http_get(
                "http://127.0.0.1:%d/metrics" % self.worker_metrics_port)
        samples = {}
        for text in texts.values():
            for name, labels in dl.parse_scrape(text).items():
                samples.setdefault(name, []).extend(labels)
        return samples

    def test_4_dashboard_metrics_in_live_scrape(self):
        samples = self.scrape()
        exprs = dl.dashboard_exprs() + dl.alert_exprs()
        worker_only = {n for _, e in exprs for n in dl.metric_names(e)
                       if n.startswith("mutwo_worker_")}
        missing, bad_labels = [], []
        for title, expr in exprs:
            for name in dl.metric_names(expr):
                if name not in samples:
                    if not self.has_worker and name in worker_only:
                        continue
                    missing.append("%s (%s)" % (name, title))
            for name, label in dl.label_matchers(expr):
                if label in TARGET_LABELS or name not in samples:
                    continue
                if not any(label in l for l in samples[name]):
                    bad_labels.append("%s{%s} (%s)" % (name, label, title))
        if not self.has_worker:
            # Per-model series appear once a job has results (needs a worker).
            missing = [m for m in missing if not m.startswith("mutwo_model_")]
        self.assertEqual(missing, [], "dashboard metrics absent from the scrape")
        self.assertEqual(bad_labels, [], "labels absent from the scrape")
        if self.has_worker:
            kinds = {l["kind"] for l in samples["mutwo_model_peak_bytes"]
                     if l.get("model") == "example-cnn"}
            self.assertEqual(kinds, {"baseline", "planned"})
            values = {l["kind"] for l in samples["mutwo_model_max_batch_size"]}
            self.assertEqual(values, {"with", "without"})
        else:
            self.skipTest("mutwo-worker has no `serve` command in %s: worker "
                          "and per-model metrics not checked" % BIN_DIR)

    def test_5_prometheus_evaluates_dashboard(self):
        """Debian's Prometheus scrapes both endpoints every second; every
        dashboard expression must return data."""
        prometheus = "/usr/bin/prometheus"
        self.assertTrue(os.access(prometheus, os.X_OK),
                        "prometheus missing (scripts/bootstrap.sh installs it)")
        tmp = self.tmp.name
        targets = ["127.0.0.1:%d" % self.metrics_port]
        if self.has_worker:
            targets.append("127.0.0.1:%d" % self.worker_metrics_port)
        config = os.path.join(tmp, "prometheus.yml")
        with open(config, "w") as f:
            json.dump({"global": {"scrape_interval": "1s"},
                       "scrape_configs": [{"job_name": "mutwo",
                                           "static_configs": [{"targets": targets}]}]}, f)
        port = free_port()
        p = self.start([prometheus, "--config.file=" + config,
                        "--storage.tsdb.path=" + os.path.join(tmp, "tsdb"),
                        "--web.listen-address=127.0.0.1:%d" % port],
                       os.path.join(tmp, "prometheus.log"))
        api = "http://127.0.0.1:%d/api/v1/" % port

        def query(expr):
            body = json.loads(http_get(api + "query?" + urllib.parse.urlencode(
                {"query": expr})))
            self.assertEqual(body["status"], "success", expr)
            return body["data"]["result"]

        def ready():
            try:
                return len(query("up == 1")) == len(targets)
            except OSError:
                return False

        try:
            wait_for(ready, 60, "Prometheus to scrape every target")
            # Traffic after the first scrapes, so rates and histograms move.
            with self.client() as c:
                for _ in range(3):
                    c.health()
                    c.workers()
            time.sleep(4)
            empty = []
            for title, expr in dl.dashboard_exprs():
                promql = dl.grafana_to_promql(expr).replace("[1m]", "[30s]")
                if not query(promql):
                    if not self.has_worker and ("mutwo_worker_" in expr or
                                                "mutwo_model_" in expr):
                        continue
                    empty.append("%s: %s" % (title, promql))
            self.assertEqual(empty, [], "dashboard expressions without data")
        finally:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=30)

    def test_6_sigterm_drains_and_exits_zero(self):
        self.server.send_signal(signal.SIGTERM)
        self.assertEqual(self.server.wait(timeout=30), 0, self.logs())

    def test_7_python_client_with_token_and_tls(self):
        """The Python client against a server with a tokens file and TLS
        (a certificate made here with openssl): the token and the CA from
        arguments or the environment work; no token is UNAUTHENTICATED; a
        token to a non-loopback server without TLS is refused locally."""
        import hashlib
        d = os.path.join(self.tmp.name, "auth")
        os.makedirs(d)
        key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
               "-nodes"]
        subprocess.run(["openssl", "req", "-x509", *key, "-keyout",
                        d + "/ca.key", "-out", d + "/ca.pem", "-days", "2",
                        "-subj", "/CN=mutwo-test-ca"],
                       check=True, capture_output=True)
        subprocess.run(["openssl", "req", *key, "-keyout", d + "/server.key",
                        "-out", d + "/server.csr", "-subj", "/CN=localhost"],
                       check=True, capture_output=True)
        with open(d + "/san.ext", "w") as f:
            f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        subprocess.run(["openssl", "x509", "-req", "-in", d + "/server.csr",
                        "-CA", d + "/ca.pem", "-CAkey", d + "/ca.key",
                        "-CAcreateserial", "-out", d + "/server.pem", "-days",
                        "2", "-extfile", d + "/san.ext"],
                       check=True, capture_output=True)
        token = "py-client-token-0123456789abcdef"
        with open(d + "/tokens.txt", "w") as f:
            f.write("client carol sha256:%s\n"
                    % hashlib.sha256(token.encode()).hexdigest())
        with open(d + "/carol.token", "w") as f:
            f.write(token + "\n")
        log = os.path.join(d, "server.log")
        server = self.start(
            [os.path.join(BIN_DIR, "mutwo-server"), "--listen=127.0.0.1:0",
             "--metrics_listen=", "--data_dir=" + os.path.join(d, "data"),
             "--auth_tokens_file=" + d + "/tokens.txt",
             "--tls_cert=" + d + "/server.pem", "--tls_key=" + d + "/server.key"],
            log)
        m = wait_for(lambda: re.search(r"\(port (\d+)\)", read_text(log)), 30,
                     "the TLS server's listening line")
        target = "127.0.0.1:" + m.group(1)
        try:
            with mutwo.Client(target, timeout_s=10,
                              token_file=d + "/carol.token",
                              tls_ca=d + "/ca.pem") as c:
                self.assertEqual(c.health(), "SERVING")
                self.assertEqual(c.jobs(), [])
            os.environ["MUTWO_TOKEN"] = token
            os.environ["MUTWO_TLS_CA"] = d + "/ca.pem"
            try:
                with mutwo.Client(target, timeout_s=10) as c:
                    c.jobs()
            finally:
                del os.environ["MUTWO_TOKEN"]
            with mutwo.Client(target, timeout_s=10) as c:
                with self.assertRaises(mutwo.MutwoError) as e:
                    c.jobs()
                self.assertEqual(e.exception.code,
                                 grpc.StatusCode.UNAUTHENTICATED)
            del os.environ["MUTWO_TLS_CA"]
            with self.assertRaises(ValueError) as e:
                mutwo.Client("mutwo.example.com:50051", token=token)
            self.assertNotIn(token, str(e.exception))
        finally:
            os.environ.pop("MUTWO_TLS_CA", None)
            server.send_signal(signal.SIGTERM)
            self.assertEqual(server.wait(timeout=30), 0, read_text(log))
        self.assertNotIn(token, read_text(log))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_live_stack.py BIN_DIR")
    BIN_DIR = sys.argv.pop(1)
    unittest.main(verbosity=2)
