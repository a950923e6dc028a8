{{/*
Names and labels shared by every template of the chart (operator, webhook, RBAC, store,
network policies, monitors, dashboards). Keep these stable: other templates and the
objects the operator makes refer to the names they produce.
*/}}

{{/* The chart's name, overridable with nameOverride. */}}
{{- define "granary.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's base name for objects: fullnameOverride, else the release name when it
already contains the chart name, else <release>-<chart>. 63 characters at most (DNS label).
*/}}
{{- define "granary.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The namespace every namespaced object of the release goes to. */}}
{{- define "granary.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* chart label: <name>-<version>. */}}
{{- define "granary.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The labels that select a release's objects (never change them across upgrades). */}}
{{- define "granary.selectorLabels" -}}
app.kubernetes.io/name: {{ include "granary.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels every object of the chart carries; add a component label next to them. */}}
{{- define "granary.labels" -}}
helm.sh/chart: {{ include "granary.chart" . }}
{{ include "granary.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: granary
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The Granary image: <repository>:<tag> (tag defaults to the chart's appVersion). */}}
{{- define "granary.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The operator's names. */}}
{{- define "granary.operator.fullname" -}}
{{- printf "%s-operator" (include "granary.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "granary.operator.selectorLabels" -}}
{{ include "granary.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "granary.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "granary.operator.fullname" .) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The webhook Service the operator registers in its MutatingWebhookConfiguration. */}}
{{- define "granary.webhook.serviceName" -}}
{{- printf "%s-webhook" (include "granary.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The metadata store's Secret and key CachePools reference (spec.metadataStore.secretRef):
store.existingSecret when set, else the Secret the chart's Redis makes
(<fullname>-store, key url). The chart's Redis also makes <fullname>-redis (AUTH).
*/}}
{{- define "granary.store.secretName" -}}
{{- if .Values.store.existingSecret }}
{{- .Values.store.existingSecret }}
{{- else }}
{{- printf "%s-store" (include "granary.fullname" .) }}
{{- end }}
{{- end }}

{{- define "granary.store.secretKey" -}}
{{- if .Values.store.existingSecret }}
{{- default "url" .Values.store.existingSecretKey }}
{{- else }}
{{- "url" }}
{{- end }}
{{- end }}

{{- define "granary.redis.secretName" -}}
{{- printf "%s-redis" (include "granary.fullname" .) }}
{{- end }}

{{/*
Redis with Sentinel (redis.sentinel.enabled): the names of the data servers and the
sentinels. Each is a StatefulSet with a headless Service, so every pod has a stable
name <pod>.<headless>.<namespace>.svc that Redis announces and the sentinels resolve.
*/}}
{{- define "granary.sentinel.fullname" -}}
{{- printf "%s-sentinel" (include "granary.fullname" .) }}
{{- end }}

{{- define "granary.sentinel.headless" -}}
{{- printf "%s-sentinel-headless" (include "granary.fullname" .) }}
{{- end }}

{{- define "granary.redis.headless" -}}
{{- printf "%s-redis-headless" (include "granary.fullname" .) }}
{{- end }}

{{/* host:26379 of every sentinel pod, comma-separated (the store URL's authority). */}}
{{- define "granary.sentinel.addresses" -}}
{{- $out := list }}
{{- $ns := include "granary.namespace" . }}
{{- range $i := until (int .Values.redis.sentinel.replicas) }}
{{- $out = append $out (printf "%s-%d.%s.%s.svc:26379" (include "granary.sentinel.fullname" $) $i (include "granary.sentinel.headless" $) $ns) }}
{{- end }}
{{- join "," $out }}
{{- end }}

{{/*
Checks across redis values that the schema cannot express; renders nothing.
*/}}
{{- define "granary.redis.validate" -}}
{{- $r := .Values.redis }}
{{- if $r.sentinel.enabled }}
{{- if lt (int $r.replicas) 2 }}
{{- fail (printf "redis.replicas is %d with redis.sentinel.enabled: a failover needs a replica to promote; set redis.replicas to 2 or more" (int $r.replicas)) }}
{{- end }}
{{- if gt (int $r.sentinel.quorum) (int $r.sentinel.replicas) }}
{{- fail (printf "redis.sentinel.quorum is %d but redis.sentinel.replicas is %d: no failover could ever be agreed; set the quorum to at most the number of sentinels (a majority, %d, is usual)" (int $r.sentinel.quorum) (int $r.sentinel.replicas) (add1 (div (int $r.sentinel.replicas) 2))) }}
{{- end }}
{{- if not $r.persistence.enabled }}
{{- fail "redis.sentinel.enabled with redis.persistence.enabled=false: a primary restarted with an empty data directory before the sentinels count it down would have its replicas copy the empty store; keep redis.persistence.enabled=true with Sentinel" }}
{{- end }}
{{- if le (int $r.sentinel.storeRetryMilliseconds) (int $r.sentinel.downAfterMilliseconds) }}
{{- fail (printf "redis.sentinel.storeRetryMilliseconds (%d) is not above redis.sentinel.downAfterMilliseconds (%d): Granary's clients would give up before the sentinels even count the primary down; make it downAfterMilliseconds plus at least a few seconds" (int $r.sentinel.storeRetryMilliseconds) (int $r.sentinel.downAfterMilliseconds)) }}
{{- end }}
{{- else if gt (int $r.replicas) 1 }}
{{- fail (printf "redis.replicas is %d without redis.sentinel.enabled: replicas without Sentinel would never be promoted and the store URL names one server; set redis.sentinel.enabled=true, or redis.replicas=1" (int $r.replicas)) }}
{{- end }}
{{- end }}

{{/*
The peers allowed to reach Redis (and, with Sentinel, the sentinels): the operator, the
cache nodes, pods carrying the injected sidecar (any namespace), the nodes' CIDRs (the
cache nodes use their host's network) and networkPolicy.redisExtraFrom.
*/}}
{{- define "granary.redis.networkPeers" -}}
- podSelector:
    matchLabels:
      {{- include "granary.operator.selectorLabels" . | nindent 6 }}
- podSelector:
    matchLabels:
      app.kubernetes.io/name: granary-cachenode
- namespaceSelector: {}
  podSelector:
    matchExpressions:
      - key: granary.io/dataset
        operator: Exists
{{- range .Values.networkPolicy.nodeCIDRs }}
- ipBlock:
    cidr: {{ . | quote }}
{{- end }}
{{- with .Values.networkPolicy.redisExtraFrom }}
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end }}
