#!/usr/bin/env python3
"""Generates Granary's Grafana dashboards (the one source of their JSON).

    dashboards/generate.py            writes the JSON files
    dashboards/generate.py --check    exits 1 naming any file that differs

Each dashboard is written twice, byte for byte the same:
  charts/granary/dashboards/<uid>.json  what the chart ships as ConfigMaps
                                        (Helm's .Files.Get reads only inside
                                        the chart directory);
  dashboards/<uid>.json                 for admins who import by hand.
tests/monitoring/dashboards_lint_test.py checks that both equal this script's
output, so neither can drift.

Every query uses only metrics granary-cachenode and granary-sidecar export
(docs/cachenode.md, docs/sidecar.md "Metrics"), granary-operator's namespace
quota gauges (docs/kubernetes.md, "When the pool is full") and Prometheus' own
`up`, with their low-cardinality labels (dataset, type, class, from, kind,
reason, pool, namespace) and the `instance`/`job` labels Prometheus adds. The
operator exports no metric with a dataset's phase (only reconciles, errors,
relists, leader and the quota gauges), so the overview shows the cache nodes'
per-dataset staging state instead.
"""

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUTPUT_DIRS = [os.path.join(ROOT, "charts", "granary", "dashboards"), os.path.join(ROOT, "dashboards")]

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"

STAGING_STATES = {0: "idle", 1: "staging", 2: "complete", 3: "capacity", 4: "disk full", 5: "stopped"}


def target(expr, legend="", instant=False):
    t = {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend or "__auto", "refId": ""}
    if instant:
        t["instant"] = True
        t["range"] = False
    return t


def panel(kind, title, description, targets, unit="short", w=8, h=8, **extra):
    p = {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {},
        "_size": (w, h),
    }
    if kind == "timeseries":
        p["fieldConfig"]["defaults"]["custom"] = {"fillOpacity": 10, "lineWidth": 1}
        p["options"] = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "multi", "sort": "desc"}}
    elif kind in ("stat", "gauge", "bargauge"):
        p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}
    for key, value in extra.items():
        if key == "mappings":
            p["fieldConfig"]["defaults"]["mappings"] = value
        elif key == "minmax":
            p["fieldConfig"]["defaults"]["min"], p["fieldConfig"]["defaults"]["max"] = value
        elif key == "thresholds":
            p["fieldConfig"]["defaults"]["thresholds"] = {"mode": "absolute", "steps": value}
        else:
            p[key] = value
    return p


def row(title):
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "_size": (24, 1)}


def layout(panels):
    """Ids, refIds and gridPos: panels flow left to right, 24 columns wide."""
    x = y = row_h = 0
    for i, p in enumerate(panels, start=1):
        w, h = p.pop("_size")
        if p["type"] == "row" or x + w > 24:
            x, y, row_h = 0, y + row_h, 0
        p["id"] = i
        p["gridPos"] = {"h": h, "w": w, "x": x, "y": y}
        x += w
        row_h = max(row_h, h)
        if p["type"] == "row":
            x, y, row_h = 0, y + h, 0
        for n, t in enumerate(p.get("targets", [])):
            t["refId"] = chr(ord("A") + n)
    return panels


def datasource_var():
    return {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
            "current": {}, "hide": 0, "refresh": 1, "regex": "", "options": []}


def query_var(name, label, query, include_all=False):
    v = {"name": name, "label": label, "type": "query", "datasource": DATASOURCE,
         "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
         "definition": query, "current": {}, "hide": 0, "refresh": 2, "regex": "", "sort": 1,
         "options": [], "multi": include_all, "includeAll": include_all}
    # No allValue: "All" then stands for the values the query found, joined as a regex
    # (a|b), never ".*", which would match every scrape job Prometheus has.
    return v


def dashboard(uid, title, description, variables, panels, tags):
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["granary"] + tags,
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "refresh": "30s",
        "annotations": {"list": []},
        "links": [{"title": "Granary dashboards", "type": "dashboards", "tags": ["granary"],
                   "asDropdown": True, "includeVars": False, "keepTime": True}],
        "templating": {"list": [datasource_var()] + variables},
        "panels": layout(panels),
    }


STATE_MAPPINGS = [{"type": "value", "options": {str(k): {"text": v, "index": k}
                                                 for k, v in STAGING_STATES.items()}}]
STATE_TEXT = ", ".join(f"{k} {v}" for k, v in STAGING_STATES.items())

# Samples the trainers got, against the source opens Granary made for them. A
# trainer reading files straight from shared storage opens every sample every
# epoch, so the sidecars' samples handed out are the opens it would have made;
# Granary's own opens are the cache nodes' (staging and on-demand fetches) plus
# the sidecars' fall-through reads (each at least one open).
SERVED_SAMPLES = "sum(increase(granary_sidecar_served_samples_total[$__range]))"
SOURCE_OPENS = ("(sum(increase(granary_cachenode_source_opens_total[$__range])) + "
                "sum(increase(granary_sidecar_fetched_samples_total{from=\"source\"}[$__range])))")
SAVED_FORMULA = ("saved = samples handed to trainers by the sidecars "
                 "(granary_sidecar_served_samples_total) - source opens Granary made "
                 "(granary_cachenode_source_opens_total, staging and on-demand, + "
                 "granary_sidecar_fetched_samples_total{from=\"source\"}, fall-through), "
                 "over the dashboard's time range. Reading every epoch straight from the "
                 "source costs one open per sample handed out; Granary reads each sample "
                 "from the source about once for the whole training, so the saving grows "
                 "with every epoch (as Monarch reports PFS operations saved).")


def overview():
    panels = [
        row("Cluster"),
        panel("stat", "Cache nodes up",
              "Cache nodes Prometheus scrapes successfully (up) out of those it scrapes; "
              "job from the cachenode_job variable.",
              [target('sum(up{job=~"$cachenode_job"})', "up", instant=True),
               target('count(up{job=~"$cachenode_job"})', "scraped", instant=True)],
              w=4, h=5),
        panel("gauge", "Capacity used",
              "Chunk-store bytes used over the capacity the cache nodes may use, summed over "
              "the pool (granary_cachenode_used_bytes / granary_cachenode_capacity_bytes).",
              [target("sum(granary_cachenode_used_bytes) / sum(granary_cachenode_capacity_bytes)",
                      "used", instant=True)],
              unit="percentunit", w=4, h=5, minmax=(0, 1),
              thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 0.8},
                          {"color": "red", "value": 0.95}]),
        panel("stat", "Datasets",
              "Datasets at least one cache node stages and serves "
              "(distinct dataset labels of granary_cachenode_staging_state).",
              [target("count(count by (dataset) (granary_cachenode_staging_state))", "datasets",
                      instant=True)],
              w=4, h=5),
        panel("bargauge", "Dataset shares by staging state",
              "The operator exports no dataset phase metric, so this counts (cache node, "
              "dataset) pairs by the node's granary_cachenode_staging_state: "
              f"{STATE_TEXT}. A dataset on 3 nodes counts 3 times; all 'complete' means "
              "every share is staged.",
              [target('count_values("state", granary_cachenode_staging_state)', "{{state}}",
                      instant=True)],
              w=6, h=5, mappings=STATE_MAPPINGS),
        panel("stat", "Checksum failures",
              "Segments read from chunk files that failed their checksum over the time range "
              "(granary_cachenode_checksum_failures_total); each is dropped and re-staged "
              "(granary_cachenode_restaged_segments_total). Anything above 0 means a disk "
              "returns wrong bytes.",
              [target("sum(increase(granary_cachenode_checksum_failures_total[$__range]))",
                      "failures", instant=True),
               target("sum(increase(granary_cachenode_restaged_segments_total[$__range]))",
                      "re-staged", instant=True)],
              w=6, h=5,
              thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}]),
        panel("timeseries", "Capacity used by node",
              "granary_cachenode_used_bytes / granary_cachenode_capacity_bytes per cache node.",
              [target("granary_cachenode_used_bytes / granary_cachenode_capacity_bytes",
                      "{{instance}}")],
              unit="percentunit", w=12, minmax=(0, 1)),
        panel("timeseries", "Staging throughput",
              "Bytes per second the cache nodes read from the datasets' sources "
              "(granary_cachenode_source_read_bytes_total), by dataset: bulk staging and "
              "on-demand fetches.",
              [target(f"sum by (dataset) (rate(granary_cachenode_source_read_bytes_total[{RATE}]))",
                      "{{dataset}}")],
              unit="Bps", w=12),
        row("When the pool is full"),
        panel("bargauge", "Resident by dataset",
              "Of each dataset's bytes the cache nodes own (its shares, replicas counted), "
              "the part staged on them: sum by dataset of granary_cachenode_staged_bytes over "
              "granary_cachenode_owned_bytes. Below 1 once staging is done means the cache "
              "nodes keep only part of it (the pool is full, or its namespace's quota caps it) "
              "and stream the rest from the source.",
              [target("sum by (dataset) (granary_cachenode_staged_bytes) / "
                      "sum by (dataset) (granary_cachenode_owned_bytes)", "{{dataset}}",
                      instant=True)],
              unit="percentunit", w=8, minmax=(0, 1)),
        panel("timeseries", "Evicted by reason",
              "Chunk-file bytes per second the cache nodes drop to fit their cache policy "
              "(granary_cachenode_evicted_bytes_total), by reason: priority (for a "
              "higher-priority dataset), fair_share (for an equal one's share), ttl (not read "
              "for its TTL), limit (its namespace's quota). 0 when nothing is evicted.",
              [target(f"sum by (reason) (rate(granary_cachenode_evicted_bytes_total[{RATE}])) "
                      "or vector(0)", "{{reason}}")],
              unit="Bps", w=8),
        panel("timeseries", "Namespace quotas",
              "Per namespace with a quota in a pool (CachePool spec.quotas), as granary-operator "
              "reports it: the quota (granary_operator_namespace_quota_bytes), what the "
              "namespace's Datasets need, bytes times replication "
              "(granary_operator_namespace_wanted_bytes), and what they hold staged "
              "(granary_operator_namespace_resident_bytes). Every operator replica reports "
              "every namespace: max, not sum.",
              [target("max by (pool, namespace) (granary_operator_namespace_quota_bytes)",
                      "quota {{namespace}} in {{pool}}"),
               target("max by (pool, namespace) (granary_operator_namespace_wanted_bytes)",
                      "wanted {{namespace}} in {{pool}}"),
               target("max by (pool, namespace) (granary_operator_namespace_resident_bytes)",
                      "resident {{namespace}} in {{pool}}")],
              unit="bytes", w=8),
        row("Serving"),
        panel("timeseries", "Bytes by origin",
              "Where the bytes the trainers read came from. 'prefetched': handed out from the "
              "sidecar's shared memory, fetched ahead of the request "
              "(granary_sidecar_served_bytes_total{from=\"prefetch\"}). Fetched into shared "
              "memory (granary_sidecar_fetched_bytes_total{from}): 'local_node' (this host's "
              "cache node), 'peer' (another cache node), 'source' (fall-through to shared "
              "storage, should stay near 0 once staged).",
              [target(f'sum(rate(granary_sidecar_served_bytes_total{{from="prefetch"}}[{RATE}]))',
                      "prefetched"),
               target(f"sum by (from) (rate(granary_sidecar_fetched_bytes_total[{RATE}]))",
                      "{{from}}")],
              unit="Bps", w=12),
        panel("timeseries", "Cache node bytes served",
              "Payload bytes of READ replies the cache nodes sent to sidecars and peers over TCP "
              "(granary_cachenode_served_bytes_total), those sent with sendfile(2), and those "
              "written into readers' windows over libfabric "
              "(granary_cachenode_fabric_rma_bytes_total).",
              [target(f"sum(rate(granary_cachenode_served_bytes_total[{RATE}]))", "served"),
               target(f"sum(rate(granary_cachenode_sendfile_bytes_total[{RATE}]))", "sendfile"),
               target(f"sum(rate(granary_cachenode_fabric_rma_bytes_total[{RATE}]))",
                      "libfabric (RMA)")],
              unit="Bps", w=12),
        panel("stat", "Source opens saved",
              SAVED_FORMULA,
              [target(f"{SERVED_SAMPLES} - {SOURCE_OPENS}", "opens saved", instant=True),
               target(f"clamp_min({SERVED_SAMPLES} - {SOURCE_OPENS}, 0) / {SERVED_SAMPLES}",
                      "saved ratio", instant=True)],
              w=6, h=8),
        panel("timeseries", "Samples served vs source opens",
              "Samples per second handed to trainers (what reading from the source would open) "
              "against the opens Granary made on the sources. " + SAVED_FORMULA,
              [target(f"sum(rate(granary_sidecar_served_samples_total[{RATE}]))",
                      "samples served"),
               target(f"sum(rate(granary_cachenode_source_opens_total[{RATE}])) + "
                      f'sum(rate(granary_sidecar_fetched_samples_total{{from="source"}}[{RATE}]))',
                      "source opens")],
              unit="ops", w=9, h=8),
        panel("timeseries", "Sidecar client wait p50 / p99",
              "How long a trainer's GET or NEXT waited for its samples, over every sidecar "
              "(histogram_quantile on granary_sidecar_client_wait_seconds_bucket).",
              [target("histogram_quantile(0.5, sum by (le) "
                      f"(rate(granary_sidecar_client_wait_seconds_bucket[{RATE}])))", "p50"),
               target("histogram_quantile(0.99, sum by (le) "
                      f"(rate(granary_sidecar_client_wait_seconds_bucket[{RATE}])))", "p99")],
              unit="s", w=9, h=8),
        panel("timeseries", "Failures",
              "Samples a trainer asked for and did not get (granary_sidecar_failed_samples_total), "
              "cache nodes a sidecar marked down (granary_sidecar_node_failures_total), and "
              "READ items the cache nodes failed (granary_cachenode_served_item_errors_total).",
              [target(f"sum(rate(granary_sidecar_failed_samples_total[{RATE}]))", "failed samples"),
               target(f"sum(rate(granary_sidecar_node_failures_total[{RATE}]))", "node failures"),
               target(f"sum(rate(granary_cachenode_served_item_errors_total[{RATE}]))",
                      "item errors")],
              unit="ops", w=12),
        panel("timeseries", "Sidecar shared memory",
              "Samples prefetched and not yet handed out (window) and the arena's bytes holding "
              "samples, summed over sidecars.",
              [target("sum(granary_sidecar_window_bytes)", "window"),
               target("sum(granary_sidecar_arena_used_bytes)", "arena used"),
               target("sum(granary_sidecar_arena_bytes)", "arena")],
              unit="bytes", w=12),
    ]
    variables = [query_var("cachenode_job", "Cache node job",
                           "label_values(granary_cachenode_capacity_bytes, job)", include_all=True)]
    return dashboard("granary-overview", "Granary / Cluster overview",
                     "Granary at a glance: cache nodes, capacity, staging, where trainers' bytes "
                     "come from, source operations saved, client wait, checksum failures.",
                     variables, panels, ["overview"])


def dataset_view():
    sel = 'dataset="$dataset"'
    panels = [
        row("Staging"),
        panel("stat", "Resident",
              "Staged bytes over owned bytes, over every cache node holding a share "
              "(granary_cachenode_staged_bytes / granary_cachenode_owned_bytes): how much of "
              "the dataset is read from cache. Below 1 once staging is done means the cache "
              "nodes keep only part of it (kept bytes, below) and stream the rest from the "
              "source.",
              [target(f"sum(granary_cachenode_staged_bytes{{{sel}}}) / "
                      f"sum(granary_cachenode_owned_bytes{{{sel}}})", "resident", instant=True)],
              unit="percentunit", w=6, h=5, minmax=(0, 1)),
        panel("stat", "Sample errors",
              "Samples the cache nodes cannot stage (changed since the snapshot, gone, "
              "permission denied): granary_cachenode_sample_errors.",
              [target(f"sum(granary_cachenode_sample_errors{{{sel}}})", "samples", instant=True)],
              w=6, h=5,
              thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}]),
        panel("stat", "Staging state by node",
              f"granary_cachenode_staging_state per cache node: {STATE_TEXT}.",
              [target(f"granary_cachenode_staging_state{{{sel}}}", "{{instance}}", instant=True)],
              w=12, h=5, mappings=STATE_MAPPINGS),
        panel("timeseries", "Staged, kept and owned bytes by node",
              "The share placement gives each node (owned), the part of it the node keeps "
              "under the dataset's cache budget (granary_cachenode_kept_bytes; the rest is "
              "streamed from the source when read) and how much is staged.",
              [target(f"granary_cachenode_staged_bytes{{{sel}}}", "staged {{instance}}"),
               target(f"granary_cachenode_kept_bytes{{{sel}}}", "kept {{instance}}"),
               target(f"granary_cachenode_owned_bytes{{{sel}}}", "owned {{instance}}")],
              unit="bytes", w=12),
        panel("timeseries", "Staging queue",
              "Owned chunks neither staged nor being staged "
              "(granary_cachenode_staging_queue_chunks), by node.",
              [target(f"granary_cachenode_staging_queue_chunks{{{sel}}}", "{{instance}}")],
              w=12),
        row("Cache policy"),
        panel("timeseries", "Evicted bytes by reason",
              "Chunk-file bytes per second the cache nodes drop of this dataset to fit their "
              "cache policy (granary_cachenode_evicted_bytes_total), by reason: priority, "
              "fair_share, ttl, limit (docs/kubernetes.md, \"When the pool is full\"). 0 when "
              "nothing is evicted.",
              [target(f"sum by (reason) "
                      f"(rate(granary_cachenode_evicted_bytes_total{{{sel}}}[{RATE}])) "
                      "or vector(0)", "{{reason}}")],
              unit="Bps", w=8),
        panel("timeseries", "Evicted chunks by reason",
              "Chunks per second dropped of this dataset, by reason "
              "(granary_cachenode_evicted_chunks_total). 0 when nothing is evicted.",
              [target(f"sum by (reason) "
                      f"(rate(granary_cachenode_evicted_chunks_total{{{sel}}}[{RATE}])) "
                      "or vector(0)", "{{reason}}")],
              unit="ops", w=8),
        panel("timeseries", "Streamed from the source",
              "Bytes per second read from the source for readers and not kept, the part of "
              "the dataset outside its cache budget (granary_cachenode_streamed_bytes_total), "
              "by node. 0 when the whole dataset is kept.",
              [target(f"sum by (instance) "
                      f"(rate(granary_cachenode_streamed_bytes_total{{{sel}}}[{RATE}])) "
                      "or vector(0)", "{{instance}}")],
              unit="Bps", w=8),
        row("Source"),
        panel("timeseries", "Source read throughput",
              "Bytes per second read from the dataset's source "
              "(granary_cachenode_source_read_bytes_total), by node.",
              [target(f"sum by (instance) "
                      f"(rate(granary_cachenode_source_read_bytes_total{{{sel}}}[{RATE}]))",
                      "{{instance}}")],
              unit="Bps", w=12),
        panel("timeseries", "Source operations",
              "Opens and read calls on the source (granary_cachenode_source_opens_total, "
              "granary_cachenode_source_read_calls_total), samples staged "
              "(granary_cachenode_staged_samples_total) and on-demand fetches "
              "(granary_cachenode_on_demand_fetches_total), per second.",
              [target(f"sum(rate(granary_cachenode_source_opens_total{{{sel}}}[{RATE}]))", "opens"),
               target(f"sum(rate(granary_cachenode_source_read_calls_total{{{sel}}}[{RATE}]))",
                      "read calls"),
               target(f"sum(rate(granary_cachenode_staged_samples_total{{{sel}}}[{RATE}]))",
                      "samples staged"),
               target(f"sum(rate(granary_cachenode_on_demand_fetches_total{{{sel}}}[{RATE}]))",
                      "on-demand fetches")],
              unit="ops", w=12),
        panel("stat", "Source opens over the range",
              "Files opened on the dataset's source over the time range: about one per sample "
              "for the whole training once staged (granary_cachenode_source_opens_total). "
              "The sidecars' metrics carry no dataset label; see the overview for samples "
              "served.",
              [target(f"sum(increase(granary_cachenode_source_opens_total{{{sel}}}[$__range]))",
                      "opens", instant=True)],
              w=24, h=4),
    ]
    variables = [query_var("dataset", "Dataset",
                           "label_values(granary_cachenode_owned_bytes, dataset)")]
    return dashboard("granary-dataset", "Granary / Dataset",
                     "One dataset across the cache nodes: staging progress and state, "
                     "source traffic, sample errors.", variables, panels, ["dataset"])


def node_view():
    sel = 'instance="$instance"'
    panels = [
        row("Chunk store"),
        panel("stat", "Up", "Whether Prometheus scraped this cache node last time (up).",
              [target(f"up{{{sel}}}", "up", instant=True)], w=4, h=5,
              mappings=[{"type": "value", "options": {"0": {"text": "down", "color": "red"},
                                                       "1": {"text": "up", "color": "green"}}}]),
        panel("gauge", "Capacity used",
              "granary_cachenode_used_bytes / granary_cachenode_capacity_bytes.",
              [target(f"granary_cachenode_used_bytes{{{sel}}} / "
                      f"granary_cachenode_capacity_bytes{{{sel}}}", "used", instant=True)],
              unit="percentunit", w=5, h=5, minmax=(0, 1)),
        panel("stat", "Datasets", "Datasets this node stages and serves (granary_cachenode_datasets).",
              [target(f"granary_cachenode_datasets{{{sel}}}", "datasets", instant=True)], w=5, h=5),
        panel("stat", "Chunks", "Chunk files in the chunk store (granary_cachenode_chunks).",
              [target(f"granary_cachenode_chunks{{{sel}}}", "chunks", instant=True)], w=5, h=5),
        panel("stat", "Checksum failures",
              "Segments failing their checksum over the range, and re-staged "
              "(granary_cachenode_checksum_failures_total, granary_cachenode_restaged_segments_total).",
              [target(f"increase(granary_cachenode_checksum_failures_total{{{sel}}}[$__range])",
                      "failures", instant=True),
               target(f"increase(granary_cachenode_restaged_segments_total{{{sel}}}[$__range])",
                      "re-staged", instant=True)],
              w=5, h=5, thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}]),
        panel("timeseries", "Chunk store bytes",
              "Used, capacity and what the data directory's file system has left.",
              [target(f"granary_cachenode_used_bytes{{{sel}}}", "used"),
               target(f"granary_cachenode_capacity_bytes{{{sel}}}", "capacity"),
               target(f"granary_cachenode_filesystem_available_bytes{{{sel}}}", "fs available")],
              unit="bytes", w=12),
        panel("timeseries", "Staging by dataset",
              "Bytes per second this node reads from each dataset's source.",
              [target(f"sum by (dataset) "
                      f"(rate(granary_cachenode_source_read_bytes_total{{{sel}}}[{RATE}]))",
                      "{{dataset}}")],
              unit="Bps", w=12),
        row("Serving"),
        panel("timeseries", "Requests by type",
              "Protocol requests answered per second (granary_cachenode_requests_total{type}).",
              [target(f"sum by (type) (rate(granary_cachenode_requests_total{{{sel}}}[{RATE}]))",
                      "{{type}}")],
              unit="reqps", w=8),
        panel("timeseries", "Request errors by class",
              "granary_cachenode_request_errors_total{class} per second.",
              [target(f"sum by (class) "
                      f"(rate(granary_cachenode_request_errors_total{{{sel}}}[{RATE}]))",
                      "{{class}}")],
              unit="ops", w=8),
        panel("timeseries", "Request duration p50 / p99",
              "From a request decoded to its reply's last byte sent "
              "(granary_cachenode_request_duration_seconds).",
              [target("histogram_quantile(0.5, sum by (le) (rate("
                      f"granary_cachenode_request_duration_seconds_bucket{{{sel}}}[{RATE}])))",
                      "p50"),
               target("histogram_quantile(0.99, sum by (le) (rate("
                      f"granary_cachenode_request_duration_seconds_bucket{{{sel}}}[{RATE}])))",
                      "p99")],
              unit="s", w=8),
        panel("timeseries", "Bytes served",
              "READ payload bytes sent over TCP, those with sendfile(2), those written by RMA "
              "over libfabric, and bytes received.",
              [target(f"rate(granary_cachenode_served_bytes_total{{{sel}}}[{RATE}])", "served"),
               target(f"rate(granary_cachenode_sendfile_bytes_total{{{sel}}}[{RATE}])", "sendfile"),
               target(f"rate(granary_cachenode_fabric_rma_bytes_total{{{sel}}}[{RATE}])",
                      "libfabric (RMA)"),
               target(f"rate(granary_cachenode_received_bytes_total{{{sel}}}[{RATE}])",
                      "received")],
              unit="Bps", w=8),
        panel("timeseries", "Items from disk / on demand",
              "READ items served wholly from chunk files, and those with a part fetched from "
              "the source on demand (granary_cachenode_items_from_disk_total, "
              "granary_cachenode_items_on_demand_total).",
              [target(f"rate(granary_cachenode_items_from_disk_total{{{sel}}}[{RATE}])", "disk"),
               target(f"rate(granary_cachenode_items_on_demand_total{{{sel}}}[{RATE}])",
                      "on demand")],
              unit="ops", w=8),
        panel("timeseries", "Connections",
              "Protocol connections open and the bytes they hold in memory.",
              [target(f"granary_cachenode_connections{{{sel}}}", "connections"),
               target(f"granary_cachenode_buffered_bytes{{{sel}}}", "buffered bytes")],
              w=8),
        panel("timeseries", "Metadata store errors",
              "Failed metadata store calls (heartbeats, listings, progress): "
              "granary_cachenode_store_errors_total per second.",
              [target(f"rate(granary_cachenode_store_errors_total{{{sel}}}[{RATE}])", "errors")],
              unit="ops", w=24, h=6),
    ]
    variables = [query_var("instance", "Cache node",
                           "label_values(granary_cachenode_capacity_bytes, instance)")]
    return dashboard("granary-node", "Granary / Cache node",
                     "One cache node: chunk store, staging, serving, errors.",
                     variables, panels, ["node"])


DASHBOARDS = [overview, dataset_view, node_view]


def render(d):
    return json.dumps(d, indent=2, sort_keys=False) + "\n"


def outputs():
    """{path: text} for every file this script writes."""
    files = {}
    for make in DASHBOARDS:
        d = make()
        for out in OUTPUT_DIRS:
            files[os.path.join(out, d["uid"] + ".json")] = render(d)
    return files


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a committed file differs")
    args = parser.parse_args()
    stale = []
    for path, text in outputs().items():
        current = open(path).read() if os.path.exists(path) else None
        if current == text:
            continue
        if args.check:
            stale.append(os.path.relpath(path, ROOT))
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
            print("wrote", os.path.relpath(path, ROOT))
    if stale:
        print("dashboards differ from dashboards/generate.py's output: " + ", ".join(stale) +
              "; run dashboards/generate.py and commit the result", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
