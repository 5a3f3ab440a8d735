{{/*
Monitoring: zkq's alerting rules (a PrometheusRule for the Prometheus operator) and its Grafana
dashboard (a ConfigMap for Grafana's dashboard sidecar).

The rules below are the source of helm/monitoring/zkq-alerts.yaml (rendered with the default
values; scripts/check-deploy.sh --sync rewrites it and the check fails when they differ). The
dashboard's source is helm/monitoring/zkq-dashboard.json, copied into _dashboard.tpl by the same
command. Each alert's runbook is its section of docs/operations.md.
*/}}

{{/*
zkq-sidecar.sel: a PromQL label-matcher set from (list SELECTOR MATCHERS): both joined with a
comma inside braces, or nothing when both are empty.
*/}}
{{- define "zkq-sidecar.sel" -}}
{{- $parts := list -}}
{{- with index . 1 }}{{ $parts = append $parts . }}{{ end -}}
{{- with index . 0 }}{{ $parts = append $parts . }}{{ end -}}
{{- if $parts }}{{ printf "{%s}" (join "," $parts) }}{{ end -}}
{{- end -}}

{{/*
zkq-sidecar.alertGroups: the rule groups, as the `groups:` list of a Prometheus rules file (also
the spec of the PrometheusRule). Thresholds come from zkq.prometheusRule.alerts.
*/}}
{{- define "zkq-sidecar.alertGroups" -}}
{{- $zkq := include "zkq-sidecar.values" . | fromYaml -}}
{{- $r := $zkq.prometheusRule -}}
{{- $a := $r.alerts -}}
{{- $s := $r.selector -}}
{{- $by := "namespace, job, queue" -}}
{{- $put := `route=~"/v1/queues/[{]queue[}]/(messages|batch)",method="POST"` -}}
groups:
  - name: zkq-queues
    rules:
      {{- if $a.backlogGrowing.enabled }}
      - alert: ZkqQueueBacklogGrowing
        expr: |-
          max by ({{ $by }}) (zkq_queue_children{{ include "zkq-sidecar.sel" (list $s "") }}) > {{ $a.backlogGrowing.minDepth }}
          and
          max by ({{ $by }}) (deriv(zkq_queue_children{{ include "zkq-sidecar.sel" (list $s "") }}[{{ $a.backlogGrowing.window }}])) > 0
        for: {{ $a.backlogGrowing.for }}
        labels:
          severity: {{ $a.backlogGrowing.severity }}
          {{- with $r.alertLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: {{ `Queue {{ $labels.queue }} holds {{ $value }} messages and keeps growing` | quote }}
          description: {{ printf "%s%v%s%s%s" `Queue {{ $labels.queue }} holds more than ` $a.backlogGrowing.minDepth ` messages and its depth rose over the last ` $a.backlogGrowing.window `: consumers take less than producers put.` | quote }}
          runbook_url: {{ printf "%s#zkqqueuebackloggrowing" $r.runbookUrl | quote }}
      {{- end }}
      {{- if $a.oldestMessage.enabled }}
      - alert: ZkqOldestMessageTooOld
        expr: |-
          max by ({{ $by }}) (zkq_queue_oldest_message_age_seconds{{ include "zkq-sidecar.sel" (list $s "") }}) > {{ $a.oldestMessage.maxAgeSeconds }}
        for: {{ $a.oldestMessage.for }}
        labels:
          severity: {{ $a.oldestMessage.severity }}
          {{- with $r.alertLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: {{ `The next message of queue {{ $labels.queue }} has waited {{ $value | humanizeDuration }}` | quote }}
          description: {{ printf "%s%v%s" `The next message to deliver in queue {{ $labels.queue }} has waited more than ` $a.oldestMessage.maxAgeSeconds ` seconds: nothing takes it, or every take fails.` | quote }}
          runbook_url: {{ printf "%s#zkqoldestmessagetooold" $r.runbookUrl | quote }}
      {{- end }}
      {{- if $a.leasesExpiring.enabled }}
      - alert: ZkqLeasesExpiring
        expr: |-
          sum by ({{ $by }}) (rate(zkq_messages_expired_total{{ include "zkq-sidecar.sel" (list $s "") }}[10m]))
          /
          sum by ({{ $by }}) (rate(zkq_messages_leased_total{{ include "zkq-sidecar.sel" (list $s "") }}[10m]))
          > {{ $a.leasesExpiring.ratio }}
        for: {{ $a.leasesExpiring.for }}
        labels:
          severity: {{ $a.leasesExpiring.severity }}
          {{- with $r.alertLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: {{ `{{ $value | humanizePercentage }} of the leases of queue {{ $labels.queue }} expire` | quote }}
          description: {{ printf "%s%v%s" `Queue {{ $labels.queue }} has more than ` $a.leasesExpiring.ratio ` expired leases per lease handed out: consumers do not ack or nack within the visibility timeout (too slow, or crashing), and those messages are delivered again.` | quote }}
          runbook_url: {{ printf "%s#zkqleasesexpiring" $r.runbookUrl | quote }}
      {{- end }}
      {{- if $a.deadLetters.enabled }}
      - alert: ZkqDeadLettersArriving
        expr: |-
          sum by ({{ $by }}) (increase(zkq_messages_dead_lettered_total{{ include "zkq-sidecar.sel" (list $s "") }}[{{ $a.deadLetters.window }}])) > 0
        for: {{ $a.deadLetters.for }}
        labels:
          severity: {{ $a.deadLetters.severity }}
          {{- with $r.alertLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: {{ `Messages of queue {{ $labels.queue }} are moving to its dead-letter queue` | quote }}
          description: {{ printf "%s%s%s" `Messages of queue {{ $labels.queue }} went to its dead-letter queue in the last ` $a.deadLetters.window `: delivered more than max_deliveries times, or not Curator envelopes.` | quote }}
          runbook_url: {{ printf "%s#zkqdeadlettersarriving" $r.runbookUrl | quote }}
      {{- end }}
      {{- if $a.claimConflicts.enabled }}
      - alert: ZkqClaimConflictsHigh
        expr: |-
          sum by ({{ $by }}) (rate(zkq_claim_attempts_total{{ include "zkq-sidecar.sel" (list $s `outcome!="won"`) }}[10m]))
          /
          sum by ({{ $by }}) (rate(zkq_claim_attempts_total{{ include "zkq-sidecar.sel" (list $s `outcome="won"`) }}[10m]))
          > {{ $a.claimConflicts.perMessage }}
        for: {{ $a.claimConflicts.for }}
        labels:
          severity: {{ $a.claimConflicts.severity }}
          {{- with $r.alertLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: {{ `{{ $value | humanize }} failed claims per message delivered from queue {{ $labels.queue }}` | quote }}
          description: {{ printf "%s%v%s" `Takes and leases of queue {{ $labels.queue }} fail more than ` $a.claimConflicts.perMessage ` claims (lost, gone or locked) per message they deliver: many consumers fight over the same head, and every failed claim costs ZooKeeper requests.` | quote }}
          runbook_url: {{ printf "%s#zkqclaimconflictshigh" $r.runbookUrl | quote }}
      {{- end }}
      {{- if $a.childListLarge.enabled }}
      - alert: ZkqChildListTooLarge
        expr: |-
          max by ({{ $by }}) (zkq_queue_children_bytes{{ include "zkq-sidecar.sel" (list $s "") }}) > {{ $a.childListLarge.bytes }}
        for: {{ $a.childListLarge.for }}
        labels:
          severity: {{ $a.childListLarge.severity }}
          {{- with $r.alertLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: {{ `The child list of queue {{ $labels.queue }} is {{ $value | humanize1024 }}B` | quote }}
          description: {{ printf "%s%v%s" `The child list of queue {{ $labels.queue }} is larger than ` $a.childListLarge.bytes ` bytes; beyond 1,048,575 (jute.maxbuffer) Curator consumers can no longer read it.` | quote }}
          runbook_url: {{ printf "%s#zkqchildlisttoolarge" $r.runbookUrl | quote }}
      {{- end }}
  - name: zkq-instances
    rules:
      {{- if $a.putsFailing.enabled }}
      - alert: ZkqPutsFailing
        expr: |-
          sum without (status) (rate(zkq_http_requests_total{{ include "zkq-sidecar.sel" (list $s (printf `%s,status=~"503|504"` $put)) }}[5m]))
          /
          sum without (status) (rate(zkq_http_requests_total{{ include "zkq-sidecar.sel" (list $s $put) }}[5m]))
          > {{ $a.putsFailing.ratio }}
        for: {{ $a.putsFailing.for }}
        labels:
          severity: {{ $a.putsFailing.severity }}
          {{- with $r.alertLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: {{ `{{ $value | humanizePercentage }} of the puts to {{ $labels.instance }} answer 503 or 504` | quote }}
          description: {{ printf "%s%v%s" `The share of puts this zkq answers with 503 (ZooKeeper unavailable, shutting down, overloaded) or 504 outcome_unknown (the message may or may not be stored) is above ` $a.putsFailing.ratio `.` | quote }}
          runbook_url: {{ printf "%s#zkqputsfailing" $r.runbookUrl | quote }}
      {{- end }}
      {{- if $a.sessionLost.enabled }}
      - alert: ZkqZookeeperSessionLost
        expr: |-
          increase(zkq_zookeeper_session_expirations_total{{ include "zkq-sidecar.sel" (list $s "") }}[{{ $a.sessionLost.window }}]) > 0
        labels:
          severity: {{ $a.sessionLost.severity }}
          {{- with $r.alertLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: {{ `zkq {{ $labels.instance }} lost its ZooKeeper session` | quote }}
          description: {{ printf "%s%s%s" `zkq {{ $labels.instance }} lost its ZooKeeper session in the last ` $a.sessionLost.window `: its locks are gone, so the messages it had leased are delivered again, and its lease receipts answer 409 lease_lost.` | quote }}
          runbook_url: {{ printf "%s#zkqzookeepersessionlost" $r.runbookUrl | quote }}
      {{- end }}
      {{- if $a.disconnected.enabled }}
      - alert: ZkqZookeeperDisconnected
        expr: |-
          max without (state) (zkq_zookeeper_connection_state{{ include "zkq-sidecar.sel" (list $s `state=~"suspended|lost"`) }}) == 1
        for: {{ $a.disconnected.for }}
        labels:
          severity: {{ $a.disconnected.severity }}
          {{- with $r.alertLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: {{ `zkq {{ $labels.instance }} has no ZooKeeper connection` | quote }}
          description: {{ printf "%s%s%s" `zkq {{ $labels.instance }} has been suspended (connection lost, session maybe alive) or without a session for ` $a.disconnected.for `: it answers 503 to every queue request.` | quote }}
          runbook_url: {{ printf "%s#zkqzookeeperdisconnected" $r.runbookUrl | quote }}
      {{- end }}
      {{- if $a.notReady.enabled }}
      - alert: ZkqNotReady
        expr: |-
          zkq_ready{{ include "zkq-sidecar.sel" (list $s "") }} == 0
        for: {{ $a.notReady.for }}
        labels:
          severity: {{ $a.notReady.severity }}
          {{- with $r.alertLabels }}{{ toYaml . | nindent 10 }}{{ end }}
        annotations:
          summary: {{ `zkq {{ $labels.instance }} is not ready` | quote }}
          description: {{ printf "%s%s%s" `zkq {{ $labels.instance }} has answered /readyz with 503 for ` $a.notReady.for `: no connected ZooKeeper session. Its pod is out of its Services' endpoints.` | quote }}
          runbook_url: {{ printf "%s#zkqnotready" $r.runbookUrl | quote }}
      {{- end }}
{{- end -}}

{{/*
zkq-sidecar.prometheusrule: a monitoring.coreos.com/v1 PrometheusRule with zkq's alerts, rendered
only when zkq.prometheusRule.enabled is true (it starts with `---`).
Usage:
  {{ include "zkq-sidecar.prometheusrule" . }}
*/}}
{{- define "zkq-sidecar.prometheusrule" -}}
{{- $zkq := include "zkq-sidecar.values" . | fromYaml -}}
{{- if $zkq.prometheusRule.enabled }}
---
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: {{ printf "%s-zkq" .Release.Name | trunc 63 | trimSuffix "-" | quote }}
  labels:
    {{- include "zkq-sidecar.labels" . | nindent 4 }}
    {{- with $zkq.prometheusRule.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  {{- include "zkq-sidecar.alertGroups" . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
zkq-sidecar.dashboard: a ConfigMap holding zkq's Grafana dashboard (zkq.json), labelled for
Grafana's dashboard sidecar (grafana_dashboard: "1" by default), rendered only when
zkq.dashboard.enabled is true (it starts with `---`).
Usage:
  {{ include "zkq-sidecar.dashboard" . }}
*/}}
{{- define "zkq-sidecar.dashboard" -}}
{{- $zkq := include "zkq-sidecar.values" . | fromYaml -}}
{{- if $zkq.dashboard.enabled }}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ printf "%s-zkq-dashboard" .Release.Name | trunc 63 | trimSuffix "-" | quote }}
  labels:
    {{- include "zkq-sidecar.labels" . | nindent 4 }}
    {{- with $zkq.dashboard.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $zkq.dashboard.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
data:
  zkq.json: |-
    {{- include "zkq-sidecar.dashboardJson" . | nindent 4 }}
{{- end }}
{{- end -}}
