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
