{{/* The chart's name, or nameOverride. */}}
{{- define "duet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: the prefix of every object's name. */}}
{{- define "duet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "duet.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "duet.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "duet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "duet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels that select duet's pods. */}}
{{- define "duet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "duet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The service account duet's pods run as. */}}
{{- define "duet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "duet.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The engines' namespace (source: kubernetes). */}}
{{- define "duet.engineNamespace" -}}
{{- .Values.engines.kubernetes.namespace | default .Release.Namespace }}
{{- end }}

{{/* duet's image reference. */}}
{{- define "duet.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
duet's configuration file (docs/configuration.md): the chart's addresses and
engines, then the config values as they are.
*/}}
{{- define "duet.config" -}}
{{- $cfg := deepCopy (.Values.config | default dict) }}
{{- range $key := list "listen" "prefill" "decode" "kubernetes" }}
{{- if hasKey $cfg $key }}
{{- fail (printf "config.%s: the chart sets it; use engines (prefill, decode, kubernetes) or ports (listen)" $key) }}
{{- end }}
{{- end }}
{{- $_ := set $cfg "listen" (dict "grpc" (printf ":%d" (int .Values.ports.grpc)) "admin" (printf ":%d" (int .Values.ports.admin))) }}
{{- $engines := .Values.engines }}
{{- if eq $engines.source "kubernetes" }}
{{- if or $engines.prefill $engines.decode }}
{{- fail "engines.prefill and engines.decode are for source: static; with source: kubernetes the Services in engines.kubernetes list the engines" }}
{{- end }}
{{- $k := deepCopy $engines.kubernetes }}
{{- $_ := set $k "namespace" (include "duet.engineNamespace" .) }}
{{- if not (and $k.decode $k.decode.service) }}
{{- fail "engines.kubernetes.decode.service is required: the decode (or aggregated) engines' Service" }}
{{- end }}
{{- if not (and $k.prefill $k.prefill.service) }}
{{- $_ := unset $k "prefill" }}
{{- end }}
{{- $_ := set $cfg "kubernetes" $k }}
{{- else if eq $engines.source "static" }}
{{- if not $engines.decode }}
{{- fail "engines.decode must list at least one engine with source: static" }}
{{- end }}
{{- if $engines.prefill }}
{{- $_ := set $cfg "prefill" $engines.prefill }}
{{- end }}
{{- $_ := set $cfg "decode" $engines.decode }}
{{- else }}
{{- fail (printf "engines.source: %q is neither kubernetes nor static" $engines.source) }}
{{- end }}
{{- $envoy := deepCopy ($cfg.envoy | default dict) }}
{{- range $key := list "listen" "admin" "duet" }}
{{- if hasKey $envoy $key }}
{{- fail (printf "config.envoy.%s: the chart sets it (envoy.port, envoy.adminPort, ports.grpc)" $key) }}
{{- end }}
{{- end }}
{{- $_ := set $envoy "listen" (printf "0.0.0.0:%d" (int .Values.envoy.port)) }}
{{- $_ := set $envoy "admin" (printf "127.0.0.1:%d" (int .Values.envoy.adminPort)) }}
{{- $_ := set $envoy "duet" (printf "127.0.0.1:%d" (int .Values.ports.grpc)) }}
{{- $_ := set $cfg "envoy" $envoy }}
{{- toYaml $cfg }}
{{- end }}
