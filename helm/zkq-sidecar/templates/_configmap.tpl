{{/*
zkq-sidecar.config: zkq.toml rendered from zkq.config. Strings are written as TOML basic strings
(JSON escaping is a subset of TOML's), integers as integers. No secret ever appears here:
zookeeper.auth_digest is refused in values and reaches zkq as ZKQ__ZOOKEEPER__AUTH_DIGEST from a
Secret; the TLS files, the SASL password, the API token and the SQS secret access key are files
mounted from Secrets, and only their paths are written here.
*/}}
{{- define "zkq-sidecar.config" -}}
{{- $zkq := include "zkq-sidecar.values" . | fromYaml -}}
{{- $c := $zkq.config -}}
{{- $secrets := include "zkq-sidecar.secretsDir" . -}}
# zkq configuration, rendered by the zkq-sidecar Helm chart from the zkq.config values.
# Credentials are not here: zookeeper.auth_digest comes from the ZKQ__ZOOKEEPER__AUTH_DIGEST
# environment variable, TLS files, the SASL password and the API token from files mounted from
# Secrets. Validate with: zkq check-config --config zkq.toml (in the pod, where the files are)
queues_dynamic = {{ $c.queues_dynamic }}
queues_dynamic_grouped = {{ $c.queues_dynamic_grouped }}
max_dynamic_queues = {{ int64 $c.max_dynamic_queues }}
queues_watch_on_demand = {{ $c.queues_watch_on_demand }}
queues_fleet_watchers = {{ int64 $c.queues_fleet_watchers }}
counters_dynamic = {{ $c.counters_dynamic }}

[zookeeper]
connect = {{ toString $c.zookeeper.connect | toJson }}
root = {{ toString $c.zookeeper.root | toJson }}
session_timeout = {{ toString $c.zookeeper.session_timeout | toJson }}
request_timeout = {{ toString $c.zookeeper.request_timeout | toJson }}
reconnect_backoff_max = {{ toString $c.zookeeper.reconnect_backoff_max | toJson }}
jute_maxbuffer = {{ int64 $c.zookeeper.jute_maxbuffer }}
{{- with $c.zookeeper.acl }}
acl = {{ toJson . }}
{{- end }}

[zookeeper.tls]
enabled = {{ $c.zookeeper.tls.enabled }}
verify_hostname = {{ $c.zookeeper.tls.verify_hostname }}
reload_interval = {{ toString $c.zookeeper.tls.reload_interval | toJson }}
{{- if $zkq.tlsSecret.name }}
ca_file = {{ printf "%s/tls/ca.crt" $secrets | toJson }}
{{- if $zkq.tlsSecret.certKey }}
cert_file = {{ printf "%s/tls/tls.crt" $secrets | toJson }}
key_file = {{ printf "%s/tls/tls.key" $secrets | toJson }}
{{- end }}
{{- end }}
{{- if $c.zookeeper.sasl.mechanism }}

[zookeeper.sasl]
mechanism = {{ toString $c.zookeeper.sasl.mechanism | toJson }}
username = {{ toString $c.zookeeper.sasl.username | toJson }}
password_file = {{ printf "%s/sasl/password" $secrets | toJson }}
{{- end }}

[api]
listen = {{ toString $c.api.listen | toJson }}
max_message_bytes = {{ int64 $c.api.max_message_bytes }}
max_batch_bytes = {{ int64 $c.api.max_batch_bytes }}
refuse_cross_origin = {{ $c.api.refuse_cross_origin }}
{{- if $zkq.apiTokenSecret.name }}
token_file = {{ include "zkq-sidecar.apiTokenFile" . | toJson }}
{{- end }}

[admin]
listen = {{ toString $c.admin.listen | toJson }}
{{- with $c.sqs }}

[sqs]
{{- range $key := list "listen" "account_id" "region" "access_key_id" "binary_bodies" }}
{{- if not (kindIs "invalid" (index $c.sqs $key)) }}
{{ $key }} = {{ toString (index $c.sqs $key) | toJson }}
{{- end }}
{{- end }}
{{- if $zkq.sqsSecret.name }}
secret_access_key_file = {{ printf "%s/sqs/secret-access-key" $secrets | toJson }}
{{- end }}
{{- end }}

[log]
format = {{ toString $c.log.format | toJson }}
level = {{ toString $c.log.level | toJson }}

[take]
max_wait = {{ toString $c.take.max_wait | toJson }}

[lease]
default_visibility = {{ toString $c.lease.default_visibility | toJson }}
max_visibility = {{ toString $c.lease.max_visibility | toJson }}

[shutdown]
grace = {{ toString $c.shutdown.grace | toJson }}
{{- range $name, $q := $c.queues }}

[queues.{{ $name | toJson }}]
kind = {{ toString ($q.kind | default "fifo") | toJson }}
{{- if $q.path }}
path = {{ toString $q.path | toJson }}
{{- end }}
{{- if $q.lock_path }}
lock_path = {{ toString $q.lock_path | toJson }}
{{- end }}
{{- if not (kindIs "invalid" $q.max_items) }}
max_items = {{ int64 $q.max_items }}
{{- end }}
{{- if not (kindIs "invalid" $q.max_deliveries) }}
max_deliveries = {{ int64 $q.max_deliveries }}
{{- end }}
{{- if $q.dead_letter }}
dead_letter = {{ toString $q.dead_letter | toJson }}
{{- end }}
{{- if $q.idempotency_window }}
idempotency_window = {{ toString $q.idempotency_window | toJson }}
{{- end }}
{{- if not (kindIs "invalid" $q.grouped) }}
grouped = {{ $q.grouped }}
{{- end }}
{{- if $q.sqs_binary_bodies }}
sqs_binary_bodies = {{ toString $q.sqs_binary_bodies | toJson }}
{{- end }}
{{- with $q.push }}
{{- $p := . }}

[queues.{{ $name | toJson }}.push]
url = {{ toString $p.url | toJson }}
{{- if not (kindIs "invalid" $p.allow_remote) }}
allow_remote = {{ $p.allow_remote }}
{{- end }}
{{- if not (kindIs "invalid" $p.concurrency) }}
concurrency = {{ int64 $p.concurrency }}
{{- end }}
{{- range $key := list "visibility" "request_timeout" "backoff_initial" "backoff_max" "readiness_url" "readiness_interval" "content_type" "event_type" }}
{{- if not (kindIs "invalid" (index $p $key)) }}
{{ $key }} = {{ toString (index $p $key) | toJson }}
{{- end }}
{{- end }}
{{- if not (kindIs "invalid" $p.backoff_jitter) }}
backoff_jitter = {{ float64 $p.backoff_jitter }}
{{- end }}
{{- end }}
{{- end }}
{{- range $name, $counter := $c.counters }}

[counters.{{ $name | toJson }}]
{{- if $counter.path }}
path = {{ toString $counter.path | toJson }}
{{- end }}
seed = {{ int64 ($counter.seed | default 0) }}
{{- end }}
{{- end -}}

{{/*
zkq-sidecar.configmap: the ConfigMap that zkq-sidecar.volumes mounts at /etc/zkq.
Usage, in a template file of the including chart (e.g. templates/zkq.yaml):
  {{ include "zkq-sidecar.configmap" . }}
*/}}
{{- define "zkq-sidecar.configmap" -}}
{{- include "zkq-sidecar.validate" . -}}
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ include "zkq-sidecar.configMapName" . | quote }}
  labels:
    {{- include "zkq-sidecar.labels" . | nindent 4 }}
data:
  zkq.toml: |
    {{- regexReplaceAll "(?m)[ \t]+$" (include "zkq-sidecar.config" . | nindent 4) "" }}
{{- end -}}

{{/*
zkq-sidecar.podAnnotations: pod annotations, to go under the pod template's
metadata.annotations:
  - checksum/zkq-config, so that a configuration change rolls the pods;
  - prometheus.io/scrape, /port, /path (unless zkq.metrics.annotations=false), for Prometheus
    setups that discover pods by annotation.
Usage:
  annotations:
    {{- include "zkq-sidecar.podAnnotations" . | nindent 4 }}
*/}}
{{- define "zkq-sidecar.podAnnotations" -}}
{{- $zkq := include "zkq-sidecar.values" . | fromYaml -}}
checksum/zkq-config: {{ include "zkq-sidecar.config" . | sha256sum | quote }}
{{- if $zkq.metrics.annotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ include "zkq-sidecar.adminPort" . | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end -}}

{{/*
zkq-sidecar.podmonitor: a Prometheus operator PodMonitor scraping zkq-admin /metrics, rendered
only when zkq.podMonitor.enabled is true (it starts with `---`, so it can follow the ConfigMap in
the same template file).
Usage:
  {{ include "zkq-sidecar.podmonitor" . }}
*/}}
{{- define "zkq-sidecar.podmonitor" -}}
{{- $zkq := include "zkq-sidecar.values" . | fromYaml -}}
{{- if $zkq.podMonitor.enabled }}
---
apiVersion: monitoring.coreos.com/v1
kind: PodMonitor
metadata:
  name: {{ printf "%s-zkq" .Release.Name | trunc 63 | trimSuffix "-" | quote }}
  labels:
    {{- include "zkq-sidecar.labels" . | nindent 4 }}
    {{- with $zkq.podMonitor.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  selector:
    {{- if $zkq.podMonitor.selector }}
    {{- toYaml $zkq.podMonitor.selector | nindent 4 }}
    {{- else }}
    matchLabels:
      app.kubernetes.io/instance: {{ .Release.Name | quote }}
    {{- end }}
  podMetricsEndpoints:
    - port: zkq-admin
      path: /metrics
      interval: {{ $zkq.podMonitor.interval | quote }}
      scrapeTimeout: {{ $zkq.podMonitor.scrapeTimeout | quote }}
{{- end }}
{{- end -}}
