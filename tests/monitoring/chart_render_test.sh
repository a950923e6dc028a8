#!/usr/bin/env bash
# The chart's store, network-policy and monitoring templates, rendered by the real
# helm (scripts/k8s-tools) and checked object by object:
#   - helm lint --strict;
#   - default values: the Redis StatefulSet, Services and Secrets; no monitors and no
#     PrometheusRule without the monitoring.coreos.com/v1 API, three PodMonitors and
#     the PrometheusRule with it (its spec equal to files/alerts.yaml, which promtool
#     checks), none with monitoring.enabled=false;
#   - the generated redis.conf and store URL run a real redis-server (AUTH required,
#     the URL's password accepted, noeviction);
#   - an external store (redis.enabled=false) renders no Redis; contradictory or
#     incomplete values fail with the field named;
#   - NetworkPolicies: Redis, the operator, one per chart-made pool;
#   - redis.sentinel.enabled: the data servers' and sentinels' StatefulSets, Services,
#     PDBs, the start scripts, the password file, the redis+sentinel:// URL, the
#     sentinels' NetworkPolicy, bad combinations refused naming the field; and the
#     rendered scripts and redis.conf run on loopback (two servers, three sentinels): the
#     primary killed, the replica promoted, the old primary back as a replica;
#   - on a real kube-apiserver (with etcd, from scripts/k8s-tools): every object of an
#     all-features rendering passes `kubectl apply --dry-run=server --validate=strict`,
#     and `helm install` then `helm upgrade` keep the generated Redis password (lookup).
# Usage: chart_render_test.sh <source dir>. Needs helm (scripts/k8s-tools, or
# GRANARY_K8S_BIN), python3 with PyYAML, redis-server, redis-cli and openssl; a missing tool
# fails the test with what to run.
set -euo pipefail

src=${1:?usage: chart_render_test.sh <source dir>}
chart="$src/charts/granary"
bin=${GRANARY_K8S_BIN:-}
if [[ -z "$bin" ]]; then
  bin=$("$src/scripts/k8s-tools" --no-build) || {
    echo "FAIL: helm is not built; run scripts/k8s-tools (it builds the Kubernetes test tools once)" >&2
    exit 1
  }
fi
helm="$bin/helm"
[[ -x "$helm" ]] || { echo "FAIL: no helm in $bin; run scripts/k8s-tools" >&2; exit 1; }
for tool in python3 redis-server redis-cli timeout openssl; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool not found; run scripts/install-deps" >&2; exit 1; }
done
python3 -c 'import yaml' || { echo "FAIL: python3 lacks PyYAML (python3-yaml); run scripts/install-deps" >&2; exit 1; }

work=$(mktemp -d)
redis_pid=""
etcd_pid=""
apiserver_pid=""
stop() {  # stop <pid>: the processes this script started, by their id
  if [[ -n "$1" ]]; then kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; fi
}
sentinel_pids=()
redis_pids=()
cleanup() {
  stop "$redis_pid"
  for pid in "${redis_pids[@]}" "${sentinel_pids[@]}"; do stop "$pid"; done
  stop "$apiserver_pid"
  stop "$etcd_pid"
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

kube=(--kube-version 1.37.2)
render() {  # render <out file> <helm args...>
  local out=$1; shift
  timeout 60 "$helm" template granary "$chart" --namespace granary "${kube[@]}" "$@" >"$out" 2>"$out.err"
}

# check <rendered file> <python expression over `docs` (list of objects) and `find`>
check() {
  python3 - "$1" "$2" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
def find(kind, name=None):
    return [d for d in docs if d.get("kind") == kind and (name is None or d["metadata"]["name"] == name)]
ok = eval("(" + sys.argv[2] + ")", {"docs": docs, "find": find, "yaml": yaml})
sys.exit(0 if ok else 1)
PY
}

expect() {  # expect <file> <description> <python expression>
  if check "$1" "$3"; then pass "$2"; else fail "$2"; fi
}

# ---- lint ----
if timeout 60 "$helm" lint --strict "$chart" "${kube[@]}" >"$work/lint" 2>&1; then
  pass "helm lint --strict"
else
  fail "helm lint --strict: $(cat "$work/lint")"
fi

# ---- default values, no monitoring API ----
if render "$work/default.yaml"; then
  f="$work/default.yaml"
  expect "$f" "no PodMonitor or PrometheusRule without monitoring.coreos.com/v1" \
    'not find("PodMonitor") and not find("PrometheusRule")'
  expect "$f" "no NetworkPolicy by default" 'not find("NetworkPolicy")'
  expect "$f" "Redis StatefulSet with a claim template of redis.persistence.size, kept on uninstall" \
    'len(find("StatefulSet", "granary-redis")) == 1 and
     find("StatefulSet", "granary-redis")[0]["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "8Gi" and
     find("StatefulSet", "granary-redis")[0]["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Retain" and
     find("StatefulSet", "granary-redis")[0]["spec"]["serviceName"] == "granary-redis-headless"'
  expect "$f" "Redis Services: granary-redis (ClusterIP) and granary-redis-headless" \
    'find("Service", "granary-redis")[0]["spec"]["ports"][0]["port"] == 6379 and
     find("Service", "granary-redis-headless")[0]["spec"]["clusterIP"] == "None"'
  expect "$f" "Redis runs its config from the Secret, as a non-root user, probes without the password in argv" \
    'all(c["command"] == ["redis-server", "/etc/redis/redis.conf"] and
         c["env"][0]["valueFrom"]["secretKeyRef"] == {"name": "granary-redis", "key": "password"} and
         c["securityContext"]["readOnlyRootFilesystem"]
         for c in find("StatefulSet", "granary-redis")[0]["spec"]["template"]["spec"]["containers"]) and
     find("StatefulSet", "granary-redis")[0]["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"]'
  # The Secrets: the password, redis.conf and the URL agree.
  python3 - "$f" "$work" <<'PY' && pass "store Secret url = redis://:<password>@granary-redis.granary.svc:6379/0, redis.conf requirepass the same password" || fail "store and redis Secrets disagree"
import base64, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
sec = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
pw = base64.b64decode(sec["granary-redis"]["data"]["password"]).decode()
conf = base64.b64decode(sec["granary-redis"]["data"]["redis.conf"]).decode()
url = base64.b64decode(sec["granary-store"]["data"]["url"]).decode()
assert len(pw) == 32 and pw.isalnum(), pw
assert url == f"redis://:{pw}@granary-redis.granary.svc:6379/0", url
assert f"\nrequirepass {pw}\n" in conf and "\nmaxmemory-policy noeviction\n" in conf
open(sys.argv[2] + "/redis.conf", "w").write(conf)
open(sys.argv[2] + "/password", "w").write(pw)
PY
else
  fail "helm template with default values: $(cat "$work/default.yaml.err")"
fi

# ---- the generated redis.conf on a real redis-server ----
if [[ -s "$work/redis.conf" ]]; then
  port=$(free_port)
  mkdir -p "$work/data"
  # The pod's paths and port replaced by this test's; everything else as rendered.
  sed -e "s|^dir /data$|dir $work/data|" -e "s|^port 6379$|port $port|" -e "s|^bind .*|bind 127.0.0.1|" \
    "$work/redis.conf" >"$work/redis-test.conf"
  redis-server "$work/redis-test.conf" >"$work/redis.log" 2>&1 &
  redis_pid=$!
  up=0
  for _ in $(seq 1 100); do
    if [[ "$(timeout 2 redis-cli -p "$port" ping 2>/dev/null)" == *NOAUTH* ]]; then up=1; break; fi
    sleep 0.1
  done
  if [[ $up == 1 ]]; then
    pass "redis-server starts with the rendered redis.conf and refuses a client without AUTH"
    if [[ "$(REDISCLI_AUTH=$(cat "$work/password") timeout 2 redis-cli -p "$port" ping)" == PONG ]]; then
      pass "the password of the Secret authenticates"
    else
      fail "the Secret's password does not authenticate"
    fi
    if [[ "$(REDISCLI_AUTH=wrong timeout 2 redis-cli -p "$port" ping 2>&1)" == *WRONGPASS* ]]; then
      pass "a wrong password is refused"
    else
      fail "a wrong password was not refused"
    fi
    policy=$(REDISCLI_AUTH=$(cat "$work/password") timeout 2 redis-cli -p "$port" config get maxmemory-policy | tail -1)
    [[ "$policy" == noeviction ]] && pass "maxmemory-policy noeviction" || fail "maxmemory-policy is $policy"
  else
    fail "redis-server did not start with the rendered redis.conf: $(cat "$work/redis.log")"
  fi
  stop "$redis_pid"
  redis_pid=""
fi

# ---- with the monitoring API ----
labels=(--set monitoring.labels.release=kube-prometheus-stack)
if render "$work/mon.yaml" --api-versions monitoring.coreos.com/v1 "${labels[@]}"; then
  f="$work/mon.yaml"
  expect "$f" "three PodMonitors (operator, cache nodes, sidecars) with the release label" \
    'sorted(d["metadata"]["name"] for d in find("PodMonitor")) == ["granary-cachenode", "granary-operator", "granary-sidecar"] and
     all(d["metadata"]["labels"]["release"] == "kube-prometheus-stack" for d in find("PodMonitor"))'
  expect "$f" "cache-node PodMonitor: label app.kubernetes.io/name=granary-cachenode, port metrics, job granary-cachenode" \
    'find("PodMonitor", "granary-cachenode")[0]["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "granary-cachenode" and
     find("PodMonitor", "granary-cachenode")[0]["spec"]["namespaceSelector"] == {"matchNames": ["granary"]} and
     find("PodMonitor", "granary-cachenode")[0]["spec"]["podMetricsEndpoints"][0]["port"] == "metrics" and
     {"targetLabel": "job", "replacement": "granary-cachenode"} in find("PodMonitor", "granary-cachenode")[0]["spec"]["podMetricsEndpoints"][0]["relabelings"]'
  expect "$f" "sidecar PodMonitor: every namespace, pods with granary.io/dataset, port granary-metrics, job granary-sidecar" \
    'find("PodMonitor", "granary-sidecar")[0]["spec"]["namespaceSelector"] == {"any": True} and
     find("PodMonitor", "granary-sidecar")[0]["spec"]["selector"]["matchExpressions"] == [{"key": "granary.io/dataset", "operator": "Exists"}] and
     find("PodMonitor", "granary-sidecar")[0]["spec"]["podMetricsEndpoints"][0]["port"] == "granary-metrics" and
     {"targetLabel": "job", "replacement": "granary-sidecar"} in find("PodMonitor", "granary-sidecar")[0]["spec"]["podMetricsEndpoints"][0]["relabelings"]'
  expect "$f" "operator PodMonitor selects the operator Deployment's pods on port metrics" \
    'find("PodMonitor", "granary-operator")[0]["spec"]["selector"]["matchLabels"] ==
       find("Deployment", "granary-operator")[0]["spec"]["selector"]["matchLabels"] and
     any(p["name"] == "metrics" for p in find("Deployment", "granary-operator")[0]["spec"]["template"]["spec"]["containers"][0]["ports"])'
  expect "$f" "PrometheusRule spec is files/alerts.yaml, with the release label" \
    "len(find(\"PrometheusRule\")) == 1 and
     find(\"PrometheusRule\")[0][\"spec\"] == yaml.safe_load(open(\"$chart/files/alerts.yaml\")) and
     find(\"PrometheusRule\")[0][\"metadata\"][\"labels\"][\"release\"] == \"kube-prometheus-stack\" and
     len(find(\"PrometheusRule\")[0][\"spec\"][\"groups\"][0][\"rules\"]) >= 7"
else
  fail "helm template --api-versions monitoring.coreos.com/v1: $(cat "$work/mon.yaml.err")"
fi
if render "$work/mon-off.yaml" --api-versions monitoring.coreos.com/v1 --set monitoring.enabled=false; then
  expect "$work/mon-off.yaml" "monitoring.enabled=false: no monitors, no rule, even with the API" \
    'not find("PodMonitor") and not find("PrometheusRule")'
else
  fail "helm template monitoring.enabled=false: $(cat "$work/mon-off.yaml.err")"
fi
if render "$work/mon-ns.yaml" --api-versions monitoring.coreos.com/v1 --set monitoring.namespace=monitoring \
     --set monitoring.sidecars=false --set monitoring.prometheusRule.enabled=false; then
  expect "$work/mon-ns.yaml" "monitoring.namespace moves the monitors; sidecars and the rule can be left out" \
    'sorted(d["metadata"]["name"] for d in find("PodMonitor")) == ["granary-cachenode", "granary-operator"] and
     all(d["metadata"]["namespace"] == "monitoring" for d in find("PodMonitor")) and
     find("PodMonitor", "granary-cachenode")[0]["spec"]["namespaceSelector"] == {"matchNames": ["granary"]} and
     not find("PrometheusRule")'
else
  fail "helm template monitoring.namespace: $(cat "$work/mon-ns.yaml.err")"
fi

# ---- an external store ----
if render "$work/ext.yaml" --set redis.enabled=false --set store.existingSecret=my-store; then
  expect "$work/ext.yaml" "redis.enabled=false: no Redis objects and no store Secret" \
    'not find("StatefulSet") and not [d for d in find("Secret") if d["metadata"]["name"] in ("granary-redis", "granary-store")] and
     not find("Service", "granary-redis")'
else
  fail "helm template redis.enabled=false: $(cat "$work/ext.yaml.err")"
fi
if render "$work/bad.yaml" --set store.existingSecret=my-store; then
  fail "redis.enabled with store.existingSecret rendered"
elif grep -q 'redis.enabled is true and store.existingSecret is "my-store"' "$work/bad.yaml.err"; then
  pass "redis.enabled with store.existingSecret is refused, naming both"
else
  fail "redis.enabled with store.existingSecret: unexpected error $(cat "$work/bad.yaml.err")"
fi
if render "$work/nopersist.yaml" --set redis.persistence.enabled=false; then
  expect "$work/nopersist.yaml" "redis.persistence.enabled=false: an emptyDir, no claim template" \
    '"volumeClaimTemplates" not in find("StatefulSet", "granary-redis")[0]["spec"] and
     any(v["name"] == "data" and "emptyDir" in v for v in find("StatefulSet", "granary-redis")[0]["spec"]["template"]["spec"]["volumes"])'
else
  fail "helm template redis.persistence.enabled=false: $(cat "$work/nopersist.yaml.err")"
fi

# ---- schema ----
for bad in "monitoring.interval=5x:interval" "networkPolicy.nodeCIDRs={10.0.0.0}:nodeCIDRs" \
           "redis.persistence.size=lots:size" "monitoring.scrape=1:scrape" "redis.maxmemory=1tb:maxmemory"; do
  value=${bad%:*}; field=${bad##*:}
  if render "$work/schema.yaml" --set "$value"; then
    fail "schema accepted $value"
  elif grep -q "$field" "$work/schema.yaml.err"; then
    pass "schema refuses $value, naming $field"
  else
    fail "schema refused $value without naming $field: $(cat "$work/schema.yaml.err")"
  fi
done

# ---- network policies ----
if render "$work/np-bad.yaml" --set networkPolicy.enabled=true; then
  fail "networkPolicy.enabled without nodeCIDRs rendered with the chart's Redis"
elif grep -q 'networkPolicy.nodeCIDRs' "$work/np-bad.yaml.err"; then
  pass "networkPolicy.enabled with the chart's Redis needs networkPolicy.nodeCIDRs"
else
  fail "networkPolicy.enabled without nodeCIDRs: unexpected error $(cat "$work/np-bad.yaml.err")"
fi
np=(--set networkPolicy.enabled=true --set 'networkPolicy.nodeCIDRs={10.0.0.0/16}'
    --set 'networkPolicy.apiServerCIDRs={192.0.2.10/32}'
    --set 'cachePools[0].name=nvme' --set 'cachePools[0].spec.storage.hostPath=/mnt/nvme'
    --set 'cachePools[0].spec.storage.capacity=1Ti')
if render "$work/np.yaml" "${np[@]}"; then
  f="$work/np.yaml"
  expect "$f" "three NetworkPolicies: Redis, the operator, pool nvme's cache nodes" \
    'sorted(d["metadata"]["name"] for d in find("NetworkPolicy")) == ["granary-cachenode-nvme", "granary-operator", "granary-redis"]'
  expect "$f" "Redis: port redis from the operator, cache nodes, sidecar pods of any namespace, the node CIDRs only" \
    'find("NetworkPolicy", "granary-redis")[0]["spec"]["podSelector"]["matchLabels"] ==
       find("StatefulSet", "granary-redis")[0]["spec"]["selector"]["matchLabels"] and
     find("NetworkPolicy", "granary-redis")[0]["spec"]["ingress"][0]["ports"] == [{"port": "redis", "protocol": "TCP"}] and
     find("NetworkPolicy", "granary-redis")[0]["spec"]["ingress"][0]["from"] == [
       {"podSelector": {"matchLabels": find("Deployment", "granary-operator")[0]["spec"]["selector"]["matchLabels"]}},
       {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "granary-cachenode"}}},
       {"namespaceSelector": {}, "podSelector": {"matchExpressions": [{"key": "granary.io/dataset", "operator": "Exists"}]}},
       {"ipBlock": {"cidr": "10.0.0.0/16"}}] and
     len(find("NetworkPolicy", "granary-redis")[0]["spec"]["ingress"]) == 1'
  expect "$f" "operator: webhook from the API server CIDRs, metrics from the monitoring namespace" \
    'find("NetworkPolicy", "granary-operator")[0]["spec"]["ingress"] == [
       {"ports": [{"port": "webhook", "protocol": "TCP"}], "from": [{"ipBlock": {"cidr": "192.0.2.10/32"}}]},
       {"ports": [{"port": "metrics", "protocol": "TCP"}],
        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]}]'
  expect "$f" "cache nodes of pool nvme: data from the pool, sidecar pods and the operator; metrics from monitoring" \
    'find("NetworkPolicy", "granary-cachenode-nvme")[0]["spec"]["podSelector"]["matchLabels"] ==
       {"app.kubernetes.io/name": "granary-cachenode", "granary.io/pool": "nvme"} and
     [r["ports"][0]["port"] for r in find("NetworkPolicy", "granary-cachenode-nvme")[0]["spec"]["ingress"]] == ["data", "metrics"] and
     find("NetworkPolicy", "granary-cachenode-nvme")[0]["spec"]["ingress"][0]["from"][0] ==
       {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "granary-cachenode", "granary.io/pool": "nvme"}}}'
else
  fail "helm template with network policies: $(cat "$work/np.yaml.err")"
fi

# ---- Redis with Sentinel ----
sent=(--set redis.sentinel.enabled=true --set redis.replicas=2 --set redis.sentinel.downAfterMilliseconds=1000
      --set redis.sentinel.failoverTimeoutMilliseconds=5000 --set redis.sentinel.storeRetryMilliseconds=8000)
if render "$work/sent.yaml" "${sent[@]}"; then
  f="$work/sent.yaml"
  expect "$f" "sentinel: Redis StatefulSet of redis.replicas pods, Parallel, started by redis-start.sh, claims kept" \
    'find("StatefulSet", "granary-redis")[0]["spec"]["replicas"] == 2 and
     find("StatefulSet", "granary-redis")[0]["spec"]["podManagementPolicy"] == "Parallel" and
     find("StatefulSet", "granary-redis")[0]["spec"]["serviceName"] == "granary-redis-headless" and
     find("StatefulSet", "granary-redis")[0]["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data" and
     find("StatefulSet", "granary-redis")[0]["spec"]["template"]["spec"]["containers"][0]["command"] == ["sh", "/scripts/redis-start.sh"]'
  expect "$f" "sentinel: Redis pods announce their stable name, fall back to pod 0, ask the three sentinels" \
    '{e["name"]: e.get("value") for e in find("StatefulSet", "granary-redis")[0]["spec"]["template"]["spec"]["containers"][0]["env"]}.items() >= {
       "SELF_HOST": "$(POD_NAME).granary-redis-headless.granary.svc",
       "FIRST_PRIMARY": "granary-redis-0.granary-redis-headless.granary.svc:6379",
       "SENTINELS": " ".join(f"granary-sentinel-{i}.granary-sentinel-headless.granary.svc:26379" for i in range(3)),
       "MASTER_NAME": "granary"}.items()'
  expect "$f" "sentinel: 3 sentinels in a StatefulSet on port 26379 with its headless Service, the password mounted as a file" \
    'find("StatefulSet", "granary-sentinel")[0]["spec"]["replicas"] == 3 and
     find("StatefulSet", "granary-sentinel")[0]["spec"]["serviceName"] == "granary-sentinel-headless" and
     find("Service", "granary-sentinel-headless")[0]["spec"]["clusterIP"] == "None" and
     find("Service", "granary-sentinel-headless")[0]["spec"]["ports"][0]["port"] == 26379 and
     find("StatefulSet", "granary-sentinel")[0]["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] == 26379 and
     {"name": "password", "secret": {"secretName": "granary-redis", "defaultMode": 0o440, "items": [{"key": "password", "path": "password"}]}}
       in find("StatefulSet", "granary-sentinel")[0]["spec"]["template"]["spec"]["volumes"] and
     {"name": "password", "mountPath": "/etc/redis", "readOnly": True}
       in find("StatefulSet", "granary-sentinel")[0]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] and
     {"name": "PASSWORD_FILE", "value": "/etc/redis/password"}
       in find("StatefulSet", "granary-sentinel")[0]["spec"]["template"]["spec"]["containers"][0]["env"]'
  expect "$f" "sentinel: no ClusterIP Service for Redis (it would reach replicas too); PDBs for Redis and the sentinels" \
    'not find("Service", "granary-redis") and find("Service", "granary-redis-headless") and
     sorted(d["metadata"]["name"] for d in find("PodDisruptionBudget")) == ["granary-operator", "granary-redis", "granary-sentinel"]'
  expect "$f" "sentinel: the scripts ConfigMap holds files/redis-start.sh and files/sentinel-start.sh as they are" \
    "find(\"ConfigMap\", \"granary-redis-scripts\")[0][\"data\"] == {
       \"redis-start.sh\": open(\"$chart/files/redis-start.sh\").read(),
       \"sentinel-start.sh\": open(\"$chart/files/sentinel-start.sh\").read()}"
  python3 - "$f" "$work" <<'PY' && pass "sentinel: store url = redis+sentinel://:<password>@<3 sentinel pods>/granary/0?retry_ms=8000; redis.conf has requirepass and masterauth" || fail "sentinel: the store URL or redis.conf is wrong"
import base64, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
sec = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
pw = base64.b64decode(sec["granary-redis"]["data"]["password"]).decode()
conf = base64.b64decode(sec["granary-redis"]["data"]["redis.conf"]).decode()
url = base64.b64decode(sec["granary-store"]["data"]["url"]).decode()
sentinels = ",".join(f"granary-sentinel-{i}.granary-sentinel-headless.granary.svc:26379" for i in range(3))
assert url == f"redis+sentinel://:{pw}@{sentinels}/granary/0?retry_ms=8000", url
assert f"\nrequirepass {pw}\n" in conf and conf.endswith(f"\nmasterauth {pw}"), conf
cm = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "granary-redis-scripts"][0]
for name, text in cm["data"].items():
    open(sys.argv[2] + "/" + name, "w").write(text)
open(sys.argv[2] + "/sent-redis.conf", "w").write(conf)
open(sys.argv[2] + "/sent-password", "w").write(pw + "\n")
env = {e["name"]: e.get("value") for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "granary-sentinel"
       for e in d["spec"]["template"]["spec"]["containers"][0]["env"]}
open(sys.argv[2] + "/sent-env", "w").write(
    f'QUORUM={env["QUORUM"]} DOWN_AFTER_MS={env["DOWN_AFTER_MS"]} FAILOVER_TIMEOUT_MS={env["FAILOVER_TIMEOUT_MS"]} PARALLEL_SYNCS={env["PARALLEL_SYNCS"]}\n')
PY
else
  fail "helm template with redis.sentinel.enabled: $(cat "$work/sent.yaml.err")"
fi
if render "$work/sent5.yaml" --set redis.sentinel.enabled=true --set redis.replicas=3 --set redis.sentinel.replicas=5 \
     --set redis.sentinel.quorum=3 --set redis.sentinel.masterName=store-a --set redis.persistence.size=2Gi; then
  expect "$work/sent5.yaml" "sentinel: 5 sentinels, 3 data servers, quorum 3 and the master name reach the pods and the URL" \
    'find("StatefulSet", "granary-sentinel")[0]["spec"]["replicas"] == 5 and
     find("StatefulSet", "granary-redis")[0]["spec"]["replicas"] == 3 and
     {"name": "QUORUM", "value": "3"} in find("StatefulSet", "granary-sentinel")[0]["spec"]["template"]["spec"]["containers"][0]["env"] and
     {"name": "MASTER_NAME", "value": "store-a"} in find("StatefulSet", "granary-redis")[0]["spec"]["template"]["spec"]["containers"][0]["env"] and
     __import__("base64").b64decode(find("Secret", "granary-store")[0]["data"]["url"]).decode().split("@")[1] ==
       ",".join(f"granary-sentinel-{i}.granary-sentinel-headless.granary.svc:26379" for i in range(5)) + "/store-a/0?retry_ms=20000"'
else
  fail "helm template with 5 sentinels: $(cat "$work/sent5.yaml.err")"
fi
# Refused, naming the field and what to do.
refused() {  # refused <description> <expected text> <helm --set args...>
  local what=$1 want=$2; shift 2
  if render "$work/refused.yaml" "$@"; then
    fail "$what was accepted"
  elif grep -qF -- "$want" "$work/refused.yaml.err"; then
    pass "$what is refused: $want"
  else
    fail "$what: unexpected error $(cat "$work/refused.yaml.err")"
  fi
}
on=(--set redis.sentinel.enabled=true)
refused "sentinel with redis.replicas=1" "redis.replicas is 1 with redis.sentinel.enabled" "${on[@]}"
refused "redis.replicas=3 without sentinel" "redis.replicas is 3 without redis.sentinel.enabled" --set redis.replicas=3
refused "an even number of sentinels" "at '/redis/sentinel/replicas': value must be one of 3, 5, 7" "${on[@]}" --set redis.replicas=2 --set redis.sentinel.replicas=4
refused "a quorum above the sentinels" "redis.sentinel.quorum is 4 but redis.sentinel.replicas is 3" "${on[@]}" --set redis.replicas=2 --set redis.sentinel.quorum=4
refused "a quorum of 0" "at '/redis/sentinel/quorum'" "${on[@]}" --set redis.replicas=2 --set redis.sentinel.quorum=0
refused "a master name with a slash" "at '/redis/sentinel/masterName'" "${on[@]}" --set redis.replicas=2 --set redis.sentinel.masterName=a/b
refused "sentinel without persistence" "redis.sentinel.enabled with redis.persistence.enabled=false" "${on[@]}" --set redis.replicas=2 --set redis.persistence.enabled=false
refused "a store retry budget not above down-after" "redis.sentinel.storeRetryMilliseconds (3000) is not above redis.sentinel.downAfterMilliseconds (5000)" \
  "${on[@]}" --set redis.replicas=2 --set redis.sentinel.storeRetryMilliseconds=3000
if render "$work/sent-np.yaml" "${sent[@]}" --set networkPolicy.enabled=true --set 'networkPolicy.nodeCIDRs={10.0.0.0/16}'; then
  expect "$work/sent-np.yaml" "sentinel: port 26379 from Redis' peers and the sentinels and data servers; Redis also from both" \
    'find("NetworkPolicy", "granary-sentinel")[0]["spec"]["podSelector"]["matchLabels"] ==
       find("StatefulSet", "granary-sentinel")[0]["spec"]["selector"]["matchLabels"] and
     find("NetworkPolicy", "granary-sentinel")[0]["spec"]["ingress"][0]["ports"] == [{"port": "sentinel", "protocol": "TCP"}] and
     find("NetworkPolicy", "granary-sentinel")[0]["spec"]["ingress"][0]["from"] ==
       find("NetworkPolicy", "granary-redis")[0]["spec"]["ingress"][0]["from"][:4] +
       [{"podSelector": {"matchLabels": find("StatefulSet", "granary-sentinel")[0]["spec"]["selector"]["matchLabels"]}},
        {"podSelector": {"matchLabels": find("StatefulSet", "granary-redis")[0]["spec"]["selector"]["matchLabels"]}}] and
     find("NetworkPolicy", "granary-redis")[0]["spec"]["ingress"][0]["from"][4:] ==
       [{"podSelector": {"matchLabels": find("StatefulSet", "granary-redis")[0]["spec"]["selector"]["matchLabels"]}},
        {"podSelector": {"matchLabels": find("StatefulSet", "granary-sentinel")[0]["spec"]["selector"]["matchLabels"]}}]'
else
  fail "helm template sentinel with network policies: $(cat "$work/sent-np.yaml.err")"
fi

# ---- the rendered Sentinel set run on loopback ----
# The chart's start scripts and redis.conf as rendered, with this host's addresses and
# free ports in place of the pods' names: two data servers and three sentinels. The
# first server starts as the primary (no sentinel answers yet), the second as its
# replica; killing the primary has the sentinels promote the replica; the old primary,
# started again by its script, asks the sentinels and comes back as a replica.
sentinel_pids=()
if [[ -s "$work/redis-start.sh" && -s "$work/sentinel-start.sh" ]]; then
  pw=$(head -n 1 "$work/sent-password")
  rp=("$(free_port)" "$(free_port)"); sp=("$(free_port)" "$(free_port)" "$(free_port)")
  sentinels="127.0.0.1:${sp[0]} 127.0.0.1:${sp[1]} 127.0.0.1:${sp[2]}"
  start_redis() {  # start_redis <index>: the chart's redis-start.sh for data server <index>
    local i=$1
    mkdir -p "$work/r$i/data" "$work/r$i/run"
    sed -e "s|^dir /data$|dir $work/r$i/data|" -e "s|^bind .*|bind 127.0.0.1|" "$work/sent-redis.conf" >"$work/r$i/base.conf"
    env REDISCLI_AUTH="$pw" BASE_CONF="$work/r$i/base.conf" RUN_DIR="$work/r$i/run" REDIS_PORT="${rp[$i]}" \
      SELF_HOST=127.0.0.1 FIRST_PRIMARY="127.0.0.1:${rp[0]}" SENTINELS="$sentinels" MASTER_NAME=granary \
      sh "$work/redis-start.sh" >"$work/r$i/log" 2>&1 &
    redis_pids[$i]=$!
  }
  role() { REDISCLI_AUTH="$pw" timeout 2 redis-cli -p "$1" role 2>/dev/null | head -1; }
  primary_of() { timeout 2 redis-cli -p "$1" sentinel get-master-addr-by-name granary 2>/dev/null | sed -n 2p; }
  wait_until() {  # wait_until <seconds> <command...>
    local deadline=$((SECONDS + $1)); shift
    until "$@"; do [[ $SECONDS -ge $deadline ]] && return 1; sleep 0.2; done
  }
  redis_pids=()
  start_redis 0
  start_redis 1
  read -r sentinel_env <"$work/sent-env"
  for i in 0 1 2; do
    mkdir -p "$work/s$i"
    # shellcheck disable=SC2086
    env $sentinel_env RUN_DIR="$work/s$i" SENTINEL_PORT="${sp[$i]}" SENTINEL_BIND=127.0.0.1 SELF_HOST=127.0.0.1 \
      SENTINELS="$sentinels" FIRST_PRIMARY="127.0.0.1:${rp[0]}" MASTER_NAME=granary \
      PASSWORD_FILE="$work/sent-password" RESOLVE_WAIT_SECONDS=10 \
      sh "$work/sentinel-start.sh" >"$work/s$i/log" 2>&1 &
    sentinel_pids+=($!)
  done
  synced() { REDISCLI_AUTH="$pw" timeout 2 redis-cli -p "${rp[1]}" info replication 2>/dev/null | grep -q 'master_link_status:up'; }
  knows_all() {
    local i
    for i in 0 1 2; do
      timeout 2 redis-cli -p "${sp[$i]}" sentinel master granary 2>/dev/null |
        awk 'p=="num-slaves"{s=$0} p=="num-other-sentinels"{o=$0} {p=$0} END{exit !(s==1 && o==2)}' || return 1
    done
  }
  if wait_until 30 synced && wait_until 30 knows_all; then
    [[ "$(role "${rp[0]}")" == master && "$(role "${rp[1]}")" == slave ]] &&
      grep -q "the first server, 127.0.0.1:${rp[0]}, is" "$work/r0/log" &&
      pass "sentinel set: the first server started as the primary, the second as its replica; every sentinel knows both and the others" ||
      fail "sentinel set: roles $(role "${rp[0]}")/$(role "${rp[1]}"); $(cat "$work/r0/log")"
    REDISCLI_AUTH="$pw" timeout 2 redis-cli -p "${rp[0]}" set granary:failover kept >/dev/null
    REDISCLI_AUTH="$pw" timeout 5 redis-cli -p "${rp[0]}" wait 1 3000 >/dev/null
    stop "${redis_pids[0]}"
    t0=$SECONDS
    if wait_until 30 eval '[[ "$(primary_of "${sp[0]}")" == "${rp[1]}" && "$(role "${rp[1]}")" == master ]]'; then
      pass "sentinel set: the primary killed, the sentinels promoted the replica in $((SECONDS - t0)) s (down-after 1 s)"
      [[ "$(REDISCLI_AUTH="$pw" timeout 2 redis-cli -p "${rp[1]}" get granary:failover)" == kept ]] &&
        pass "sentinel set: the replicated key is on the new primary" || fail "sentinel set: the key was lost"
      start_redis 0
      if wait_until 30 eval '[[ "$(role "${rp[0]}")" == slave ]]' &&
         grep -q "names 127.0.0.1:${rp[1]} as the primary" "$work/r0/log" &&
         grep -q "as a replica of 127.0.0.1:${rp[1]}" "$work/r0/log"; then
        pass "sentinel set: the old primary, restarted by redis-start.sh, asked the sentinels and came back as a replica of the new one"
      else
        fail "sentinel set: the restarted old primary is $(role "${rp[0]}"): $(cat "$work/r0/log")"
      fi
    else
      fail "sentinel set: no failover within 30 s: $(tail -5 "$work/s0/s"*.log 2>/dev/null; cat "$work/s0/log")"
    fi
  else
    fail "sentinel set: the replica did not sync or the sentinels did not find each other in 30 s:
$(cat "$work/r0/log" "$work/r1/log" "$work/s0/log")"
  fi
  for pid in "${redis_pids[@]}" "${sentinel_pids[@]}"; do stop "$pid"; done
  sentinel_pids=()
fi

# ---- on a real API server: server-side validation, and the password across an upgrade ----
start_apiserver() {
  local pki="$work/pki" etcd_port etcd_peer
  mkdir -p "$pki" "$work/etcd"
  (
    cd "$pki"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1 -subj /CN=granary-test-ca
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj /CN=kube-apiserver
    printf 'subjectAltName=IP:127.0.0.1\n' >san.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days 1 -extfile san.ext
    openssl req -newkey rsa:2048 -nodes -keyout admin.key -out admin.csr -subj "/O=system:masters/CN=admin"
    openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out admin.crt -days 1
    openssl genrsa -out sa.key 2048
    openssl rsa -in sa.key -pubout -out sa.pub
  ) >"$work/pki.log" 2>&1 || { fail "making test certificates: $(cat "$work/pki.log")"; return 1; }
  etcd_port=$(free_port); etcd_peer=$(free_port); api_port=$(free_port)
  "$bin/etcd" --name=t --data-dir="$work/etcd" --unsafe-no-fsync --log-level=warn \
    --listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port" \
    --listen-peer-urls="http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls="http://127.0.0.1:$etcd_peer" \
    --initial-cluster="t=http://127.0.0.1:$etcd_peer" >"$work/etcd.log" 2>&1 &
  etcd_pid=$!
  "$bin/kube-apiserver" --etcd-servers="http://127.0.0.1:$etcd_port" --bind-address=127.0.0.1 \
    --advertise-address=127.0.0.1 --secure-port="$api_port" --cert-dir="$pki" \
    --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
    --client-ca-file="$pki/ca.crt" --service-account-key-file="$pki/sa.pub" \
    --service-account-signing-key-file="$pki/sa.key" --service-account-issuer=https://kubernetes.default.svc \
    --authorization-mode=RBAC --service-cluster-ip-range=10.96.0.0/16 --endpoint-reconciler-type=none \
    --profiling=false >"$work/apiserver.log" 2>&1 &
  apiserver_pid=$!
  cat >"$work/kubeconfig" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters: [{name: t, cluster: {server: "https://127.0.0.1:$api_port", certificate-authority: "$pki/ca.crt"}}]
users: [{name: admin, user: {client-certificate: "$pki/admin.crt", client-key: "$pki/admin.key"}}]
contexts: [{name: t, context: {cluster: t, user: admin}}]
current-context: t
KUBECONFIG
  for _ in $(seq 1 120); do
    if "$bin/kubectl" --kubeconfig "$work/kubeconfig" get --raw /readyz >/dev/null 2>&1; then return 0; fi
    kill -0 "$apiserver_pid" 2>/dev/null || break
    sleep 0.5
  done
  fail "kube-apiserver did not become ready: $(tail -20 "$work/apiserver.log")"
  return 1
}

if start_apiserver; then
  kubectl=("$bin/kubectl" --kubeconfig "$work/kubeconfig")
  khelm=(timeout 120 "$helm" --kubeconfig "$work/kubeconfig")
  "${kubectl[@]}" create namespace granary >/dev/null
  if "${kubectl[@]}" apply --server-side -f "$chart/crds/" >"$work/crds.log" 2>&1; then
    all=("${np[@]}" --set 'networkPolicy.redisExtraFrom[0].ipBlock.cidr=198.51.100.0/24'
         --set-string 'cachePools[0].spec.nodeSelector.granary\.io/nvme=true'
         --set 'cachePools[0].spec.sourceMounts[0].name=datasets'
         --set 'cachePools[0].spec.sourceMounts[0].hostPath=/datasets')
    if render "$work/all.yaml" "${all[@]}"; then
      if "${kubectl[@]}" apply --dry-run=server --validate=strict -f "$work/all.yaml" >"$work/dry.log" 2>&1; then
        pass "kubectl apply --dry-run=server --validate=strict accepts every object (Redis, network policies, pool)"
      else
        fail "the API server refuses the rendering: $(cat "$work/dry.log")"
      fi
    else
      fail "helm template of every feature: $(cat "$work/all.yaml.err")"
    fi
    if [[ -s "$work/sent-np.yaml" ]]; then
      if "${kubectl[@]}" apply --dry-run=server --validate=strict -f "$work/sent-np.yaml" >"$work/dry-sent.log" 2>&1; then
        pass "kubectl apply --dry-run=server --validate=strict accepts the Sentinel rendering (StatefulSets, Services, PDBs, policies)"
      else
        fail "the API server refuses the Sentinel rendering: $(cat "$work/dry-sent.log")"
      fi
    fi
  else
    fail "installing the CRDs: $(cat "$work/crds.log")"
  fi
  secret() { "${kubectl[@]}" -n granary get secret "$1" -o jsonpath="{.data.$2}"; }
  if "${khelm[@]}" install granary "$chart" -n granary >"$work/install.log" 2>&1; then
    password=$(secret granary-redis password); url=$(secret granary-store url)
    if "${khelm[@]}" upgrade granary "$chart" -n granary --set redis.maxmemory=512mb >"$work/upgrade.log" 2>&1; then
      if [[ -n "$password" && "$(secret granary-redis password)" == "$password" && "$(secret granary-store url)" == "$url" ]]; then
        pass "helm upgrade keeps the generated Redis password and the store URL"
      else
        fail "helm upgrade changed the Redis password or the store URL"
      fi
      if secret granary-redis 'redis\.conf' | base64 -d | grep -qx 'maxmemory 512mb'; then
        pass "helm upgrade carries the new maxmemory into redis.conf"
      else
        fail "redis.conf after the upgrade lacks maxmemory 512mb"
      fi
      # docs/install.md, "Redis with Sentinel": switching needs the StatefulSet
      # deleted without its pods first (podManagementPolicy cannot be updated).
      to_sentinel=(--reuse-values --set redis.sentinel.enabled=true --set redis.replicas=3)
      if "${khelm[@]}" upgrade granary "$chart" -n granary "${to_sentinel[@]}" >"$work/up-sent.log" 2>&1; then
        fail "helm upgrade to Sentinel went through without deleting the StatefulSet; docs/install.md says it does not"
      elif grep -q "podManagementPolicy\|Forbidden: updates to statefulset spec" "$work/up-sent.log"; then
        pass "helm upgrade to Sentinel is refused while the single-Redis StatefulSet exists (as docs/install.md says)"
      else
        fail "helm upgrade to Sentinel failed otherwise: $(cat "$work/up-sent.log")"
      fi
      # This API server has no garbage collector to finish an orphaning delete (it
      # would drop the finalizer once the pods are released; there are no pods
      # here): the test drops it in its place.
      timeout 30 "${kubectl[@]}" -n granary delete statefulset granary-redis --cascade=orphan --wait=false >/dev/null 2>&1 || true
      timeout 30 "${kubectl[@]}" -n granary patch statefulset granary-redis --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
      if "${khelm[@]}" upgrade granary "$chart" -n granary "${to_sentinel[@]}" >"$work/up-sent2.log" 2>&1 &&
         [[ "$(secret granary-redis password)" == "$password" ]] &&
         [[ "$(secret granary-store url | base64 -d)" == "redis+sentinel://:$(printf %s "$password" | base64 -d)@granary-sentinel-0."* ]] &&
         "${kubectl[@]}" -n granary get statefulset granary-sentinel >/dev/null 2>&1; then
        pass "after kubectl delete statefulset --cascade=orphan, helm upgrade switches to Sentinel keeping the password"
      else
        fail "switching to Sentinel as docs/install.md says: $(cat "$work/up-sent2.log")"
      fi
    else
      fail "helm upgrade: $(cat "$work/upgrade.log")"
    fi
  else
    fail "helm install: $(cat "$work/install.log")"
  fi
fi

if [[ $failures -gt 0 ]]; then
  echo "chart_render_test: $failures check(s) failed" >&2
  exit 1
fi
echo "chart_render_test: all checks passed"
