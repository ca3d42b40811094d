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

{{/* "true" when duet discovers engines through the Kubernetes API (engines.source kubernetes, or, with pools, a pool naming its Services), else "". */}}
{{- define "duet.discovery" -}}
{{- if .Values.pools }}
{{- range .Values.pools }}{{ if .kubernetes }}true{{ end }}{{ end }}
{{- else if eq .Values.engines.source "kubernetes" }}true{{ end }}
{{- end }}

{{/* The engines' namespace (source: kubernetes). */}}
{{- define "duet.engineNamespace" -}}
{{- .Values.engines.kubernetes.namespace | default .Release.Namespace }}
{{- end }}

{{/* duet's image reference. */}}
{{- define "duet.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* "true" when duet requires mutual TLS (auth.mode mtls or both), else "". */}}
{{- define "duet.tls" -}}
{{- if has .Values.auth.mode (list "mtls" "both") }}true{{ end }}
{{- end }}

{{/* "true" when duet requires the bearer token (auth.mode token or both), else "". */}}
{{- define "duet.token" -}}
{{- if has .Values.auth.mode (list "token" "both") }}true{{ end }}
{{- end }}

{{/* The Secret of duet's server certificate (tls.crt, tls.key, ca.crt). */}}
{{- define "duet.tlsSecretName" -}}
{{- if and (eq .Values.auth.tls.source "secret") (not .Values.auth.tls.secretName) }}
{{- fail "auth.tls.secretName: name the Secret of duet's certificate (tls.crt, tls.key, ca.crt) with auth.tls.source: secret" }}
{{- end }}
{{- .Values.auth.tls.secretName | default (printf "%s-tls" (include "duet.fullname" .)) }}
{{- end }}

{{/* The Secret of Envoy's client certificate (tls.crt, tls.key, ca.crt). */}}
{{- define "duet.envoyTLSSecretName" -}}
{{- if and (eq .Values.auth.tls.source "secret") .Values.envoy.enabled (not .Values.auth.tls.clientSecretName) }}
{{- fail "auth.tls.clientSecretName: name the Secret of Envoy's client certificate (tls.crt, tls.key, ca.crt) with auth.tls.source: secret" }}
{{- end }}
{{- .Values.auth.tls.clientSecretName | default (printf "%s-envoy-tls" (include "duet.fullname" .)) }}
{{- end }}

{{/* The Secret of the gRPC bearer token (key "token"). */}}
{{- define "duet.tokenSecretName" -}}
{{- .Values.auth.token.existingSecret | default (printf "%s-token" (include "duet.fullname" .)) }}
{{- end }}

{{/* The Secret of the admin token (key "token"). */}}
{{- define "duet.adminTokenSecretName" -}}
{{- .Values.auth.adminToken.existingSecret | default (printf "%s-admin-token" (include "duet.fullname" .)) }}
{{- end }}

{{/* The name of Envoy's client certificate: the first admitted name. */}}
{{- define "duet.clientName" -}}
{{- with .Values.auth.tls.clientNames }}{{ first . }}{{ else }}envoy{{ end }}
{{- end }}

{{/* DNS names of duet's server certificate: auth.tls.serverName and its Service's names. */}}
{{- define "duet.serverDNSNames" -}}
{{- $svc := include "duet.fullname" . }}
{{- $ns := .Release.Namespace }}
{{- list .Values.auth.tls.serverName $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) | uniq | toJson }}
{{- end }}

{{/*
Where the containers find the credentials (the Secret volumes' mount paths).
*/}}
{{- define "duet.tlsDir" -}}/run/secrets/duet/tls{{- end }}
{{- define "duet.envoyTLSDir" -}}/run/secrets/duet/envoy-tls{{- end }}
{{- define "duet.tokenDir" -}}/run/secrets/duet/token{{- end }}
{{- define "duet.adminTokenDir" -}}/run/secrets/duet/admin-token{{- end }}
{{- define "duet.natsTokenDir" -}}/run/secrets/duet/nats-token{{- end }}

{{/*
duet's sync section (docs/replicas.md) from the sync values; empty when the
replicas share nothing. Fails where the values cannot work: several duets
behind a gateway that share nothing, or NATS without a word on its
authentication. The replica's name is left to POD_NAME (the pod's name).
*/}}
{{- define "duet.syncConfig" -}}
{{- $nats := .Values.sync.nats }}
{{- if not $nats.url }}
{{- if and (not .Values.envoy.enabled) (gt (int .Values.replicaCount) 1) }}
{{- fail (printf "replicaCount: %d duets behind a gateway must share their state: set sync.nats.url (and sync.nats.tokenSecret) to a NATS server, docs/deploy/kubernetes.md \"Replicas\", or set replicaCount 1" (int .Values.replicaCount)) }}
{{- end }}
{{- if or $nats.tokenSecret $nats.unauthenticated }}
{{- fail "sync.nats.tokenSecret and sync.nats.unauthenticated need sync.nats.url: the NATS server the replicas share through" }}
{{- end }}
{{- else }}
{{- if and $nats.tokenSecret $nats.unauthenticated }}
{{- fail "sync.nats: set tokenSecret or unauthenticated, not both" }}
{{- end }}
{{- if not (or $nats.tokenSecret $nats.unauthenticated) }}
{{- fail "sync.nats.tokenSecret: name the Secret (key token) of the token your NATS server requires, or set sync.nats.unauthenticated: true where only duet's pods reach NATS" }}
{{- end }}
{{- $n := dict "url" $nats.url }}
{{- if $nats.tokenSecret }}
{{- $_ := set $n "token_file" (printf "%s/token" (include "duet.natsTokenDir" .)) }}
{{- end }}
{{- $subject := .Values.sync.subject | default (printf "duet.%s.%s" .Release.Namespace (include "duet.fullname" .)) }}
{{- toYaml (dict "nats" $n "subject" $subject) }}
{{- end }}
{{- end }}

{{/*
duet's otlp section (docs/tracing.md) from the otlp values; empty when
tracing is off. Unset service names and sampling take duet's defaults.
*/}}
{{- define "duet.otlpConfig" -}}
{{- $o := .Values.otlp }}
{{- if $o.enabled }}
{{- if not $o.endpoint }}
{{- fail "otlp.endpoint: name the OTLP/gRPC collector (host:port, e.g. otel-collector.observability.svc.cluster.local:4317) that duet and Envoy export their spans to, or set otlp.enabled false" }}
{{- end }}
{{- $c := dict "endpoint" $o.endpoint }}
{{- with $o.envoyEndpoint }}
{{- $_ := set $c "envoy_endpoint" . }}
{{- end }}
{{- if not (kindIs "invalid" $o.samplingPercent) }}
{{- $_ := set $c "sampling_percent" $o.samplingPercent }}
{{- end }}
{{- with $o.serviceName }}
{{- $_ := set $c "service_name" . }}
{{- end }}
{{- with $o.envoyServiceName }}
{{- $_ := set $c "envoy_service_name" . }}
{{- end }}
{{- toYaml $c }}
{{- end }}
{{- end }}

{{/*
duet's auth section (docs/configuration.md) from the auth values; empty
when duet authenticates nobody on loopback.
*/}}
{{- define "duet.authConfig" -}}
{{- $auth := .Values.auth }}
{{- $a := dict }}
{{- if include "duet.tls" . }}
{{- $tls := dict "cert_file" (printf "%s/tls.crt" (include "duet.tlsDir" .)) "key_file" (printf "%s/tls.key" (include "duet.tlsDir" .)) "client_ca_file" (printf "%s/ca.crt" (include "duet.tlsDir" .)) }}
{{- with $auth.tls.clientNames }}
{{- $_ := set $tls "client_names" . }}
{{- end }}
{{- $_ := set $a "tls" $tls }}
{{- end }}
{{- if include "duet.token" . }}
{{- $_ := set $a "token_file" (printf "%s/token" (include "duet.tokenDir" .)) }}
{{- end }}
{{- if and (eq $auth.mode "none") (not .Values.envoy.enabled) }}
{{- $_ := set $a "unauthenticated" true }}
{{- end }}
{{- if $auth.adminToken.enabled }}
{{- $_ := set $a "admin_token_file" (printf "%s/token" (include "duet.adminTokenDir" .)) }}
{{- end }}
{{- if $a }}
{{- toYaml $a }}
{{- end }}
{{- end }}

{{/*
duet's configuration file (docs/configuration.md): the chart's addresses and
engines, then the config values as they are.
*/}}
{{- define "duet.config" -}}
{{- $cfg := deepCopy (.Values.config | default dict) }}
{{- range $key := list "listen" "prefill" "decode" "kubernetes" "auth" "sync" "otlp" }}
{{- if hasKey $cfg $key }}
{{- fail (printf "config.%s: the chart sets it; use engines (prefill, decode, kubernetes), ports (listen), auth (auth), sync (sync) or otlp (otlp)" $key) }}
{{- end }}
{{- end }}
{{- /* Beside its own Envoy, duet's gRPC port is for that Envoy alone. */}}
{{- $grpcHost := ternary "127.0.0.1" "" .Values.envoy.enabled }}
{{- $_ := set $cfg "listen" (dict "grpc" (printf "%s:%d" $grpcHost (int .Values.ports.grpc)) "admin" (printf ":%d" (int .Values.ports.admin))) }}
{{- with include "duet.authConfig" . }}
{{- $_ := set $cfg "auth" (fromYaml .) }}
{{- end }}
{{- with include "duet.syncConfig" . }}
{{- $_ := set $cfg "sync" (fromYaml .) }}
{{- end }}
{{- with include "duet.otlpConfig" . }}
{{- $_ := set $cfg "otlp" (fromYaml .) }}
{{- end }}
{{- if hasKey $cfg "pools" }}
{{- fail "config.pools: the chart sets it; use pools" }}
{{- end }}
{{- /* Helm reads values as YAML 1.1, where an unquoted on or off is a
boolean: duet would get mode true and refuse to start. */}}
{{- with $cfg.kv_events }}
{{- if kindIs "bool" .mode }}
{{- fail (printf "config.kv_events.mode: %v is a boolean; quote the mode (\"on\", \"off\", \"auto\"): YAML reads on and off unquoted as true and false" .mode) }}
{{- end }}
{{- end }}
{{- with $cfg.admission }}
{{- if kindIs "bool" .engine_priority }}
{{- fail (printf "config.admission.engine_priority: %v is a boolean; quote the mode (\"on\", \"off\", \"auto\"): YAML reads on and off unquoted as true and false" .engine_priority) }}
{{- end }}
{{- end }}
{{- $engines := .Values.engines }}
{{- if .Values.pools }}
{{- /* Pools: each names its Services or lists its engines; the engines
section gives only where and how to watch the Services. */}}
{{- if or $engines.prefill $engines.decode }}
{{- fail "engines.prefill and engines.decode must be empty with pools: list each pool's engines under pools[].prefill and pools[].decode, or name its Services under pools[].kubernetes" }}
{{- end }}
{{- $pools := list }}
{{- $discovery := false }}
{{- range $i, $p := .Values.pools }}
{{- $q := deepCopy $p }}
{{- if $q.kubernetes }}
{{- if or $q.prefill $q.decode }}
{{- fail (printf "pools[%d] (%s): prefill and decode list engines by URL; with pools[%d].kubernetes its Services list them" $i $q.name $i) }}
{{- end }}
{{- $k := $q.kubernetes }}
{{- if not (and $k.decode $k.decode.service) }}
{{- fail (printf "pools[%d].kubernetes.decode.service is required: pool %s's decode (or aggregated) engines' Service" $i $q.name) }}
{{- end }}
{{- if not (and $k.prefill $k.prefill.service) }}
{{- $_ := unset $k "prefill" }}
{{- end }}
{{- $_ := unset $q "prefill" }}
{{- $_ := unset $q "decode" }}
{{- $discovery = true }}
{{- else if not $q.decode }}
{{- fail (printf "pools[%d].decode must list at least one engine, or pools[%d].kubernetes name pool %s's Services" $i $i $q.name) }}
{{- end }}
{{- $pools = append $pools $q }}
{{- end }}
{{- if $discovery }}
{{- $k := deepCopy $engines.kubernetes }}
{{- $_ := unset $k "prefill" }}
{{- $_ := unset $k "decode" }}
{{- $_ := set $k "namespace" (include "duet.engineNamespace" .) }}
{{- $_ := set $cfg "kubernetes" $k }}
{{- end }}
{{- $_ := set $cfg "pools" $pools }}
{{- else if eq $engines.source "kubernetes" }}
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
{{- range $key := list "listen" "admin" "duet" "duet_tls" }}
{{- if hasKey $envoy $key }}
{{- fail (printf "config.envoy.%s: the chart sets it (envoy.port, envoy.adminPort, ports.grpc, auth.tls)" $key) }}
{{- end }}
{{- end }}
{{- /* Envoy's side of mutual TLS: where the Envoy beside duet mounts its
client certificate (duet envoy-config requires it with auth.tls). */}}
{{- if include "duet.tls" . }}
{{- $dir := include "duet.envoyTLSDir" . }}
{{- $_ := set $envoy "duet_tls" (dict "cert_file" (printf "%s/tls.crt" $dir) "key_file" (printf "%s/tls.key" $dir) "ca_file" (printf "%s/ca.crt" $dir) "server_name" .Values.auth.tls.serverName) }}
{{- end }}
{{- $_ := set $envoy "listen" (printf "0.0.0.0:%d" (int .Values.envoy.port)) }}
{{- $_ := set $envoy "admin" (printf "127.0.0.1:%d" (int .Values.envoy.adminPort)) }}
{{- $_ := set $envoy "duet" (printf "127.0.0.1:%d" (int .Values.ports.grpc)) }}
{{- $_ := set $cfg "envoy" $envoy }}
{{- toYaml $cfg }}
{{- end }}

{{/* The issuer, key and lifetime of a cert-manager Certificate (auth.tls.certManager). */}}
{{- define "duet.certificateSpec" -}}
{{- $cm := .Values.auth.tls.certManager -}}
{{- with $cm.duration }}
duration: {{ . }}
{{- end }}
{{- with $cm.renewBefore }}
renewBefore: {{ . }}
{{- end }}
privateKey:
  algorithm: ECDSA
  size: 256
  rotationPolicy: Always
issuerRef:
  name: {{ $cm.issuerRef.name }}
  kind: {{ $cm.issuerRef.kind }}
  group: {{ $cm.issuerRef.group }}
{{- end }}
