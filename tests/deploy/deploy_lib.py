"""Helpers shared by the deployment tests: PromQL metric-name extraction,
Prometheus text-format parsing, and the paths of the deploy files."""

import json
import os
import re

SOURCE_DIR = os.environ.get("MUTWO_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
DEPLOY = os.path.join(SOURCE_DIR, "deploy")
DASHBOARD = os.path.join(DEPLOY, "grafana", "dashboards", "mutwo.json")
ALERTS = os.path.join(DEPLOY, "prometheus", "alerts.yml")

_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
    "and", "or", "unless", "offset", "inf", "nan", "atan2",
}
# Grafana's global variables, replaced by durations or values when the
# dashboard runs (stand-ins here so the text is plain PromQL).
_GRAFANA_VARS = {
    "$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h",
    "$__range_s": "3600", "$__interval_ms": "60000",
}


def grafana_to_promql(expr, template_value=".*"):
    """Replaces Grafana variables: durations for $__*, `template_value` for
    dashboard variables like $server (they sit in =~ matchers)."""
    for var, value in sorted(_GRAFANA_VARS.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(var, value)
    return re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", template_value, expr)


def metric_names(expr):
    """Metric names a PromQL expression reads (not functions, keywords,
    label names of by/without/on/ignoring lists, or matcher contents)."""
    s = grafana_to_promql(expr)
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', s)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)",
               " ", s)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        word = m.group(0)
        rest = s[m.end():].lstrip()
        if rest.startswith("("):
            continue  # a function or aggregation
        if word.lower() in _KEYWORDS:
            continue
        prev = s[:m.start()]
        if re.search(r"[0-9.]$", prev):
            continue  # part of a number like 1e-9
        names.add(word)
    return names


def label_matchers(expr):
    """(metric, label) pairs used in `metric{label=...}` selectors."""
    s = grafana_to_promql(expr)
    pairs = set()
    for m in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^}]*)\}", s):
        for lm in re.finditer(r"([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)",
                              m.group(2)):
            pairs.add((m.group(1), lm.group(1)))
    return pairs


def dashboard():
    with open(DASHBOARD) as f:
        return json.load(f)


def dashboard_exprs(dash=None):
    """Every PromQL text in the dashboard: panel targets (rows included) and
    query variables (label_values(metric, label) yields the metric)."""
    dash = dash or dashboard()
    exprs = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    exprs.append((p.get("title", ""), t["expr"]))
            walk(p.get("panels", []))

    walk(dash.get("panels", []))
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("query")
        q = q.get("query", "") if isinstance(q, dict) else (q or "")
        m = re.fullmatch(r"\s*label_values\(\s*(.+?)\s*,\s*[A-Za-z_]\w*\s*\)\s*", q)
        if not m:
            raise ValueError("variable %s: unsupported query %r" % (v["name"], q))
        exprs.append(("variable " + v["name"], m.group(1)))
    return exprs


def alert_exprs():
    import yaml  # python3-yaml
    with open(ALERTS) as f:
        rules = yaml.safe_load(f)
    return [(r.get("alert") or r.get("record"), r["expr"])
            for g in rules["groups"] for r in g["rules"]]


def parse_scrape(text):
    """Prometheus text format -> {sample name: [label dicts]}."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+\S+", line)
        if not m:
            raise ValueError("bad exposition line: %r" % line)
        labels = dict(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"',
                                 m.group(3) or ""))
        samples.setdefault(m.group(1), []).append(labels)
    return samples


# ---------------------------------------------------------------------------
# The GPU worker's command line: one source of truth. The deployment files
# (deploy/k8s/worker-gpu.yaml, deploy/compose.yaml, the Dockerfile's
# worker-gpu stage) run `mutwo-worker serve` with exactly these flags in this
# order (test_deploy_config.py checks it), and the GPU service test
# (test_gpu_service.py) starts its workers with them, with values for the
# test machine.
# ---------------------------------------------------------------------------
GPU_WORKER_FLAGS = ("server", "device", "metrics_listen", "work_dir")
# The values the deployment files use (the server's address differs: the
# Kubernetes Service is mutwo-server, the compose service is server).
GPU_WORKER_DEPLOYED = {
    "device": "cuda:0",  # one GPU per container (the runtime maps it to 0)
    "metrics_listen": "0.0.0.0:9465",
    "work_dir": "/var/lib/mutwo-worker",
}


def gpu_worker_args(server, device, metrics_listen, work_dir):
    """The arguments after `mutwo-worker serve`."""
    values = {"server": server, "device": device,
              "metrics_listen": metrics_listen, "work_dir": work_dir}
    return ["--%s=%s" % (flag, values[flag]) for flag in GPU_WORKER_FLAGS]


def gpu_worker_argv(worker_binary, server, device, metrics_listen, work_dir):
    """The whole command line of one GPU worker process."""
    return [worker_binary, "serve"] + gpu_worker_args(
        server, device, metrics_listen, work_dir)


def parse_flag_args(args):
    """["--a=1", "--b=2"] -> {"a": "1", "b": "2"}; ValueError for anything
    else (a positional argument, a flag without `=`, a repeated flag)."""
    flags = {}
    for a in args:
        m = re.fullmatch(r"--([A-Za-z0-9_]+)=(.*)", a)
        if not m or m.group(1) in flags:
            raise ValueError("unexpected worker argument %r in %r" % (a, args))
        flags[m.group(1)] = m.group(2)
    return flags
