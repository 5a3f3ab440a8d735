{{/*
zkq-sidecar.container: the zkq container, as ONE item of a container list.

With zkq.nativeSidecar=true (default) the item carries `restartPolicy: Always` and belongs under
the pod's `initContainers:` (a native sidecar, Kubernetes >= 1.29); with false it has no
restartPolicy and belongs under `containers:`. Charts that want the switch to work without template
edits use zkq-sidecar.initContainers and zkq-sidecar.containers, which place it for them.

Usage (under `initContainers:` of a pod spec, any indentation):
  initContainers:
    {{- include "zkq-sidecar.container" . | nindent 4 }}
*/}}
{{- define "zkq-sidecar.container" -}}
{{- include "zkq-sidecar.validate" . -}}
{{- $zkq := include "zkq-sidecar.values" . | fromYaml -}}
{{- $adminPort := include "zkq-sidecar.adminPort" . | atoi -}}
- name: {{ $zkq.containerName | quote }}
  image: {{ include "zkq-sidecar.image" . | quote }}
  imagePullPolicy: {{ $zkq.image.pullPolicy }}
  {{- if $zkq.nativeSidecar }}
  # Native sidecar: started (and ready) before the app containers, stopped after they exit.
  restartPolicy: Always
  {{- end }}
  args:
    - --config
    - /etc/zkq/zkq.toml
  ports:
    - name: zkq-api
      containerPort: {{ include "zkq-sidecar.apiPort" . }}
      protocol: TCP
    - name: zkq-admin
      containerPort: {{ $adminPort }}
      protocol: TCP
  {{- if or $zkq.authSecret.name $zkq.extraEnv }}
  env:
    {{- if $zkq.authSecret.name }}
    # zookeeper.auth_digest ("user:password"): from a Secret only, never from the ConfigMap.
    - name: ZKQ__ZOOKEEPER__AUTH_DIGEST
      valueFrom:
        secretKeyRef:
          name: {{ $zkq.authSecret.name | quote }}
          key: {{ $zkq.authSecret.key | quote }}
    {{- end }}
    {{- with $zkq.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
  startupProbe:
    httpGet:
      path: /readyz
      port: zkq-admin
    periodSeconds: {{ int64 $zkq.probes.startup.periodSeconds }}
    timeoutSeconds: {{ int64 $zkq.probes.startup.timeoutSeconds }}
    failureThreshold: {{ int64 $zkq.probes.startup.failureThreshold }}
  readinessProbe:
    httpGet:
      path: /readyz
      port: zkq-admin
    periodSeconds: {{ int64 $zkq.probes.readiness.periodSeconds }}
    timeoutSeconds: {{ int64 $zkq.probes.readiness.timeoutSeconds }}
    successThreshold: {{ int64 $zkq.probes.readiness.successThreshold }}
    failureThreshold: {{ int64 $zkq.probes.readiness.failureThreshold }}
  livenessProbe:
    httpGet:
      path: /livez
      port: zkq-admin
    periodSeconds: {{ int64 $zkq.probes.liveness.periodSeconds }}
    timeoutSeconds: {{ int64 $zkq.probes.liveness.timeoutSeconds }}
    failureThreshold: {{ int64 $zkq.probes.liveness.failureThreshold }}
  resources:
    {{- toYaml $zkq.resources | nindent 4 }}
  securityContext:
    {{- toYaml $zkq.securityContext | nindent 4 }}
  volumeMounts:
    - name: zkq-config
      mountPath: /etc/zkq
      readOnly: true
    {{- $secrets := include "zkq-sidecar.secretsDir" . }}
    {{- if $zkq.tlsSecret.name }}
    - name: zkq-tls
      mountPath: {{ printf "%s/tls" $secrets }}
      readOnly: true
    {{- end }}
    {{- if $zkq.saslSecret.name }}
    - name: zkq-sasl
      mountPath: {{ printf "%s/sasl" $secrets }}
      readOnly: true
    {{- end }}
    {{- if $zkq.apiTokenSecret.name }}
    - name: zkq-api-token
      mountPath: {{ printf "%s/api-token" $secrets }}
      readOnly: true
    {{- end }}
    {{- if $zkq.sqsSecret.name }}
    - name: zkq-sqs
      mountPath: {{ printf "%s/sqs" $secrets }}
      readOnly: true
    {{- end }}
  terminationMessagePolicy: FallbackToLogsOnError
{{- end -}}

{{/*
zkq-sidecar.initContainers: zkq-sidecar.container when zkq.nativeSidecar is true, else nothing.
zkq-sidecar.containers: zkq-sidecar.container when zkq.nativeSidecar is false, else nothing.
Together they make zkq.nativeSidecar a pure values switch:

  {{- with include "zkq-sidecar.initContainers" . }}
  initContainers:
    {{- . | nindent 4 }}
  {{- end }}
  containers:
    - name: app
      ...
    {{- include "zkq-sidecar.containers" . | nindent 4 }}
*/}}
{{- define "zkq-sidecar.initContainers" -}}
{{- if (include "zkq-sidecar.values" . | fromYaml).nativeSidecar -}}
{{- include "zkq-sidecar.container" . -}}
{{- end -}}
{{- end -}}

{{- define "zkq-sidecar.containers" -}}
{{- if not (include "zkq-sidecar.values" . | fromYaml).nativeSidecar -}}
{{- include "zkq-sidecar.container" . -}}
{{- end -}}
{{- end -}}

{{/*
zkq-sidecar.volumes: the pod volumes of zkq, as items of the pod's `volumes:` list: zkq-config
(zkq.toml, from the zkq-sidecar.configmap ConfigMap), and the Secrets that are configured:
zkq-tls (zkq.tlsSecret: ca.crt, and tls.crt and tls.key for mutual TLS), zkq-sasl
(zkq.saslSecret: password), zkq-api-token (zkq.apiTokenSecret: token) and zkq-sqs (zkq.sqsSecret:
secret-access-key). Only the named keys are
projected, under fixed file names.
*/}}
{{- define "zkq-sidecar.volumes" -}}
{{- $zkq := include "zkq-sidecar.values" . | fromYaml -}}
- name: zkq-config
  configMap:
    name: {{ include "zkq-sidecar.configMapName" . | quote }}
    items:
      - key: zkq.toml
        path: zkq.toml
{{- with $zkq.tlsSecret }}
{{- if .name }}
- name: zkq-tls
  secret:
    secretName: {{ .name | quote }}
    items:
      - key: {{ .caKey | quote }}
        path: ca.crt
      {{- if .certKey }}
      - key: {{ .certKey | quote }}
        path: tls.crt
      - key: {{ .keyKey | quote }}
        path: tls.key
      {{- end }}
{{- end }}
{{- end }}
{{- with $zkq.saslSecret }}
{{- if .name }}
- name: zkq-sasl
  secret:
    secretName: {{ .name | quote }}
    items:
      - key: {{ .key | quote }}
        path: password
{{- end }}
{{- end }}
{{- with $zkq.apiTokenSecret }}
{{- if .name }}
- name: zkq-api-token
  secret:
    secretName: {{ .name | quote }}
    items:
      - key: {{ .key | quote }}
        path: token
{{- end }}
{{- end }}
{{- with $zkq.sqsSecret }}
{{- if .name }}
- name: zkq-sqs
  secret:
    secretName: {{ .name | quote }}
    items:
      - key: {{ .key | quote }}
        path: secret-access-key
{{- end }}
{{- end }}
{{- end -}}
