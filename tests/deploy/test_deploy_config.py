#!/usr/bin/python3
"""Static checks of the deployment files, no Docker engine needed:

- promtool accepts deploy/prometheus/prometheus.yml (and its alert rules),
  and the rules pass the unit tests in tests/deploy/alerts_test.yml;
- every PromQL expression of the Grafana dashboard is valid PromQL (promtool
  checks it as a rule) and reads only metrics mutwo's code defines;
- the dashboard JSON and Grafana provisioning YAML parse and agree with
  compose.yaml (datasource URL, uid, dashboard folder);
- compose.yaml: server, GPU worker with a device reservation, CPU profile,
  Prometheus and Grafana mounts;
- Kubernetes manifests: StatefulSet with a PVC for the data dir, Service with
  gRPC and metrics ports, `mutwo health` probes over TLS, GPU worker
  requesting nvidia.com/gpu: 1, scrape annotations on the right ports;
- authentication: the server runs with a tokens file and TLS from
  mounted secrets in compose, Kubernetes and the image; workers get their
  token and the CA through MUTWO_TOKEN_FILE / MUTWO_TLS_CA from mounted
  secrets; deploy/gen-auth.sh makes a set the real server accepts;
- the Dockerfile: build stages run scripts/bootstrap.sh (the script CI runs),
  runtime targets are non-root with tini, STOPSIGNAL, HEALTHCHECK, VOLUME;
- deploy/docker/runtime-libs.sh lists the libraries of a real binary.

Usage: test_deploy_config.py [BIN_DIR]   (BIN_DIR: built mutwo binaries)
"""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_lib as dl  # noqa: E402

ROOT = dl.SOURCE_DIR
BIN_DIR = None


def read(*parts):
    with open(os.path.join(ROOT, *parts)) as f:
        return f.read()


def load_yaml(*parts):
    return yaml.safe_load(read(*parts))


def defined_metrics():
    """Sample names mutwo's code registers (server and worker daemon), with
    the _bucket/_sum/_count series of histograms."""
    names = set()
    for path in ("server/metrics.cc", "worker/daemon/daemon.cc"):
        text = read(path)
        for m in re.finditer(r'Build(Gauge|Counter|Histogram)\(\)\s*\.Name\("([^"]+)"\)',
                             text):
            kind, name = m.groups()
            if kind == "Histogram":
                names.update(name + s for s in ("_bucket", "_sum", "_count"))
            else:
                names.add(name)
    return names


class PromqlHelpersTest(unittest.TestCase):
    """The extraction the live test relies on must find what it should."""

    def test_metric_names(self):
        expr = ('histogram_quantile(0.99, sum by (le, method) (rate('
                'foo_seconds_bucket{method=~"$m",code!="OK"}[$__rate_interval])))'
                ' / clamp_min(sum without (x) (bar_total offset 5m), 1e-9)'
                ' and on(instance) baz')
        self.assertEqual(dl.metric_names(expr),
                         {"foo_seconds_bucket", "bar_total", "baz"})
        self.assertEqual(dl.label_matchers(expr),
                         {("foo_seconds_bucket", "method"),
                          ("foo_seconds_bucket", "code")})

    def test_scrape_parser(self):
        samples = dl.parse_scrape(
            '# HELP a x\n# TYPE a gauge\na{state="IDLE",x="a\\"b"} 1\nb 2.5e+01\n')
        self.assertEqual(samples["a"], [{"state": "IDLE", "x": 'a\\"b'}])
        self.assertEqual(samples["b"], [{}])


class PrometheusTest(unittest.TestCase):
    def test_promtool_check_config(self):
        promtool = shutil.which("promtool")
        self.assertIsNotNone(promtool, "promtool missing: scripts/bootstrap.sh "
                             "installs the Debian package prometheus")
        r = subprocess.run([promtool, "check", "config",
                            os.path.join(dl.DEPLOY, "prometheus", "prometheus.yml")],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("SUCCESS", r.stdout + r.stderr)
        self.assertIn("rules found", r.stdout + r.stderr)  # alerts.yml loaded

    def test_alert_rule_unit_tests(self):
        """promtool's unit tests of the alert rules (tests/deploy/alerts_test.yml)."""
        r = subprocess.run(["promtool", "test", "rules",
                            os.path.join(ROOT, "tests", "deploy", "alerts_test.yml")],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("SUCCESS", r.stdout + r.stderr)

    def test_jobs_waiting_for_device_alert(self):
        rules = {name: expr for name, expr in dl.alert_exprs()}
        self.assertIn("mutwo_jobs_waiting_for_device",
                      rules["MutwoJobsWaitingForDevice"])

    def test_scrape_targets_match_compose(self):
        prom = load_yaml("deploy", "prometheus", "prometheus.yml")
        compose = load_yaml("deploy", "compose.yaml")
        jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
        server_targets = [t for sc in jobs["mutwo-server"]["static_configs"]
                          for t in sc["targets"]]
        self.assertEqual(server_targets, ["server:9464"])
        self.assertIn("--metrics_listen=0.0.0.0:9464",
                      compose["services"]["server"]["command"])
        dns = jobs["mutwo-worker"]["dns_sd_configs"][0]
        self.assertEqual(sorted(dns["names"]), ["worker-cpu", "worker-gpu"])
        for name in dns["names"]:
            self.assertIn("--metrics_listen=0.0.0.0:%d" % dns["port"],
                          compose["services"][name]["command"], name)

    def test_alert_rules_read_defined_metrics(self):
        defined = defined_metrics()
        for name, expr in dl.alert_exprs():
            self.assertTrue(dl.metric_names(expr), name)
            self.assertLessEqual(dl.metric_names(expr), defined, name)


class DashboardTest(unittest.TestCase):
    def setUp(self):
        self.dash = dl.dashboard()
        self.exprs = dl.dashboard_exprs(self.dash)

    def test_structure(self):
        self.assertEqual(self.dash["uid"], "mutwo-overview")
        ids = [p["id"] for p in self.dash["panels"]]
        self.assertEqual(len(ids), len(set(ids)), "panel ids must be unique")
        for p in self.dash["panels"]:
            if p["type"] == "row":
                continue
            self.assertTrue(p.get("targets"), p["title"])
            self.assertEqual(p["datasource"]["uid"], "${datasource}", p["title"])
            g = p["gridPos"]
            self.assertLessEqual(g["x"] + g["w"], 24, p["title"])

    def test_covers_what_the_issue_asks(self):
        text = " ".join(e for _, e in self.exprs)
        wanted = {
            "job states": "mutwo_jobs",
            "task throughput": "mutwo_worker_tasks_total",
            "queue depth": "mutwo_queue_depth",
            "workers": "mutwo_workers",
            "RPC latency": "mutwo_rpc_duration_seconds_bucket",
            "planner latency": "mutwo_planner_duration_seconds_bucket",
            "cache hit ratio": 'mutwo_schedule_cache_requests_total{instance=~"$server",result="hit"}',
            "peak memory per model": "mutwo_model_peak_bytes",
            "max batch size": "mutwo_model_max_batch_size",
            "GPU memory per worker": "mutwo_worker_device_memory_used_bytes",
        }
        for what, needle in wanted.items():
            self.assertIn(needle, text, what)
        peak = [e for _, e in self.exprs if "mutwo_model_peak_bytes" in e]
        self.assertTrue(any("by (model, kind)" in e for e in peak),
                        "baseline vs planned needs the kind label")

    def test_metrics_are_defined_in_code(self):
        defined = defined_metrics()
        self.assertIn("mutwo_worker_busy", defined)  # the regex sees both files
        for title, expr in self.exprs:
            names = dl.metric_names(expr)
            self.assertTrue(names, "%s: no metric in %r" % (title, expr))
            self.assertLessEqual(names, defined, title)

    def test_promql_is_valid(self):
        """promtool parses each expression (as a rule) after Grafana's
        variables are replaced."""
        rules = {"groups": [{"name": "dashboard", "rules": [
            {"record": "dashboard:expr_%d" % i, "expr": dl.grafana_to_promql(e)}
            for i, (_, e) in enumerate(self.exprs)]}]}
        with tempfile.NamedTemporaryFile("w", suffix=".yml") as f:
            yaml.safe_dump(rules, f)
            f.flush()
            r = subprocess.run(["promtool", "check", "rules", f.name],
                               capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("%d rules found" % len(self.exprs), r.stdout)


class GrafanaProvisioningTest(unittest.TestCase):
    def test_datasource_and_provider_agree_with_compose(self):
        compose = load_yaml("deploy", "compose.yaml")
        ds = load_yaml("deploy", "grafana", "provisioning", "datasources",
                       "prometheus.yaml")
        (source,) = ds["datasources"]
        self.assertEqual(source["type"], "prometheus")
        self.assertEqual(source["url"], "http://prometheus:9090")
        self.assertIn("prometheus", compose["services"])
        dash = dl.dashboard()
        (var,) = [v for v in dash["templating"]["list"] if v["type"] == "datasource"]
        self.assertEqual(var["current"]["value"], source["uid"])

        prov = load_yaml("deploy", "grafana", "provisioning", "dashboards",
                         "mutwo.yaml")
        (provider,) = prov["providers"]
        mounts = compose["services"]["grafana"]["volumes"]
        self.assertIn("./grafana/dashboards:%s:ro" % provider["options"]["path"],
                      mounts)
        self.assertIn("./grafana/provisioning/datasources:"
                      "/etc/grafana/provisioning/datasources:ro", mounts)
        self.assertIn("./grafana/provisioning/dashboards:"
                      "/etc/grafana/provisioning/dashboards:ro", mounts)
        for m in mounts:
            src = m.split(":")[0]
            if src.startswith("./"):
                self.assertTrue(os.path.exists(os.path.join(dl.DEPLOY, src)), m)


class ComposeTest(unittest.TestCase):
    def setUp(self):
        self.compose = load_yaml("deploy", "compose.yaml")
        self.services = self.compose["services"]
        self.targets = set(re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)",
                                      read("Dockerfile"), re.M | re.I))

    def test_services(self):
        self.assertLessEqual({"server", "worker-gpu", "worker-cpu", "prometheus",
                              "grafana"}, set(self.services))
        for name, svc in self.services.items():
            if "build" in svc:
                self.assertEqual(svc["build"]["context"], "..", name)
                self.assertIn(svc["build"]["target"], self.targets, name)

    def test_gpu_reservation_and_cpu_profile(self):
        gpu = self.services["worker-gpu"]
        (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
        self.assertEqual(device["driver"], "nvidia")
        self.assertEqual(device["capabilities"], ["gpu"])
        self.assertEqual(device["count"], 1)
        self.assertIn("--device=cuda:0", gpu["command"])
        cpu = self.services["worker-cpu"]
        self.assertEqual(cpu["profiles"], ["cpu"])
        self.assertIn("--device=cpu", cpu["command"])
        for w in (gpu, cpu):
            self.assertIn("--server=server:50051", w["command"])
            self.assertEqual(w["depends_on"]["server"]["condition"],
                             "service_healthy")

    def secret_targets(self, svc):
        """{target path: the file compose mounts there}"""
        files = self.compose["secrets"]
        return {s["target"]: files[s["source"]]["file"]
                for s in svc.get("secrets", [])}

    def test_server(self):
        server = self.services["server"]
        self.assertIn("server-data:/var/lib/mutwo", server["volumes"])
        self.assertIn("--data_dir=/var/lib/mutwo", server["command"])
        self.assertEqual(server["healthcheck"]["test"][:3],
                         ["CMD", "mutwo", "health"])
        self.assertEqual(server["stop_signal"], "SIGTERM")

    def test_server_runs_with_tokens_and_tls_from_secrets(self):
        server = self.services["server"]
        flags = dict(a[2:].split("=", 1) for a in server["command"])
        self.assertNotIn("insecure", flags)
        mounted = self.secret_targets(server)
        self.assertEqual(mounted[flags["auth_tokens_file"]], "./secrets/tokens.txt")
        self.assertEqual(mounted[flags["tls_cert"]], "./secrets/tls.crt")
        self.assertEqual(mounted[flags["tls_key"]], "./secrets/tls.key")
        (ca,) = [a.split("=", 1)[1] for a in server["healthcheck"]["test"]
                 if a.startswith("--tls_ca=")]
        self.assertEqual(mounted[ca], "./secrets/ca.crt")
        # The secrets are made by deploy/gen-auth.sh and never committed.
        self.assertIn("/deploy/secrets/", read(".gitignore").split())

    def test_workers_get_their_token_and_the_ca(self):
        for name in ("worker-gpu", "worker-cpu"):
            w = self.services[name]
            mounted = self.secret_targets(w)
            env = w["environment"]
            self.assertEqual(mounted[env["MUTWO_TOKEN_FILE"]],
                             "./secrets/worker.token", name)
            self.assertEqual(mounted[env["MUTWO_TLS_CA"]], "./secrets/ca.crt", name)
            self.assertNotIn("./secrets/tls.key", mounted.values(), name)

    def test_prometheus_mounts(self):
        mounts = self.services["prometheus"]["volumes"]
        self.assertIn("./prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro",
                      mounts)
        self.assertIn("./prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro",
                      mounts)


class KubernetesTest(unittest.TestCase):
    def setUp(self):
        self.docs = []
        for path in sorted(glob.glob(os.path.join(dl.DEPLOY, "k8s", "*.yaml"))):
            if os.path.basename(path) == "kustomization.yaml":
                continue
            with open(path) as f:
                self.docs += [d for d in yaml.safe_load_all(f) if d]
        self.by_kind = {}
        for d in self.docs:
            self.by_kind.setdefault(d["kind"], []).append(d)

    def pod_spec(self, kind):
        (obj,) = self.by_kind[kind]
        return obj, obj["spec"]["template"]

    @staticmethod
    def flag(args, name):
        for a in args:
            if a.startswith("--%s=" % name):
                return a.split("=", 1)[1]
        return None

    def test_kinds(self):
        self.assertLessEqual({"Namespace", "Service", "StatefulSet"},
                             set(self.by_kind))
        self.assertTrue({"Deployment", "DaemonSet"} & set(self.by_kind))
        for d in self.docs:
            if d["kind"] != "Namespace":
                self.assertEqual(d["metadata"]["namespace"], "mutwo", d["kind"])

    def test_server_statefulset(self):
        sts, template = self.pod_spec("StatefulSet")
        self.assertEqual(sts["spec"]["replicas"], 1)  # one SQLite writer
        (claim,) = sts["spec"]["volumeClaimTemplates"]
        self.assertIn("storage", claim["spec"]["resources"]["requests"])
        (c,) = template["spec"]["containers"]
        (mount,) = [m for m in c["volumeMounts"] if m["name"] == claim["metadata"]["name"]]
        self.assertEqual(mount["mountPath"], self.flag(c["args"], "data_dir"))
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        self.assertEqual(self.flag(c["args"], "listen"), "0.0.0.0:%d" % ports["grpc"])
        self.assertEqual(self.flag(c["args"], "metrics_listen"),
                         "0.0.0.0:%d" % ports["metrics"])
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        secrets = {v["name"]: v["secret"] for v in template["spec"]["volumes"]
                   if "secret" in v}

        def secret_file(path):
            """(secret name, key) of the mounted file at `path`."""
            for volume, secret in secrets.items():
                d = mounts[volume].rstrip("/") + "/"
                if path.startswith(d):
                    rel = path[len(d):]
                    keys = {i["path"]: i["key"] for i in secret.get("items", [])}
                    return secret["secretName"], keys.get(rel, rel)
            self.fail("%s is on no mounted secret" % path)

        self.assertEqual(secret_file(self.flag(c["args"], "auth_tokens_file")),
                         ("mutwo-auth", "tokens.txt"))
        self.assertEqual(secret_file(self.flag(c["args"], "tls_cert")),
                         ("mutwo-tls", "tls.crt"))
        self.assertEqual(secret_file(self.flag(c["args"], "tls_key")),
                         ("mutwo-tls", "tls.key"))
        self.assertIsNone(self.flag(c["args"], "insecure"))
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            command = c[probe]["exec"]["command"]
            self.assertEqual(command[:2], ["mutwo", "health"], probe)
            self.assertIn("--server=127.0.0.1:%d" % ports["grpc"], command)
            (ca,) = [a.split("=", 1)[1] for a in command
                     if a.startswith("--tls_ca=")]
            self.assertEqual(secret_file(ca), ("mutwo-tls", "ca.crt"), probe)
        ann = template["metadata"]["annotations"]
        self.assertEqual(ann["prometheus.io/scrape"], "true")
        self.assertEqual(int(ann["prometheus.io/port"]), ports["metrics"])
        self.assertEqual(template["spec"]["securityContext"]["runAsUser"], 1000)
        self.assertEqual(sts["spec"]["serviceName"],
                         [s["metadata"]["name"] for s in self.by_kind["Service"]
                          if s["spec"].get("clusterIP") == "None"][0])

        services = [s for s in self.by_kind["Service"]
                    if s["metadata"]["name"] == "mutwo-server"]
        (svc,) = services
        self.assertEqual(svc["spec"]["selector"], template["metadata"]["labels"])
        svc_ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
        self.assertEqual(svc_ports, {"grpc": 50051, "metrics": 9464})

    def test_gpu_worker(self):
        kind = "Deployment" if "Deployment" in self.by_kind else "DaemonSet"
        _, template = self.pod_spec(kind)
        (c,) = template["spec"]["containers"]
        self.assertEqual(str(c["resources"]["limits"]["nvidia.com/gpu"]), "1")
        self.assertEqual(self.flag(c["args"], "server"), "mutwo-server:50051")
        self.assertEqual(self.flag(c["args"], "device"), "cuda:0")
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        self.assertEqual(self.flag(c["args"], "metrics_listen"),
                         "0.0.0.0:%d" % ports["metrics"])
        ann = template["metadata"]["annotations"]
        self.assertEqual(ann["prometheus.io/scrape"], "true")
        self.assertEqual(int(ann["prometheus.io/port"]), ports["metrics"])
        self.assertIn("nvidia.com/gpu",
                      [t["key"] for t in template["spec"]["tolerations"]])
        self.assertEqual(template["spec"]["securityContext"]["runAsUser"], 1000)
        self.assertEqual(c["livenessProbe"]["httpGet"]["path"], "/metrics")
        # Its token and the CA, from secrets, through the environment; never
        # the server's key.
        env = {e["name"]: e["value"] for e in c["env"]}
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        secrets = {v["name"]: v["secret"] for v in template["spec"]["volumes"]
                   if "secret" in v}
        self.assertEqual(os.path.dirname(env["MUTWO_TOKEN_FILE"]), mounts["token"])
        self.assertEqual(secrets["token"]["secretName"], "mutwo-worker-token")
        self.assertEqual(os.path.dirname(env["MUTWO_TLS_CA"]), mounts["tls"])
        self.assertEqual(secrets["tls"]["secretName"], "mutwo-tls")
        self.assertEqual([i["key"] for i in secrets["tls"]["items"]], ["ca.crt"])

    def test_kustomize_renders(self):
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            self.skipTest("kubectl not installed")
        r = subprocess.run([kubectl, "kustomize", os.path.join(dl.DEPLOY, "k8s")],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        kinds = sorted(d["kind"] for d in yaml.safe_load_all(r.stdout) if d)
        self.assertEqual(kinds, sorted(d["kind"] for d in self.docs))


class DockerfileTest(unittest.TestCase):
    def setUp(self):
        text = read("Dockerfile")
        text = re.sub(r"\\\n", " ", text)  # join continued lines
        self.stages = {}
        current = None
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            m = re.match(r"FROM\s+(\S+)\s+AS\s+(\S+)", line, re.I)
            if m:
                current = m.group(2)
                self.stages[current] = {"from": m.group(1), "lines": []}
                continue
            if current:
                self.stages[current]["lines"].append(line)
        self.args = dict(re.findall(r"^ARG\s+(\w+)=(\S+)", read("Dockerfile"), re.M))

    def instr(self, stage, name):
        return [l[len(name):].strip() for l in self.stages[stage]["lines"]
                if l.upper().startswith(name + " ")]

    def base(self, stage):
        return re.sub(r"\$\{(\w+)\}", lambda m: self.args[m.group(1)],
                      self.stages[stage]["from"])

    def test_targets(self):
        self.assertLessEqual({"build", "build-gpu", "server", "worker-cpu",
                              "worker-gpu"}, set(self.stages))
        self.assertEqual(self.base("build"), "debian:bookworm")
        self.assertEqual(self.base("build-gpu"), "debian:bookworm")
        self.assertRegex(self.base("worker-gpu"), r"^nvidia/cuda:[\d.]+-runtime-")

    def test_build_stages_run_the_ci_scripts(self):
        """One recipe: the build stages call scripts/bootstrap.sh (which
        scripts/test.sh, CI's command, calls too); no package list or
        compiler invocation of their own."""
        self.assertIn("scripts/bootstrap.sh", read("scripts", "test.sh"))
        for stage in ("build", "build-gpu"):
            runs = " ".join(self.instr(stage, "RUN"))
            self.assertIn("scripts/bootstrap.sh", runs, stage)
            self.assertNotRegex(runs, r"\bcmake\s+(-S|--build)", stage)
        self.assertIn("scripts/test.sh", " ".join(self.instr("build", "RUN")))
        dockerfile = read("Dockerfile")
        bootstrap = read("scripts", "bootstrap.sh")
        for pkg in re.findall(r"\b(lib[a-z0-9+.-]+-dev)\b", bootstrap):
            self.assertNotIn(pkg, dockerfile, "a second package list")
        self.assertIn("torch.utils.cmake_prefix_path",
                      " ".join(self.instr("build-gpu", "RUN")))

    def test_runtime_targets(self):
        for stage in ("server", "worker-cpu", "worker-gpu"):
            self.assertEqual(self.instr(stage, "USER"), ["1000:1000"], stage)
            (entry,) = self.instr(stage, "ENTRYPOINT")
            entry = json.loads(entry)  # exec form
            self.assertEqual(entry[:2], ["/usr/bin/tini", "--"], stage)
            self.assertEqual(self.instr(stage, "STOPSIGNAL"), ["SIGTERM"], stage)
            (health,) = self.instr(stage, "HEALTHCHECK")
            self.assertIn(" CMD [", health, stage)
            (volume,) = self.instr(stage, "VOLUME")
            self.assertTrue(json.loads(volume), stage)
            self.assertTrue(json.loads(self.instr(stage, "CMD")[0]), stage)
            runs = " ".join(self.instr(stage, "RUN"))
            self.assertIn("tini", runs, stage)
            self.assertIn("--uid 1000", runs, stage)
        (health,) = self.instr("server", "HEALTHCHECK")
        self.assertIn('["mutwo", "health", "--server=127.0.0.1:50051"', health)
        self.assertIn('"--tls_ca=/etc/mutwo/tls/ca.crt"', health)
        cmd = json.loads(self.instr("server", "CMD")[0])
        for flag in ("--auth_tokens_file=/etc/mutwo/auth/tokens.txt",
                     "--tls_cert=/etc/mutwo/tls/tls.crt",
                     "--tls_key=/etc/mutwo/tls/tls.key"):
            self.assertIn(flag, cmd)
        self.assertEqual(json.loads(self.instr("server", "ENTRYPOINT")[0])[2],
                         "mutwo-server")
        self.assertIn("--data_dir=/var/lib/mutwo",
                      json.loads(self.instr("server", "CMD")[0]))
        self.assertEqual(json.loads(self.instr("server", "VOLUME")[0]),
                         ["/var/lib/mutwo"])
        for stage in ("worker-cpu", "worker-gpu"):
            self.assertEqual(json.loads(self.instr(stage, "ENTRYPOINT")[0])[2:],
                             ["mutwo-worker", "serve"])

    def test_copies_come_from_stages_and_files_exist(self):
        for stage, s in self.stages.items():
            for line in s["lines"]:
                m = re.match(r"COPY\s+--from=(\S+)", line, re.I)
                if m:
                    self.assertIn(m.group(1), self.stages, line)
        for script in ("scripts/bootstrap.sh", "scripts/test.sh",
                       "deploy/docker/runtime-libs.sh"):
            self.assertTrue(os.access(os.path.join(ROOT, script), os.X_OK), script)
        ignored = read(".dockerignore").split()
        for path in ("/build", "/build-*", ".git", "/.gpu"):
            self.assertIn(path, ignored)


class GpuWorkerCommandLineTest(unittest.TestCase):
    """The GPU worker runs with the command line the GPU service test starts
    (deploy_lib.gpu_worker_args): same flags, same order, no
    others, and the deployed values."""

    def check(self, where, args, server):
        flags = dl.parse_flag_args(args)
        self.assertEqual(tuple(flags), dl.GPU_WORKER_FLAGS, where)
        self.assertEqual(args, dl.gpu_worker_args(**flags), where)
        self.assertEqual(flags["server"], server, where)
        for name, value in dl.GPU_WORKER_DEPLOYED.items():
            self.assertEqual(flags[name], value, "%s: --%s" % (where, name))

    def test_kubernetes(self):
        with open(os.path.join(dl.DEPLOY, "k8s", "worker-gpu.yaml")) as f:
            (deployment,) = [d for d in yaml.safe_load_all(f) if d]
        (c,) = deployment["spec"]["template"]["spec"]["containers"]
        self.assertNotIn("command", c, "the image's ENTRYPOINT runs serve")
        self.check("deploy/k8s/worker-gpu.yaml", c["args"], "mutwo-server:50051")
        self.assertEqual(c["image"].split(":")[0], "mutwo-worker-gpu")

    def test_compose(self):
        svc = load_yaml("deploy", "compose.yaml")["services"]["worker-gpu"]
        self.assertNotIn("entrypoint", svc, "the image's ENTRYPOINT runs serve")
        self.assertEqual(svc["build"]["target"], "worker-gpu")
        self.check("deploy/compose.yaml", svc["command"], "server:50051")

    def test_dockerfile(self):
        text = re.sub(r"\\\n", " ", read("Dockerfile"))
        stage = text.split("AS worker-gpu", 1)[1].split("\nFROM ", 1)[0]
        (entry,) = re.findall(r"^ENTRYPOINT\s+(\[.*\])\s*$", stage, re.M)
        self.assertEqual(json.loads(entry)[2:], ["mutwo-worker", "serve"])
        (cmd,) = re.findall(r"^CMD\s+(\[.*\])\s*$", stage, re.M)
        self.check("Dockerfile worker-gpu", json.loads(cmd), "mutwo-server:50051")
        (health,) = re.findall(r"^HEALTHCHECK.*$", stage, re.M)
        self.assertIn("http://127.0.0.1:%s/metrics"
                      % dl.GPU_WORKER_DEPLOYED["metrics_listen"].split(":")[1],
                      health)

    def test_gpu_test_uses_the_same_args(self):
        """test_gpu_service.py builds its workers' argv with
        deploy_lib.gpu_worker_argv (and nothing else starts a worker there)."""
        text = read("tests", "deploy", "test_gpu_service.py")
        self.assertIn("dl.gpu_worker_argv(", text)
        self.assertNotIn('"serve"', text)
        argv = dl.gpu_worker_argv("/bin/mutwo-worker", "127.0.0.1:1", "cuda:1",
                                  "127.0.0.1:2", "/tmp/w")
        self.assertEqual(argv[:2], ["/bin/mutwo-worker", "serve"])
        self.assertEqual(tuple(dl.parse_flag_args(argv[2:])), dl.GPU_WORKER_FLAGS)

    def test_a_drifted_line_is_caught(self):
        good = dl.gpu_worker_args("s:1", "cuda:0", "0.0.0.0:9465",
                                  "/var/lib/mutwo-worker")
        for bad in (good[:-1], good + ["--task_memory_limit=8GiB"],
                    [good[1], good[0]] + good[2:], good[:2] + ["serve"] + good[2:]):
            with self.assertRaises((AssertionError, ValueError)):
                self.check("drift", bad, "s:1")


class GenAuthTest(unittest.TestCase):
    """deploy/gen-auth.sh makes tokens whose hashes are in tokens.txt, a
    server certificate for every name the deployments use, signed by its CA,
    and a set the real mutwo-server and mutwo CLI work with."""
    SCRIPT = os.path.join(ROOT, "deploy", "gen-auth.sh")

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="mutwo-gen-auth-")
        self.dir = os.path.join(self.tmp.name, "secrets")
        r = subprocess.run([self.SCRIPT, self.dir], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def test_tokens_and_their_hashes(self):
        import hashlib
        lines = [line.split() for line in read_file(self.path("tokens.txt")).splitlines()
                 if line and not line.startswith("#")]
        self.assertEqual([(r, p) for r, p, _ in lines],
                         [("admin", "admin"), ("client", "client"),
                          ("worker", "worker")])
        for role, _, field in lines:
            token = read_file(self.path(role + ".token")).strip()
            self.assertGreaterEqual(len(token), 40)
            self.assertEqual(field, "sha256:" + hashlib.sha256(token.encode()).hexdigest())
            self.assertNotIn(token, read_file(self.path("tokens.txt")))
        self.assertEqual(os.stat(self.dir).st_mode & 0o777, 0o700)
        self.assertEqual(os.stat(self.path("ca.key")).st_mode & 0o777, 0o600)
        r = subprocess.run([self.SCRIPT, self.dir], capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0, "overwrote existing secrets")

    def test_certificate_names_and_chain(self):
        r = subprocess.run(["openssl", "verify", "-CAfile", self.path("ca.crt"),
                            self.path("tls.crt")], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        r = subprocess.run(["openssl", "x509", "-in", self.path("tls.crt"), "-noout",
                            "-ext", "subjectAltName"], capture_output=True, text=True)
        names = set(re.findall(r"(?:DNS|IP Address):([^,\s]+)", r.stdout))
        # Probes and health checks use 127.0.0.1; compose workers reach
        # `server`, Kubernetes workers the Service `mutwo-server`.
        self.assertLessEqual({"127.0.0.1", "localhost", "server", "mutwo-server"},
                             names)

    def test_the_server_and_cli_accept_them(self):
        if BIN_DIR is None:
            self.skipTest("no BIN_DIR given")
        log_path = os.path.join(self.tmp.name, "server.log")
        with open(log_path, "w") as log:
            server = subprocess.Popen(
                [os.path.join(BIN_DIR, "mutwo-server"), "--listen=127.0.0.1:0",
                 "--metrics_listen=", "--data_dir=" + os.path.join(self.tmp.name, "d"),
                 "--auth_tokens_file=" + self.path("tokens.txt"),
                 "--tls_cert=" + self.path("tls.crt"),
                 "--tls_key=" + self.path("tls.key")],
                stdout=log, stderr=subprocess.STDOUT)
        try:
            port = None
            for _ in range(100):
                m = re.search(r"\(port (\d+)\)", read_file(log_path))
                if m:
                    port = m.group(1)
                    break
                time.sleep(0.1)
            self.assertIsNotNone(port, read_file(log_path))

            def cli(*args, token=None):
                argv = [os.path.join(BIN_DIR, "mutwo"), *args,
                        "--server=localhost:" + port,
                        "--tls_ca=" + self.path("ca.crt"), "--timeout_ms=5000"]
                if token:
                    argv.append("--token_file=" + self.path(token + ".token"))
                return subprocess.run(argv, capture_output=True, text=True)

            self.assertEqual(cli("health").returncode, 0)
            r = cli("jobs", token="client")
            self.assertEqual(r.returncode, 0, r.stderr)
            r = cli("jobs", token="worker")  # workers may not list jobs
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("needs role client or admin", r.stderr)
        finally:
            server.terminate()
            server.wait(timeout=20)

    def test_the_server_refuses_an_open_network_port(self):
        if BIN_DIR is None:
            self.skipTest("no BIN_DIR given")
        r = subprocess.run([os.path.join(BIN_DIR, "mutwo-server"),
                            "--listen=0.0.0.0:0", "--metrics_listen=",
                            "--data_dir=" + os.path.join(self.tmp.name, "open")],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--insecure", r.stderr)


def read_file(path):
    with open(path) as f:
        return f.read()


class RuntimeLibsTest(unittest.TestCase):
    SCRIPT = os.path.join(ROOT, "deploy", "docker", "runtime-libs.sh")

    def setUp(self):
        if BIN_DIR is None:
            self.skipTest("no BIN_DIR given")
        self.server = os.path.join(BIN_DIR, "mutwo-server")
        self.assertTrue(os.access(self.server, os.X_OK), self.server)

    def test_packages_of_the_server(self):
        r = subprocess.run([self.SCRIPT, "packages", self.server],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        pkgs = r.stdout.split()
        for want in ("libgrpc++1.51", "libprotobuf32", "libsqlite3-0",
                     "libprometheus-cpp-core1.0", "libabsl20220623"):
            self.assertIn(want, pkgs)
        for unwanted in ("libc6", "libstdc++6", "libgcc-s1"):
            self.assertNotIn(unwanted, pkgs)
        self.assertFalse([p for p in pkgs if p.endswith("-dev")], pkgs)

    def test_copy_and_errors(self):
        with tempfile.TemporaryDirectory() as d:
            r = subprocess.run([self.SCRIPT, "copy", d, self.server],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            libs = os.listdir(d)
            self.assertIn("libgrpc++.so.1.51", libs)
            self.assertNotIn("libc.so.6", libs)
        r = subprocess.run([self.SCRIPT, "packages", "/nonexistent/bin"],
                           capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("/nonexistent/bin", r.stderr)


if __name__ == "__main__":
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
        BIN_DIR = sys.argv.pop(1)
    unittest.main(verbosity=2)
