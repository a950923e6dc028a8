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
cleanup() {
  stop "$redis_pid"
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
