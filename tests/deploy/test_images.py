#!/usr/bin/python3
"""The images end to end: the Dockerfile's `server` and `worker-cpu` images
(built by scripts/build-images.sh), run with buildah as deploy/compose.yaml
runs them, a job through them, Prometheus scraping them with
deploy/prometheus/prometheus.yml, and every Grafana dashboard query and
alert expression asked of that Prometheus.

Usage (root; buildah, podman, debootstrap and Debian's prometheus):
    tests/deploy/test_images.py BIN_DIR
BIN_DIR holds the host's `mutwo` CLI, which submits the job. ctest runs it
with the label `images` (`scripts/test.sh -L images`).
MUTWO_IMAGES_SKIP_BUILD=1 uses the images already in buildah's storage
instead of running scripts/build-images.sh first; MUTWO_IMAGE_PREFIX and
MUTWO_TAG name them as compose does.

How compose's services become processes here, with no container engine
that can make networks: each service is a buildah working container of its
image, its command run with `buildah run --isolation chroot` as the image's
ENTRYPOINT followed by the service's `command` (what Docker runs), as the
image's USER, with the service's `environment`, its `secrets` bind-mounted
at their targets and each named volume a fresh folder owned by uid 1000
(Docker fills a new volume from the image's folder, owned by uid 1000).
The whole test runs in a network namespace of its own (`unshare --net`):
the fixed ports of compose (50051, 9464, 9465, 9090) are free there, and
the service names (`server`, `worker-cpu`) resolve to 127.0.0.1 through
an /etc/hosts of this mount namespace and buildah's --add-host, so the
command lines are compose's, unchanged. Prometheus (Debian's, outside any
container) reads prometheus.yml and alerts.yml with two changes: the
worker's `dns_sd_configs` become `static_configs` of the same names and
port (Prometheus's DNS discovery asks a DNS server, which cannot be made
to answer here, and never /etc/hosts), and the intervals are 2 s so the
test needs seconds, not minutes.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_lib as dl  # noqa: E402

import yaml  # noqa: E402  (python3-yaml)

ROOT = dl.SOURCE_DIR
BIN_DIR = None
PREFIX = os.environ.get("MUTWO_IMAGE_PREFIX") or "mutwo"
TAG = os.environ.get("MUTWO_TAG") or "latest"
NETNS_ENV = "MUTWO_IMAGES_IN_NETNS"
# The services the test starts (compose's `cpu` profile) and the names that
# resolve to this host.
SERVICES = ("server", "worker-cpu")
HOST_NAMES = ("server", "worker-cpu", "prometheus")
# Packages and programs no runtime image may hold.
BUILD_PACKAGES = ("build-essential", "gcc", "g++", "cpp", "clang", "make",
                  "cmake", "ninja-build", "binutils", "libc6-dev",
                  "libtorch-dev", "libstdc++-12-dev", "libgcc-12-dev")
BUILD_PROGRAMS = ("cc", "gcc", "c++", "g++", "cpp", "clang", "clang++", "ld",
                  "as", "make", "cmake", "ninja")
UID = "1000"


def wait_for(predicate, timeout_s, what, interval_s=0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError("timed out after %.0f s waiting for %s" % (timeout_s, what))


def read_text(path):
    with open(path, errors="replace") as f:
        return f.read()


def http_get(url, timeout_s=10):
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return r.read().decode()


def run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, **kw)


def expand(text):
    """Compose's ${VAR:-default} and ${VAR} from the environment."""
    def value(m):
        return os.environ.get(m.group(1)) or (m.group(3) or "")
    return re.sub(r"\$\{(\w+)(:-([^}]*))?\}", value, text)


def make_model(path):
    """The worker tests' `mlp` fixture (tests/testing/make_models.py), which
    the service end-to-end test validates at 95% with Adam."""
    import torch
    import torch.nn.functional as F

    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(32, 64)
            self.drop = torch.nn.Dropout(0.25)
            self.fc2 = torch.nn.Linear(64, 64)
            self.head = torch.nn.Linear(64, 10)

        def forward(self, x):
            x = self.drop(F.relu(self.fc1(x)))
            x = torch.tanh(self.fc2(x))
            return self.head(x)

    torch.manual_seed(0)
    torch.jit.script(Mlp()).save(path)


class Service:
    """One compose service as a buildah working container."""

    def __init__(self, name, compose, tmp, secrets_dir):
        svc = compose["services"][name]
        self.name = name
        self.image = "localhost/" + expand(svc["image"])
        self.command = [expand(str(a)) for a in svc["command"]]
        self.environment = {k: expand(str(v))
                            for k, v in (svc.get("environment") or {}).items()}
        self.healthcheck = svc.get("healthcheck", {}).get("test")
        self.mounts = []
        for s in svc.get("secrets", []):
            source = compose["secrets"][s["source"]]["file"]
            # ./secrets/NAME in compose: deploy/gen-auth.sh's output.
            self.mounts.append((os.path.join(secrets_dir, os.path.basename(source)),
                                s["target"], "ro"))
        self.volume_targets = []
        for v in svc.get("volumes", []):
            source, target = v.split(":")[:2]
            self.assertion(source in compose.get("volumes", {}),
                           "%s: only named volumes expected, got %r" % (name, v))
            folder = os.path.join(tmp, "volumes", source)
            os.makedirs(folder)
            os.chown(folder, 1000, 1000)
            os.chmod(folder, 0o750)
            self.mounts.append((folder, target, "rw"))
            self.volume_targets.append(target)
        self.log = os.path.join(tmp, name + ".log")
        self.proc = None
        ctr_name = "mutwo-images-test-%s-%d" % (name, os.getpid())
        add_hosts = ["--add-host=%s:127.0.0.1" % h for h in HOST_NAMES]
        r = run(["buildah", "from", "--pull-never", "--name", ctr_name] + add_hosts
                + [self.image])
        self.assertion(r.returncode == 0, "buildah from %s: %s" % (self.image, r.stderr))
        self.container = r.stdout.strip().splitlines()[-1]
        for k, v in self.environment.items():
            run(["buildah", "config", "--env", "%s=%s" % (k, v), self.container])
        self.config = self.image_config()

    @staticmethod
    def assertion(ok, message):
        if not ok:
            raise AssertionError(message)

    def image_config(self):
        r = run(["buildah", "inspect", "--type", "image", self.image])
        self.assertion(r.returncode == 0, r.stderr)
        info = json.loads(r.stdout)
        return info["Docker"]["config"]

    def argv(self):
        """What Docker runs: the image's ENTRYPOINT, then compose's command
        in place of the image's CMD."""
        return list(self.config.get("Entrypoint") or []) + self.command

    def run_argv(self, argv):
        mounts = []
        for host, target, mode in self.mounts:
            mounts += ["--volume", "%s:%s:%s" % (host, target, mode)]
        return (["buildah", "run", "--isolation", "chroot",
                 "--user", self.config.get("User") or "root"] + mounts
                + [self.container, "--"] + argv)

    def start(self):
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(self.run_argv(self.argv()), stdout=log,
                                         stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def exec(self, argv, timeout_s=60):
        """A command in the service's container beside its main process."""
        return run(self.run_argv(argv), timeout=timeout_s)

    def descendants(self):
        """Process ids under `buildah run`, parents before children."""
        children = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open("/proc/%s/stat" % entry) as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(ppid, []).append(int(entry))
        out, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop(0)
            out.append(pid)
            todo += sorted(children.get(pid, []))
        return out[1:]

    def init_pid(self):
        """The entrypoint's process (tini), which Docker signals as the
        container's PID 1."""
        program = self.argv()[0]
        for pid in self.descendants():
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    argv0 = f.read().split(b"\0")[0].decode()
            except OSError:
                continue
            if argv0 == program:
                return pid
        return None

    def stop(self, timeout_s=60):
        """`docker stop`: STOPSIGNAL (SIGTERM) to the entrypoint's process,
        then SIGKILL after the grace period. The exit code of `buildah run`
        (the program's), or None if it had to be killed."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            pid = self.init_pid()
            if pid:
                os.kill(pid, signal.SIGTERM)
            try:
                return self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                for pid in reversed(self.descendants()):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                self.proc.kill()
                self.proc.wait()
                return None
        return self.proc.returncode

    def remove(self):
        run(["buildah", "rm", self.container])


class ImagesTest(unittest.TestCase):
    services = {}

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="mutwo-images-")
        tmp = cls.tmp
        cls.cli = os.path.join(BIN_DIR, "mutwo")
        with open(os.path.join(dl.DEPLOY, "compose.yaml")) as f:
            cls.compose = yaml.safe_load(f)
        cls.secrets = os.path.join(tmp, "secrets")
        r = run([os.path.join(dl.DEPLOY, "gen-auth.sh"), cls.secrets])
        assert r.returncode == 0, r.stderr
        try:
            for name in SERVICES:
                cls.services[name] = Service(name, cls.compose, tmp, cls.secrets)
            server = cls.services["server"]
            server.start()
            # compose: workers start once the server's health check passes.
            wait_for(lambda: server.proc.poll() is not None or
                     server.exec(server.healthcheck[1:]).returncode == 0,
                     120, "the server's compose health check", interval_s=2)
            if server.proc.poll() is not None:
                raise AssertionError("the server exited: %s" % read_text(server.log))
            cls.services["worker-cpu"].start()
            wait_for(lambda: len(cls.workers()) == 1, 120,
                     "the worker to register", interval_s=2)
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        for s in reversed(list(cls.services.values())):
            s.stop()
            s.remove()
        prometheus = getattr(cls, "prometheus", None)
        if prometheus and prometheus.poll() is None:
            prometheus.terminate()
            prometheus.wait(timeout=30)
        # Volume folders belong to uid 1000; this process is root.
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def cli_args(cls):
        # Compose publishes the server's 50051 on the host; the certificate
        # names 127.0.0.1.
        return ["--server=127.0.0.1:%s" % expand("${MUTWO_GRPC_PORT:-50051}"),
                "--tls_ca=" + os.path.join(cls.secrets, "ca.crt"),
                "--token_file=" + os.path.join(cls.secrets, "client.token")]

    @classmethod
    def workers(cls):
        r = run([cls.cli, "workers", "--output=json"] + cls.cli_args())
        if r.returncode != 0:
            return []
        body = json.loads(r.stdout[r.stdout.find("{"):] or "{}")
        return body.get("workers", [])

    def logs(self):
        return "\n".join("--- %s\n%s" % (s.name, read_text(s.log)[-3000:])
                         for s in self.services.values() if s.proc)

    # Tests run in name order: the job feeds the Prometheus checks.

    def test_1_image_hygiene(self):
        """Non-root user, no build tools, a health check, the volumes."""
        for name, s in self.services.items():
            with self.subTest(image=s.image):
                self.assertEqual(s.config.get("User"), "1000:1000")
                r = s.exec(["id", "-u"])
                self.assertEqual(r.stdout.strip(), UID, r.stderr)
                r = s.exec(["dpkg-query", "-W", "-f", "${Package} ${db:Status-Status}\n"])
                installed = {l.split()[0].split(":")[0] for l in r.stdout.splitlines()
                             if l.endswith(" installed")}
                self.assertTrue(installed, r.stderr)
                self.assertEqual(sorted(installed & set(BUILD_PACKAGES)), [])
                self.assertEqual(sorted(p for p in installed
                                        if re.search(r"-dev$|^(gcc|g\+\+|cpp|clang)-\d+$", p)),
                                 [], "development packages in a runtime image")
                script = "for p in %s; do command -v $p || true; done" % " ".join(BUILD_PROGRAMS)
                r = s.exec(["/bin/sh", "-c", script])
                self.assertEqual(r.stdout.split(), [], "build programs in the image")
                # The image's HEALTHCHECK is compose's health check.
                health = (s.config.get("Healthcheck") or {}).get("Test")
                self.assertTrue(health, "%s: no HEALTHCHECK (an OCI-format build "
                                "drops it)" % s.image)
                if s.healthcheck:
                    self.assertEqual(health, s.healthcheck)
                # Every named volume of the service is a VOLUME of the image.
                self.assertTrue(s.volume_targets)
                for target in s.volume_targets:
                    self.assertIn(target, s.config.get("Volumes") or {})
        server = self.services["server"]
        health = server.config["Healthcheck"]["Test"]
        self.assertEqual(health[:3], ["CMD", "mutwo", "health"],
                         "the server's health check is the gRPC health service")
        worker = self.services["worker-cpu"]
        (work_dir,) = [a.split("=", 1)[1] for a in worker.command
                       if a.startswith("--work_dir=")]
        self.assertIn(work_dir, worker.volume_targets,
                      "the worker's --work_dir is on a volume")

    def test_2_health_checks_pass(self):
        """Each image's own HEALTHCHECK command, run in its container."""
        for name, s in self.services.items():
            test = s.config["Healthcheck"]["Test"]
            self.assertEqual(test[0], "CMD")
            r = s.exec(test[1:])
            self.assertEqual(r.returncode, 0, "%s: %s%s" % (name, r.stdout, r.stderr))
        # The worker's work dir is written by the worker (uid 1000).
        worker = self.services["worker-cpu"]
        folder = [h for h, t, _ in worker.mounts if t in worker.volume_targets][0]
        self.assertEqual(os.stat(folder).st_uid, 1000)

    def test_3_job_succeeds_with_validation(self):
        model = os.path.join(self.tmp, "mlp.pt")
        make_model(model)
        r = run([self.cli, "submit", model, "--input=x:float32[B,32]",
                 "--batch=256,512", "--budget=95%", "--optimizer=adam",
                 "--device_kind=cpu", "--name=images-mlp", "--wait",
                 "--wait_timeout_s=600", "--output=json"] + self.cli_args(),
                timeout=700)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr + self.logs())
        out = r.stdout
        job = json.loads(out[out.find("{"):out.rfind("}") + 1])
        job = job.get("job", job)
        self.assertEqual(job["state"], "SUCCEEDED", job.get("error", "") + self.logs())
        self.assertEqual(len(job["results"]), 2)
        for result in job["results"]:
            self.assertGreater(int(result["baseline_peak_bytes"]), 0)
            self.assertTrue(result["schedules"][0]["feasible"], result)
            self.assertEqual(len(result["validations"]), 1, result)
            v = result["validations"][0]
            self.assertTrue(v["gradients_match"], v)
            self.assertTrue(v["within_budget"], v)
            self.assertEqual(result["outcomes"][0]["state"], "FITS", result)
        type(self).job_id = job["job_id"]

    def test_4_prometheus_answers_every_query(self):
        """Prometheus scrapes both containers with deploy/prometheus's
        configuration; every dashboard query and alert expression is valid,
        reads only metrics Prometheus has, and every rule evaluates."""
        tmp = self.tmp
        with open(os.path.join(dl.DEPLOY, "prometheus", "prometheus.yml")) as f:
            config = yaml.safe_load(f)
        config["global"]["scrape_interval"] = "2s"
        config["global"]["evaluation_interval"] = "2s"
        started = set(self.services)
        jobs = {}
        for job in config["scrape_configs"]:
            for sd in job.pop("dns_sd_configs", []):
                targets = ["%s:%d" % (n, sd["port"]) for n in sd["names"]
                           if n in started]
                job.setdefault("static_configs", []).append({"targets": targets})
            jobs[job["job_name"]] = [t for c in job.get("static_configs", [])
                                     for t in c["targets"]]
        self.assertEqual(jobs, {"mutwo-server": ["server:9464"],
                                "mutwo-worker": ["worker-cpu:9465"]})
        conf_dir = os.path.join(tmp, "prometheus")
        os.makedirs(conf_dir)
        with open(os.path.join(conf_dir, "prometheus.yml"), "w") as f:
            yaml.safe_dump(config, f)
        shutil.copy(os.path.join(dl.DEPLOY, "prometheus", "alerts.yml"), conf_dir)
        port = int(expand("${PROMETHEUS_PORT:-9090}"))
        log = os.path.join(tmp, "prometheus.log")
        with open(log, "w") as out:
            type(self).prometheus = subprocess.Popen(
                ["/usr/bin/prometheus",
                 "--config.file=" + os.path.join(conf_dir, "prometheus.yml"),
                 "--storage.tsdb.path=" + os.path.join(tmp, "tsdb"),
                 "--web.listen-address=127.0.0.1:%d" % port],
                stdout=out, stderr=subprocess.STDOUT)
        api = "http://127.0.0.1:%d/api/v1/" % port

        def get(path, **params):
            body = json.loads(http_get(api + path + "?" + urllib.parse.urlencode(params)))
            self.assertEqual(body["status"], "success", body)
            return body["data"]

        def targets_up():
            if self.prometheus.poll() is not None:
                raise AssertionError("prometheus exited:\n" + read_text(log)[-3000:])
            try:
                active = get("targets")["activeTargets"]
            except OSError:
                return False
            return len(active) == 2 and all(t["health"] == "up" for t in active)

        wait_for(targets_up, 60, "Prometheus to scrape both containers")
        # Traffic between scrapes so that rates move, then enough scrapes
        # for [1m] windows to hold several samples.
        for _ in range(3):
            run([self.cli, "health"] + self.cli_args()[:2])
            run([self.cli, "jobs"] + self.cli_args())
        time.sleep(12)

        names = set(get("label/__name__/values"))
        unknown, errors, empty, answered = [], [], [], 0
        for title, expr in dl.dashboard_exprs() + dl.alert_exprs():
            promql = dl.grafana_to_promql(expr)
            for name in sorted(dl.metric_names(expr)):
                if name not in names:
                    unknown.append("%s: %s (%s)" % (title, name, promql))
            body = json.loads(http_get(api + "query?" + urllib.parse.urlencode(
                {"query": promql})))
            if body["status"] != "success":
                errors.append("%s: %s: %s" % (title, promql, body.get("error")))
            elif body["data"]["result"]:
                answered += 1
            else:
                empty.append(title)
        self.assertEqual(errors, [], "queries Prometheus refused")
        self.assertEqual(unknown, [], "metrics Prometheus never scraped")
        print("\n%d queries with data, %d with an empty result: %s"
              % (answered, len(empty), "; ".join(empty)), file=sys.stderr)

        def rules_evaluated():
            rules = [r for g in get("rules")["groups"] for r in g["rules"]]
            return rules if all(r.get("lastEvaluation", "").startswith("20")
                                for r in rules) else None

        rules = wait_for(rules_evaluated, 30, "every rule to be evaluated")
        self.assertEqual(len(rules), len(dl.alert_exprs()))
        self.assertEqual([(r["name"], r.get("lastError")) for r in rules
                          if r["health"] != "ok"], [])
        # The job's per-model series reached Prometheus through the server.
        data = get("query", query='mutwo_model_peak_bytes{model="images-mlp"}')
        self.assertEqual({s["metric"]["kind"] for s in data["result"]},
                         {"baseline", "planned"})

    def test_5_sigterm_stops_the_containers(self):
        """`docker stop` sends STOPSIGNAL (SIGTERM) to tini, which passes
        it on: the worker and the server stop within compose's
        stop_grace_period, both with exit 0."""
        for name in ("worker-cpu", "server"):
            grace = self.compose["services"][name].get("stop_grace_period", "10s")
            code = self.services[name].stop(timeout_s=int(grace.rstrip("s")))
            self.assertEqual(code, 0, "%s: %s" % (name, self.logs()))


def in_network_namespace():
    """Re-runs this file in new network and mount namespaces (see the module
    docstring); returns its exit code."""
    env = dict(os.environ, **{NETNS_ENV: "1"})
    return subprocess.call(["unshare", "--net", "--mount", "--propagation", "private",
                            sys.executable, os.path.abspath(__file__), BIN_DIR]
                           + sys.argv[1:], env=env)


def prepare_namespace():
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    hosts = tempfile.NamedTemporaryFile("w", prefix="mutwo-hosts-", delete=False)
    hosts.write("127.0.0.1\tlocalhost %s\n::1\tlocalhost\n" % " ".join(HOST_NAMES))
    hosts.close()
    os.chmod(hosts.name, 0o644)
    subprocess.run(["mount", "--bind", hosts.name, "/etc/hosts"], check=True)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_images.py BIN_DIR")
    BIN_DIR = os.path.abspath(sys.argv.pop(1))
    if os.environ.get(NETNS_ENV) != "1":
        if os.geteuid() != 0:
            sys.exit("test_images.py: needs root (buildah's chroot isolation, "
                     "network namespaces)")
        for tool in ("buildah", "podman", "debootstrap", "unshare", "/usr/bin/prometheus"):
            if not shutil.which(tool):
                sys.exit("test_images.py: %s missing" % tool)
        if os.environ.get("MUTWO_IMAGES_SKIP_BUILD") != "1":
            # Outside the namespace: the build downloads Debian packages.
            start = time.monotonic()
            subprocess.run([os.path.join(ROOT, "scripts", "build-images.sh")],
                           check=True)
            print("images built in %.0f s" % (time.monotonic() - start), file=sys.stderr)
        sys.exit(in_network_namespace())
    prepare_namespace()
    unittest.main(verbosity=2)
