#!/usr/bin/env python3
"""Static checks of Granary's Grafana dashboards (dashboards/generate.py).

Grafana's dashboard-linter (Go module github.com/grafana/dashboard-linter) could
not be fetched here: the Go module proxy refuses its versions (v0.1.1, v0.1.0:
"403 This module version is not available"). These are the checks of it that
matter for these dashboards, plus Granary's own:

- the committed JSON (charts/granary/dashboards/ and dashboards/) is the
  generator's output, byte for byte, in both places;
- dashboard uids unique; panel ids unique within a dashboard; gridPos set and
  no two panels overlapping;
- templating: a `datasource` variable of type datasource (Prometheus); every
  panel and every target uses it (`${datasource}`), never a fixed data source;
- every target has an expr and a unique refId; every `$variable` in a query is
  defined (or one of Grafana's $__rate_interval / $__range);
- every metric a query names is one the daemons declare today
  (AddCounter/AddGauge/AddHistogram in cachenode/src, sidecar/src, operator/src)
  or Prometheus' `up`; histograms only through _bucket in histogram_quantile;
- rate()/irate()/increase() only over counters (_total) or histogram buckets;
- label matchers and groupings only on low-cardinality labels, and `instance`,
  `job` and `dataset` only matched against a template variable (no hard-coded
  instance);
- every panel has a title and a description.

Run: python3 tests/monitoring/dashboards_lint_test.py (CTest: dashboards_lint).
"""

import glob
import json
import os
import re
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "dashboards"))
import generate  # noqa: E402

PROMQL_WORDS = {
    "sum", "count", "count_values", "max", "min", "avg", "rate", "irate", "increase",
    "histogram_quantile", "clamp_min", "clamp_max", "by", "without", "and", "or", "unless",
    "on", "ignoring", "group_left", "group_right", "vector", "scalar", "label_replace",
}
GRAFANA_VARIABLES = {"__rate_interval", "__range", "__interval"}
# Labels a query may match or group on: the daemons' (dataset, type, class,
# from, kind, result, op, the cache policy's eviction reason, and the
# operator's quota gauges' pool and namespace), Prometheus' target labels,
# histogram `le`, and the `state` label count_values makes.
ALLOWED_LABELS = {"dataset", "type", "class", "from", "kind", "result", "op", "reason", "pool",
                  "namespace", "instance", "job", "le", "state"}
# Labels whose values depend on the cluster: only ever a template variable.
VARIABLE_ONLY_LABELS = {"instance", "job", "dataset"}


def declared_metrics():
    """{name: kind} from the metric declarations of the daemons' sources."""
    metrics = {"up": "gauge"}
    pattern = re.compile(r"Add(Counter|Gauge|Histogram)(?:Family)?\(\s*\"(granary_[a-z0-9_]+)\"")
    for d in ("cachenode/src", "sidecar/src", "operator/src", "daemon/src"):
        for path in glob.glob(os.path.join(ROOT, d, "**", "*.cc"), recursive=True):
            with open(path) as f:
                text = f.read()
            for kind, name in pattern.findall(text):
                metrics[name] = kind.lower()
    return metrics


def strip_strings(expr):
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)


def metric_references(expr):
    """Metric names in an expression: identifiers that are not PromQL words,
    not label names inside {...} or by/without (...), not durations."""
    e = strip_strings(expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", e)
    names = re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", e)
    return [n for n in names if n not in PROMQL_WORDS]


class DashboardLint(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dashboards = {}
        for path in sorted(glob.glob(os.path.join(ROOT, "charts", "granary", "dashboards", "*.json"))):
            with open(path) as f:
                cls.dashboards[os.path.basename(path)] = json.load(f)
        cls.metrics = declared_metrics()

    def panels(self):
        for name, d in self.dashboards.items():
            for p in d["panels"]:
                yield name, p

    def targets(self):
        for name, p in self.panels():
            for t in p.get("targets", []):
                yield name, p, t

    def test_committed_json_is_the_generators_output(self):
        for path, text in generate.outputs().items():
            self.assertTrue(os.path.exists(path), f"{path} missing: run dashboards/generate.py")
            with open(path) as f:
                self.assertEqual(f.read(), text,
                                 f"{path} differs from dashboards/generate.py's output: run it")
        chart = sorted(os.path.basename(p) for p in glob.glob(
            os.path.join(ROOT, "charts", "granary", "dashboards", "*.json")))
        top = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "dashboards", "*.json")))
        self.assertEqual(chart, top, "charts/granary/dashboards and dashboards/ hold different files")
        self.assertEqual(chart, ["granary-dataset.json", "granary-node.json", "granary-overview.json"])
        # --check agrees (what a developer runs).
        r = subprocess.run([sys.executable, os.path.join(ROOT, "dashboards", "generate.py"), "--check"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_uids_and_ids_unique(self):
        uids = [d["uid"] for d in self.dashboards.values()]
        self.assertEqual(len(uids), len(set(uids)), uids)
        for name, d in self.dashboards.items():
            self.assertEqual(name, d["uid"] + ".json")
            ids = [p["id"] for p in d["panels"]]
            self.assertEqual(len(ids), len(set(ids)), f"{name}: panel ids {ids}")
            self.assertTrue(d["title"].startswith("Granary / "), d["title"])

    def test_layout(self):
        for name, d in self.dashboards.items():
            cells = {}
            for p in d["panels"]:
                g = p["gridPos"]
                self.assertLessEqual(g["x"] + g["w"], 24, f"{name}: {p['title']}")
                for x in range(g["x"], g["x"] + g["w"]):
                    for y in range(g["y"], g["y"] + g["h"]):
                        self.assertNotIn((x, y), cells,
                                         f"{name}: '{p['title']}' overlaps '{cells.get((x, y))}'")
                        cells[(x, y)] = p["title"]

    def test_datasource_variable_everywhere(self):
        for name, d in self.dashboards.items():
            variables = {v["name"]: v for v in d["templating"]["list"]}
            self.assertIn("datasource", variables, name)
            self.assertEqual(variables["datasource"]["type"], "datasource")
            self.assertEqual(variables["datasource"]["query"], "prometheus")
            for v in variables.values():
                if v["type"] == "query":
                    self.assertEqual(v["datasource"]["uid"], "${datasource}", f"{name}: {v['name']}")
        want = {"type": "prometheus", "uid": "${datasource}"}
        for name, p in self.panels():
            if p["type"] == "row":
                continue
            self.assertEqual(p.get("datasource"), want, f"{name}: panel '{p['title']}'")
            self.assertTrue(p.get("title"), f"{name}: panel {p['id']} has no title")
            self.assertTrue(p.get("description"), f"{name}: '{p['title']}' has no description")
            self.assertTrue(p.get("targets"), f"{name}: '{p['title']}' has no targets")
        for name, p, t in self.targets():
            self.assertEqual(t.get("datasource"), want, f"{name}: '{p['title']}' {t.get('refId')}")

    def test_targets_have_exprs_and_refids(self):
        for name, p in self.panels():
            refs = [t["refId"] for t in p.get("targets", [])]
            self.assertEqual(len(refs), len(set(refs)), f"{name}: '{p['title']}' refIds {refs}")
            for t in p.get("targets", []):
                self.assertTrue(t.get("expr", "").strip(), f"{name}: '{p['title']}' {t['refId']}")

    def test_variables_defined(self):
        for name, d in self.dashboards.items():
            defined = {v["name"] for v in d["templating"]["list"]} | GRAFANA_VARIABLES
            for p in d["panels"]:
                for t in p.get("targets", []):
                    for var in re.findall(r"\$\{?(\w+)", t["expr"]):
                        self.assertIn(var, defined, f"{name}: '{p['title']}': ${var}")
            for v in d["templating"]["list"]:
                if v["type"] == "query":
                    self.assertRegex(v["definition"], r"^label_values\(granary_[a-z_]+, [a-z_]+\)$")
                    for ref in metric_references(v["definition"].replace("label_values", "")):
                        if ref not in ALLOWED_LABELS:
                            self.assertIn(ref, self.metrics, f"{name}: variable {v['name']}")

    def test_only_declared_metrics(self):
        self.assertIn("granary_sidecar_client_wait_seconds", self.metrics)  # the parse works
        for name, p, t in self.targets():
            for ref in metric_references(t["expr"]):
                where = f"{name}: '{p['title']}': {t['expr']}"
                if ref.endswith("_bucket"):
                    base = ref[: -len("_bucket")]
                    self.assertEqual(self.metrics.get(base), "histogram", f"{ref} in {where}")
                    self.assertIn("histogram_quantile", t["expr"], where)
                else:
                    self.assertIn(ref, self.metrics, f"unknown metric {ref} in {where}")

    def test_rate_over_counters_only(self):
        for name, p, t in self.targets():
            for fn, metric in re.findall(r"\b(rate|irate|increase)\(\s*([A-Za-z_:][A-Za-z0-9_:]*)",
                                         t["expr"]):
                kind = self.metrics.get(metric)
                ok = (metric.endswith("_total") and kind == "counter") or metric.endswith("_bucket")
                self.assertTrue(ok, f"{name}: '{p['title']}': {fn}() over {metric} ({kind})")
                self.assertRegex(t["expr"], re.escape(fn) + r"\([^()]*\[\$__(rate_interval|range)\]\)",
                                 f"{name}: '{p['title']}': {fn}() window must be a Grafana variable")
            # A counter's raw value is meaningless across restarts: only through rate/increase.
            for ref in metric_references(t["expr"]):
                if self.metrics.get(ref) == "counter":
                    self.assertRegex(t["expr"], r"\b(rate|irate|increase)\(\s*" + re.escape(ref),
                                     f"{name}: '{p['title']}': counter {ref} without rate()")

    def test_low_cardinality_labels_and_no_hard_coded_instance(self):
        for name, p, t in self.targets():
            expr = t["expr"]
            where = f"{name}: '{p['title']}': {expr}"
            for body in re.findall(r"\{([^}]*)\}", expr):
                for label, op, value in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', body):
                    self.assertIn(label, ALLOWED_LABELS, where)
                    if label in VARIABLE_ONLY_LABELS:
                        self.assertRegex(value, r"^\$\w+$", f"hard-coded {label} in {where}")
            for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
                for label in re.split(r"\s*,\s*", group.strip()):
                    self.assertIn(label, ALLOWED_LABELS, where)
            self.assertNotRegex(expr, r"\d+\.\d+\.\d+\.\d+|:\d{2,5}\b", f"an address in {where}")

    def test_the_overview_has_what_the_issue_asks_for(self):
        overview = self.dashboards["granary-overview.json"]
        exprs = " ".join(t["expr"] for p in overview["panels"] for t in p.get("targets", []))
        for needed in ["up{", "granary_cachenode_used_bytes", "granary_cachenode_capacity_bytes",
                       "granary_cachenode_staging_state", "granary_cachenode_source_read_bytes_total",
                       'granary_sidecar_served_bytes_total{from="prefetch"}',
                       "granary_sidecar_fetched_bytes_total",
                       "granary_cachenode_served_bytes_total",
                       "granary_sidecar_served_samples_total", "granary_cachenode_source_opens_total",
                       "histogram_quantile(0.5", "histogram_quantile(0.99",
                       "granary_sidecar_client_wait_seconds_bucket",
                       "granary_cachenode_checksum_failures_total"]:
            self.assertIn(needed, exprs)
        dataset = {v["name"] for v in self.dashboards["granary-dataset.json"]["templating"]["list"]}
        node = {v["name"] for v in self.dashboards["granary-node.json"]["templating"]["list"]}
        self.assertIn("dataset", dataset)
        self.assertIn("instance", node)

    def test_chart_configmaps_carry_the_same_json(self):
        r = subprocess.run([os.path.join(ROOT, "scripts", "k8s-tools"), "--no-build"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            self.skipTest("helm is not built (scripts/k8s-tools): " + r.stderr.strip())
        helm = os.path.join(r.stdout.strip(), "helm")
        import yaml
        args = [helm, "template", "rel", os.path.join(ROOT, "charts", "granary"), "--kube-version",
                "1.37.2", "--show-only", "templates/dashboards-configmaps.yaml",
                "--set", "dashboards.namespace=monitoring", "--set", "dashboards.labelKey=dash",
                "--set", "dashboards.labelValue=yes", "--set", "dashboards.folder=ML data"]
        out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
        maps = [d for d in yaml.safe_load_all(out) if d]
        self.assertEqual(len(maps), len(self.dashboards))
        for m in maps:
            self.assertEqual(m["kind"], "ConfigMap")
            self.assertEqual(m["metadata"]["namespace"], "monitoring")
            self.assertEqual(m["metadata"]["labels"]["dash"], "yes")
            self.assertEqual(m["metadata"]["annotations"], {"grafana_folder": "ML data"})
            (key, text), = m["data"].items()
            self.assertEqual(json.loads(text), self.dashboards[key])
        default = subprocess.run(args[:8], capture_output=True, text=True, check=True).stdout
        for m in (d for d in yaml.safe_load_all(default) if d):
            self.assertEqual(m["metadata"]["labels"]["grafana_dashboard"], "1")
        off = subprocess.run(args[:6] + ["--set", "dashboards.enabled=false"],
                             capture_output=True, text=True)
        self.assertNotIn("grafana_dashboard", off.stdout)
        bad = subprocess.run(args[:6] + ["--set", "dashboards.labelKey=bad key"],
                             capture_output=True, text=True)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("/dashboards/labelKey", bad.stderr)

    def test_the_linter_catches_what_it_should(self):
        # A check that cannot fail is a defect: feed it bad queries.
        self.assertIn("granary_nope_total", metric_references('rate(granary_nope_total{dataset="x"}[5m])'))
        self.assertEqual(metric_references('sum by (le, dataset) (rate(a_bucket{job=~"$j"}[$__range]))'),
                         ["a_bucket"])
        bad = {"uid": "x", "templating": {"list": [{"name": "datasource", "type": "datasource",
                                                   "query": "prometheus"}]},
               "panels": [{"type": "timeseries", "id": 1, "title": "t",
                                        "targets": [{"expr": 'up{instance="10.0.0.1:9464"}'}]}]}
        saved = self.dashboards
        try:
            self.dashboards = {"x.json": bad}
            with self.assertRaises(AssertionError):
                self.test_low_cardinality_labels_and_no_hard_coded_instance()
            bad["panels"][0]["targets"][0]["expr"] = "rate(granary_cachenode_used_bytes[$__rate_interval])"
            with self.assertRaises(AssertionError):
                self.test_rate_over_counters_only()
            bad["panels"][0]["targets"][0]["expr"] = "granary_cachenode_served_bytes_total"
            with self.assertRaises(AssertionError):
                self.test_rate_over_counters_only()
            bad["panels"][0]["targets"][0]["expr"] = "granary_sidecar_made_up_bytes"
            with self.assertRaises(AssertionError):
                self.test_only_declared_metrics()
            bad["panels"][0]["datasource"] = {"type": "prometheus", "uid": "P1809F7CD0C75ACF3"}
            with self.assertRaises(AssertionError):
                self.test_datasource_variable_everywhere()
        finally:
            self.dashboards = saved


if __name__ == "__main__":
    unittest.main(verbosity=2)
