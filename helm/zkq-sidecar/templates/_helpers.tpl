{{/*
zkq-sidecar library chart: helpers shared by the other templates.

Every public template takes the including chart's root context (`.`) and reads `.Values.zkq`,
merged over the defaults below. Numbers in Helm values arrive as float64: print them with
`int64`.
*/}}

{{/*
zkq-sidecar.defaults: the defaults of every `zkq.*` value, as YAML. Keep in sync with
values.yaml (scripts/check-deploy.sh compares them).
*/}}
{{- define "zkq-sidecar.defaults" -}}
nativeSidecar: true
containerName: zkq
image:
  repository: zkq
  tag: "0.1.0"
  digest: ""
  pullPolicy: IfNotPresent
configMapName: ""
partOf: ""
authSecret:
  name: ""
  key: auth-digest
tlsSecret:
  name: ""
  caKey: ca.crt
  certKey: ""
  keyKey: ""
saslSecret:
  name: ""
  key: password
apiTokenSecret:
  name: ""
  key: token
sqsSecret:
  name: ""
  key: secret-access-key
extraEnv: []
resources:
  requests:
    cpu: 25m
    memory: 32Mi
  limits:
    memory: 128Mi
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  readOnlyRootFilesystem: true
  allowPrivilegeEscalation: false
  privileged: false
  capabilities:
    drop:
      - ALL
  seccompProfile:
    type: RuntimeDefault
probes:
  startup:
    periodSeconds: 2
    timeoutSeconds: 2
    failureThreshold: 90
  readiness:
    periodSeconds: 5
    timeoutSeconds: 2
    successThreshold: 1
    failureThreshold: 2
  liveness:
    periodSeconds: 10
    timeoutSeconds: 2
    failureThreshold: 3
metrics:
  annotations: true
podMonitor:
  enabled: false
  interval: 30s
  scrapeTimeout: 10s
  labels: {}
  selector: {}
prometheusRule:
  enabled: false
  labels: {}
  alertLabels: {}
  selector: ""
  runbookUrl: docs/operations.md
  alerts:
    backlogGrowing:
      enabled: true
      severity: warning
      minDepth: 1000
      window: 30m
      for: 15m
    oldestMessage:
      enabled: true
      severity: warning
      maxAgeSeconds: 900
      for: 5m
    leasesExpiring:
      enabled: true
      severity: warning
      ratio: 0.05
      for: 10m
    deadLetters:
      enabled: true
      severity: warning
      window: 10m
      for: 0m
    claimConflicts:
      enabled: true
      severity: warning
      perMessage: 1
      for: 15m
    childListLarge:
      enabled: true
      severity: warning
      bytes: 943718
      for: 5m
    putsFailing:
      enabled: true
      severity: critical
      ratio: 0.01
      for: 5m
    sessionLost:
      enabled: true
      severity: warning
      window: 10m
    disconnected:
      enabled: true
      severity: warning
      for: 1m
    notReady:
      enabled: true
      severity: critical
      for: 5m
dashboard:
  enabled: false
  labels:
    grafana_dashboard: "1"
  annotations: {}
config:
  zookeeper:
    connect: ""
    root: /zkq
    session_timeout: 30s
    request_timeout: 10s
    reconnect_backoff_max: 5s
    jute_maxbuffer: 1048575
    acl: []
    tls:
      enabled: false
      verify_hostname: true
      reload_interval: 1m
    sasl:
      mechanism: ""
      username: ""
  api:
    listen: 127.0.0.1:8080
    max_message_bytes: 524288
    max_batch_bytes: 524288
    refuse_cross_origin: true
  admin:
    listen: 0.0.0.0:9090
  log:
    format: json
    level: info,zookeeper_client=warn
  take:
    max_wait: 20s
  lease:
    default_visibility: 30s
    max_visibility: 12h
  shutdown:
    grace: 10s
  queues_dynamic: true
  queues_dynamic_grouped: false
  max_dynamic_queues: 1000
  queues_watch_on_demand: true
  queues_fleet_watchers: 3
  counters_dynamic: true
  queues: {}
  counters: {}
{{- end -}}

{{/*
zkq-sidecar.merge: deep-merges dict "src" into dict "dst" in place. Unlike sprig's
mergeOverwrite it also applies false, 0 and "" from src; a null in src removes the key.
Usage: {{- $_ := include "zkq-sidecar.merge" (dict "dst" $d "src" $s) }}
*/}}
{{- define "zkq-sidecar.merge" -}}
{{- $dst := .dst -}}
{{- range $key, $value := .src -}}
{{- if kindIs "invalid" $value -}}
{{- $_ := unset $dst $key -}}
{{- else if and (kindIs "map" $value) (kindIs "map" (get $dst $key)) -}}
{{- $_ := include "zkq-sidecar.merge" (dict "dst" (get $dst $key) "src" $value) -}}
{{- else -}}
{{- $_ := set $dst $key $value -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
zkq-sidecar.values: the effective `zkq` values (defaults merged with .Values.zkq), as YAML.
Usage: {{- $zkq := include "zkq-sidecar.values" . | fromYaml }}
*/}}
{{- define "zkq-sidecar.values" -}}
{{- $merged := include "zkq-sidecar.defaults" . | fromYaml -}}
{{- $_ := include "zkq-sidecar.merge" (dict "dst" $merged "src" (deepCopy (.Values.zkq | default dict))) -}}
{{- toYaml $merged -}}
{{- end -}}

{{/* zkq-sidecar.configMapName: "<release>-zkq" unless zkq.configMapName is set. */}}
{{- define "zkq-sidecar.configMapName" -}}
{{- $zkq := include "zkq-sidecar.values" . | fromYaml -}}
{{- default (printf "%s-zkq" .Release.Name) $zkq.configMapName | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* zkq-sidecar.image: repository:tag, or repository@digest when a digest is set. */}}
{{- define "zkq-sidecar.image" -}}
{{- $image := (include "zkq-sidecar.values" . | fromYaml).image -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository (toString $image.tag) -}}
{{- end -}}
{{- end -}}

{{/* zkq-sidecar.labels: recommended labels of the objects this chart renders (ConfigMap, PodMonitor). */}}
{{- define "zkq-sidecar.labels" -}}
{{- $zkq := include "zkq-sidecar.values" . | fromYaml -}}
app.kubernetes.io/name: zkq
app.kubernetes.io/instance: {{ .Release.Name | quote }}
app.kubernetes.io/version: {{ toString $zkq.image.tag | replace "+" "_" | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/component: queue-sidecar
app.kubernetes.io/part-of: {{ default .Chart.Name $zkq.partOf | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
{{- end -}}

{{/* zkq-sidecar.apiPort / zkq-sidecar.adminPort: the port numbers of api.listen and admin.listen. */}}
{{- define "zkq-sidecar.apiPort" -}}
{{- $zkq := include "zkq-sidecar.values" . | fromYaml -}}
{{- include "zkq-sidecar.portOf" (dict "key" "api.listen" "listen" $zkq.config.api.listen) -}}
{{- end -}}

{{- define "zkq-sidecar.adminPort" -}}
{{- $zkq := include "zkq-sidecar.values" . | fromYaml -}}
{{- include "zkq-sidecar.portOf" (dict "key" "admin.listen" "listen" $zkq.config.admin.listen) -}}
{{- end -}}

{{- define "zkq-sidecar.portOf" -}}
{{- $listen := toString .listen -}}
{{- if not (regexMatch "^(\\[[0-9A-Fa-f:.]+\\]|[0-9.]+):[0-9]{1,5}$" $listen) -}}
{{- fail (printf "zkq-sidecar: zkq.config.%s = %q is not a socket address like 127.0.0.1:8080 or [::]:9090" .key $listen) -}}
{{- end -}}
{{- $port := regexFind "[0-9]+$" $listen | atoi -}}
{{- if or (lt $port 1) (gt $port 65535) -}}
{{- fail (printf "zkq-sidecar: zkq.config.%s = %q: the port must be 1-65535" .key $listen) -}}
{{- end -}}
{{- $port -}}
{{- end -}}

{{/*
zkq-sidecar.url: the base URL the app in the same pod uses for the queue API, e.g.
http://127.0.0.1:8080 (a wildcard api.listen is reached on loopback).
*/}}
{{- define "zkq-sidecar.url" -}}
{{- $listen := toString (include "zkq-sidecar.values" . | fromYaml).config.api.listen -}}
{{- $port := include "zkq-sidecar.apiPort" . -}}
{{- $host := regexReplaceAll ":[0-9]+$" $listen "" -}}
{{- if or (eq $host "0.0.0.0") (eq $host "[::]") -}}
{{- $host = "127.0.0.1" -}}
{{- end -}}
{{- printf "http://%s:%s" $host $port -}}
{{- end -}}

{{/*
zkq-sidecar.shutdownGraceSeconds: zkq's shutdown.grace in whole seconds, rounded up.
The chart accepts a single-unit duration here (e.g. 10s, 1500ms, 1m) so it can do this sum.
*/}}
{{- define "zkq-sidecar.shutdownGraceSeconds" -}}
{{- $grace := toString (include "zkq-sidecar.values" . | fromYaml).config.shutdown.grace -}}
{{- if not (regexMatch "^[0-9]+(ms|s|m|h)$" $grace) -}}
{{- fail (printf "zkq-sidecar: zkq.config.shutdown.grace = %q: use one number and one unit, like 10s, 1500ms or 1m" $grace) -}}
{{- end -}}
{{- $n := regexFind "^[0-9]+" $grace | atoi -}}
{{- $unit := regexFind "[a-z]+$" $grace -}}
{{- if eq $unit "ms" -}}{{- div (add $n 999) 1000 -}}
{{- else if eq $unit "s" -}}{{- $n -}}
{{- else if eq $unit "m" -}}{{- mul $n 60 -}}
{{- else -}}{{- mul $n 3600 -}}
{{- end -}}
{{- end -}}

{{/*
zkq-sidecar.assertTerminationGrace: fails the render unless the pod's
terminationGracePeriodSeconds is larger than zkq's shutdown.grace (a native sidecar gets SIGTERM
only after the app containers exited, inside the same pod-wide grace period). A null "seconds"
stands for the Kubernetes default, 30.
Usage: {{- include "zkq-sidecar.assertTerminationGrace" (dict "context" $ "seconds" .Values.terminationGracePeriodSeconds) }}
*/}}
{{- define "zkq-sidecar.assertTerminationGrace" -}}
{{- $grace := include "zkq-sidecar.shutdownGraceSeconds" .context | atoi -}}
{{- $seconds := 30 -}}
{{- if not (kindIs "invalid" .seconds) -}}{{- $seconds = int64 .seconds -}}{{- end -}}
{{- if le $seconds (int64 $grace) -}}
{{- fail (printf "zkq-sidecar: terminationGracePeriodSeconds (%d) must be larger than zkq.config.shutdown.grace (%ds), plus the time the app needs to stop" $seconds $grace) -}}
{{- end -}}
{{- end -}}

{{/*
zkq-sidecar.validate: checks across values that a JSON schema cannot express. Called by the
container and configmap templates.
*/}}
{{- define "zkq-sidecar.validate" -}}
{{- $zkq := include "zkq-sidecar.values" . | fromYaml -}}
{{- if not $zkq.config.zookeeper.connect -}}
{{- fail "zkq-sidecar: set zkq.config.zookeeper.connect to your ZooKeeper ensemble, e.g. zk-0.zk:2181,zk-1.zk:2181,zk-2.zk:2181" -}}
{{- end -}}
{{- if hasKey $zkq.config.zookeeper "auth_digest" -}}
{{- fail "zkq-sidecar: zkq.config.zookeeper.auth_digest is not accepted (it would land in a ConfigMap); put \"user:password\" in a Secret and set zkq.authSecret.name and zkq.authSecret.key" -}}
{{- end -}}
{{- $tls := $zkq.config.zookeeper.tls -}}
{{- if and $tls.enabled (not $zkq.tlsSecret.name) -}}
{{- fail "zkq-sidecar: zkq.config.zookeeper.tls.enabled needs zkq.tlsSecret.name: the Secret with the CA bundle (and the client certificate and key for mutual TLS)" -}}
{{- end -}}
{{- if and $zkq.tlsSecret.name (not $tls.enabled) -}}
{{- fail "zkq-sidecar: zkq.tlsSecret.name is set but zkq.config.zookeeper.tls.enabled is false; enable TLS or remove the Secret" -}}
{{- end -}}
{{- if ne (empty $zkq.tlsSecret.certKey) (empty $zkq.tlsSecret.keyKey) -}}
{{- fail "zkq-sidecar: zkq.tlsSecret.certKey and zkq.tlsSecret.keyKey go together (a client certificate needs its key): set both or neither" -}}
{{- end -}}
{{- $sasl := $zkq.config.zookeeper.sasl -}}
{{- if or (hasKey $sasl "password") (hasKey $sasl "password_file") -}}
{{- fail "zkq-sidecar: the SASL password is not accepted in zkq.config (it would land in a ConfigMap); put it in a Secret and set zkq.saslSecret.name and zkq.saslSecret.key" -}}
{{- end -}}
{{- if and $sasl.mechanism (or (not $sasl.username) (not $zkq.saslSecret.name)) -}}
{{- fail "zkq-sidecar: zkq.config.zookeeper.sasl.mechanism needs zkq.config.zookeeper.sasl.username and zkq.saslSecret.name (the Secret holding the password)" -}}
{{- end -}}
{{- if and (not $sasl.mechanism) (or $sasl.username $zkq.saslSecret.name) -}}
{{- fail "zkq-sidecar: zkq.config.zookeeper.sasl.username and zkq.saslSecret need zkq.config.zookeeper.sasl.mechanism: DIGEST-MD5" -}}
{{- end -}}
{{- $admin := toString $zkq.config.admin.listen -}}
{{- if regexMatch "^(127\\.|\\[::1\\]:|localhost:)" $admin -}}
{{- fail (printf "zkq-sidecar: zkq.config.admin.listen = %q is loopback: the kubelet's probes and Prometheus reach the pod IP, so listen on 0.0.0.0:PORT or [::]:PORT" $admin) -}}
{{- end -}}
{{- if eq (include "zkq-sidecar.apiPort" .) (include "zkq-sidecar.adminPort" .) -}}
{{- fail "zkq-sidecar: zkq.config.api.listen and zkq.config.admin.listen must use different ports" -}}
{{- end -}}
{{- $_ := include "zkq-sidecar.shutdownGraceSeconds" . -}}
{{- if and $zkq.nativeSidecar (semverCompare "<1.29.0-0" .Capabilities.KubeVersion.Version) -}}
{{- fail (printf "zkq-sidecar: zkq.nativeSidecar=true needs Kubernetes >= 1.29 (native sidecar containers); this release targets %s. Set zkq.nativeSidecar=false to run zkq as a regular container." .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- end -}}

{{/*
zkq-sidecar.secretsDir: where the Secrets of zkq.tlsSecret, zkq.saslSecret, zkq.apiTokenSecret and
zkq.sqsSecret are mounted (one directory each), outside /etc/zkq (a ConfigMap volume cannot hold mount points).
*/}}
{{- define "zkq-sidecar.secretsDir" -}}
/var/run/secrets/zkq
{{- end -}}

{{/*
zkq-sidecar.apiTokenFile: the path of the API token file (zkq.apiTokenSecret), also where the app
finds it once it mounts the zkq-api-token volume at {{ include "zkq-sidecar.secretsDir" . }}/api-token.
*/}}
{{- define "zkq-sidecar.apiTokenFile" -}}
{{- printf "%s/api-token/token" (include "zkq-sidecar.secretsDir" .) -}}
{{- end -}}
