{{/*
zkq-sidecar.dashboardJson: helm/monitoring/zkq-dashboard.json, verbatim. GENERATED from that file by
scripts/check-deploy.sh --sync: edit the JSON, not this (the check fails when they differ).
*/}}
{{- define "zkq-sidecar.dashboardJson" -}}
{
  "title": "zkq",
  "uid": "zkq-queues",
  "description": "zkq: per queue depth, age of the oldest message, message rates, leases, dead letters; API latency; ZooKeeper connection and cost. Runbook: docs/operations.md.",
  "tags": [
    "zkq",
    "zookeeper",
    "queues"
  ],
  "editable": true,
  "graphTooltip": 1,
  "refresh": "30s",
  "schemaVersion": 39,
  "version": 1,
  "time": {
    "from": "now-3h",
    "to": "now"
  },
  "timepicker": {},
  "timezone": "",
  "links": [],
  "annotations": {
    "list": []
  },
  "templating": {
    "list": [
      {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "hide": 0,
        "refresh": 1,
        "regex": "",
        "current": {},
        "options": []
      },
      {
        "name": "namespace",
        "label": "Namespace",
        "type": "query",
        "datasource": {
          "type": "prometheus",
          "uid": "${datasource}"
        },
        "query": {
          "query": "label_values(zkq_build_info, namespace)",
          "refId": "namespace"
        },
        "definition": "label_values(zkq_build_info, namespace)",
        "includeAll": true,
        "allValue": ".*",
        "multi": true,
        "refresh": 2,
        "sort": 1,
        "hide": 0,
        "regex": "",
        "current": {
          "selected": true,
          "text": [
            "All"
          ],
          "value": [
            "$__all"
          ]
        },
        "options": []
      },
      {
        "name": "job",
        "label": "Job",
        "type": "query",
        "datasource": {
          "type": "prometheus",
          "uid": "${datasource}"
        },
        "query": {
          "query": "label_values(zkq_build_info{namespace=~\"$namespace\"}, job)",
          "refId": "job"
        },
        "definition": "label_values(zkq_build_info{namespace=~\"$namespace\"}, job)",
        "includeAll": true,
        "allValue": ".*",
        "multi": true,
        "refresh": 2,
        "sort": 1,
        "hide": 0,
        "regex": "",
        "current": {
          "selected": true,
          "text": [
            "All"
          ],
          "value": [
            "$__all"
          ]
        },
        "options": []
      },
      {
        "name": "queue",
        "label": "Queue",
        "type": "query",
        "datasource": {
          "type": "prometheus",
          "uid": "${datasource}"
        },
        "query": {
          "query": "label_values(zkq_queue_children{job=~\"$job\",namespace=~\"$namespace\"}, queue)",
          "refId": "queue"
        },
        "definition": "label_values(zkq_queue_children{job=~\"$job\",namespace=~\"$namespace\"}, queue)",
        "includeAll": true,
        "allValue": ".*",
        "multi": true,
        "refresh": 2,
        "sort": 1,
        "hide": 0,
        "regex": "",
        "current": {
          "selected": true,
          "text": [
            "All"
          ],
          "value": [
            "$__all"
          ]
        },
        "options": []
      }
    ]
  },
  "panels": [
    {
      "type": "row",
      "title": "Queues",
      "collapsed": false,
      "id": 2,
      "gridPos": {
        "h": 1,
        "w": 24,
        "x": 0,
        "y": 0
      },
      "panels": []
    },
    {
      "type": "timeseries",
      "title": "Depth",
      "description": "Children of each queue node (zkq_queue_children): messages waiting or being processed, foreign nodes included. The highest value any sidecar reports.",
      "id": 3,
      "datasource": {
        "type": "prometheus",
        "uid": "${datasource}"
      },
      "gridPos": {
        "h": 8,
        "w": 8,
        "x": 0,
        "y": 1
      },
      "fieldConfig": {
        "defaults": {
          "unit": "short",
          "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": true
          },
          "min": 0
        },
        "overrides": []
      },
      "options": {
        "legend": {
          "displayMode": "list",
          "placement": "bottom",
          "showLegend": true
        },
        "tooltip": {
          "mode": "multi",
          "sort": "desc"
        }
      },
      "targets": [
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "max by (queue) (zkq_queue_children{job=~\"$job\",namespace=~\"$namespace\",queue=~\"$queue\"})",
          "legendFormat": "{{ "{{" }}queue{{ "}}" }}",
          "refId": "A"
        }
      ]
    },
    {
      "type": "timeseries",
      "title": "Age of the oldest message",
      "description": "How long the next message to deliver has waited (since its creation, or since it became due in a delay queue); 0 when none waits. Alert: ZkqOldestMessageTooOld.",
      "id": 4,
      "datasource": {
        "type": "prometheus",
        "uid": "${datasource}"
      },
      "gridPos": {
        "h": 8,
        "w": 8,
        "x": 8,
        "y": 1
      },
      "fieldConfig": {
        "defaults": {
          "unit": "s",
          "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": true
          },
          "min": 0
        },
        "overrides": []
      },
      "options": {
        "legend": {
          "displayMode": "list",
          "placement": "bottom",
          "showLegend": true
        },
        "tooltip": {
          "mode": "multi",
          "sort": "desc"
        }
      },
      "targets": [
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "max by (queue) (zkq_queue_oldest_message_age_seconds{job=~\"$job\",namespace=~\"$namespace\",queue=~\"$queue\"})",
          "legendFormat": "{{ "{{" }}queue{{ "}}" }}",
          "refId": "A"
        }
      ]
    },
    {
      "type": "timeseries",
      "title": "Leases in flight",
      "description": "Leased messages being processed (zkq_leases_in_flight), summed over the sidecars.",
      "id": 5,
      "datasource": {
        "type": "prometheus",
        "uid": "${datasource}"
      },
      "gridPos": {
        "h": 8,
        "w": 8,
        "x": 16,
        "y": 1
      },
      "fieldConfig": {
        "defaults": {
          "unit": "short",
          "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": true
          },
          "min": 0
        },
        "overrides": []
      },
      "options": {
        "legend": {
          "displayMode": "list",
          "placement": "bottom",
          "showLegend": true
        },
        "tooltip": {
          "mode": "multi",
          "sort": "desc"
        }
      },
      "targets": [
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "sum by (queue) (zkq_leases_in_flight{job=~\"$job\",namespace=~\"$namespace\",queue=~\"$queue\"})",
          "legendFormat": "{{ "{{" }}queue{{ "}}" }}",
          "refId": "A"
        }
      ]
    },
    {
      "type": "timeseries",
      "title": "Puts, takes, leases and acks",
      "description": "Messages per second through each queue, summed over the sidecars.",
      "id": 6,
      "datasource": {
        "type": "prometheus",
        "uid": "${datasource}"
      },
      "gridPos": {
        "h": 8,
        "w": 12,
        "x": 0,
        "y": 9
      },
      "fieldConfig": {
        "defaults": {
          "unit": "ops",
          "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": true
          },
          "min": 0
        },
        "overrides": []
      },
      "options": {
        "legend": {
          "displayMode": "list",
          "placement": "bottom",
          "showLegend": true
        },
        "tooltip": {
          "mode": "multi",
          "sort": "desc"
        }
      },
      "targets": [
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "sum by (queue) (rate(zkq_messages_put_total{job=~\"$job\",namespace=~\"$namespace\",queue=~\"$queue\"}[$__rate_interval]))",
          "legendFormat": "put {{ "{{" }}queue{{ "}}" }}",
          "refId": "A"
        },
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "sum by (queue) (rate(zkq_messages_taken_total{job=~\"$job\",namespace=~\"$namespace\",queue=~\"$queue\"}[$__rate_interval]))",
          "legendFormat": "take {{ "{{" }}queue{{ "}}" }}",
          "refId": "B"
        },
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "sum by (queue) (rate(zkq_messages_leased_total{job=~\"$job\",namespace=~\"$namespace\",queue=~\"$queue\"}[$__rate_interval]))",
          "legendFormat": "lease {{ "{{" }}queue{{ "}}" }}",
          "refId": "C"
        },
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "sum by (queue) (rate(zkq_messages_acked_total{job=~\"$job\",namespace=~\"$namespace\",queue=~\"$queue\"}[$__rate_interval]))",
          "legendFormat": "ack {{ "{{" }}queue{{ "}}" }}",
          "refId": "D"
        }
      ]
    },
    {
      "type": "timeseries",
      "title": "Nacks and expired leases",
      "description": "Leases nacked (by mode) and leases whose visibility timeout passed (their messages are delivered again). Alert: ZkqLeasesExpiring.",
      "id": 7,
      "datasource": {
        "type": "prometheus",
        "uid": "${datasource}"
      },
      "gridPos": {
        "h": 8,
        "w": 12,
        "x": 12,
        "y": 9
      },
      "fieldConfig": {
        "defaults": {
          "unit": "ops",
          "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": true
          },
          "min": 0
        },
        "overrides": []
      },
      "options": {
        "legend": {
          "displayMode": "list",
          "placement": "bottom",
          "showLegend": true
        },
        "tooltip": {
          "mode": "multi",
          "sort": "desc"
        }
      },
      "targets": [
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "sum by (queue, mode) (rate(zkq_messages_nacked_total{job=~\"$job\",namespace=~\"$namespace\",queue=~\"$queue\"}[$__rate_interval]))",
          "legendFormat": "nack {{ "{{" }}mode{{ "}}" }} {{ "{{" }}queue{{ "}}" }}",
          "refId": "A"
        },
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "sum by (queue) (rate(zkq_messages_expired_total{job=~\"$job\",namespace=~\"$namespace\",queue=~\"$queue\"}[$__rate_interval]))",
          "legendFormat": "expired {{ "{{" }}queue{{ "}}" }}",
          "refId": "B"
        }
      ]
    },
    {
      "type": "timeseries",
      "title": "Dead letters",
      "description": "Messages moved to the dead-letter queue (past max_deliveries, or not Curator envelopes), and queue- nodes skipped as undecodable. Alert: ZkqDeadLettersArriving.",
      "id": 8,
      "datasource": {
        "type": "prometheus",
        "uid": "${datasource}"
      },
      "gridPos": {
        "h": 8,
        "w": 8,
        "x": 0,
        "y": 17
      },
      "fieldConfig": {
        "defaults": {
          "unit": "short",
          "custom": {
            "drawStyle": "bars",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": true
          },
          "min": 0
        },
        "overrides": []
      },
      "options": {
        "legend": {
          "displayMode": "list",
          "placement": "bottom",
          "showLegend": true
        },
        "tooltip": {
          "mode": "multi",
          "sort": "desc"
        }
      },
      "targets": [
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "sum by (queue) (increase(zkq_messages_dead_lettered_total{job=~\"$job\",namespace=~\"$namespace\",queue=~\"$queue\"}[$__rate_interval]))",
          "legendFormat": "dead-lettered {{ "{{" }}queue{{ "}}" }}",
          "refId": "A"
        },
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "sum by (queue) (increase(zkq_undecodable_messages_total{job=~\"$job\",namespace=~\"$namespace\",queue=~\"$queue\"}[$__rate_interval]))",
          "legendFormat": "undecodable {{ "{{" }}queue{{ "}}" }}",
          "refId": "B"
        }
      ]
    },
    {
      "type": "timeseries",
      "title": "Waiting takers",
      "description": "Long-polling takes and leases waiting for a message, summed over the sidecars.",
      "id": 9,
      "datasource": {
        "type": "prometheus",
        "uid": "${datasource}"
      },
      "gridPos": {
        "h": 8,
        "w": 8,
        "x": 8,
        "y": 17
      },
      "fieldConfig": {
        "defaults": {
          "unit": "short",
          "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": true
          },
          "min": 0
        },
        "overrides": []
      },
      "options": {
        "legend": {
          "displayMode": "list",
          "placement": "bottom",
          "showLegend": true
        },
        "tooltip": {
          "mode": "multi",
          "sort": "desc"
        }
      },
      "targets": [
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "sum by (queue) (zkq_waiting_takers{job=~\"$job\",namespace=~\"$namespace\",queue=~\"$queue\"})",
          "legendFormat": "{{ "{{" }}queue{{ "}}" }}",
          "refId": "A"
        }
      ]
    },
    {
      "type": "timeseries",
      "title": "Failed claims per message",
      "description": "Claims lost, gone or locked per claim won: how much consumers fight over the same head. Alert: ZkqClaimConflictsHigh.",
      "id": 10,
      "datasource": {
        "type": "prometheus",
        "uid": "${datasource}"
      },
      "gridPos": {
        "h": 8,
        "w": 8,
        "x": 16,
        "y": 17
      },
      "fieldConfig": {
        "defaults": {
          "unit": "short",
          "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": true
          },
          "min": 0
        },
        "overrides": []
      },
      "options": {
        "legend": {
          "displayMode": "list",
          "placement": "bottom",
          "showLegend": true
        },
        "tooltip": {
          "mode": "multi",
          "sort": "desc"
        }
      },
      "targets": [
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "sum by (queue) (rate(zkq_claim_attempts_total{job=~\"$job\",namespace=~\"$namespace\",queue=~\"$queue\",outcome!=\"won\"}[$__rate_interval])) / sum by (queue) (rate(zkq_claim_attempts_total{job=~\"$job\",namespace=~\"$namespace\",queue=~\"$queue\",outcome=\"won\"}[$__rate_interval]))",
          "legendFormat": "{{ "{{" }}queue{{ "}}" }}",
          "refId": "A"
        }
      ]
    },
    {
      "type": "timeseries",
      "title": "Child list against Java's limit",
      "description": "Size of each queue's child list as a share of jute.maxbuffer (1,048,575 bytes): at 100% Curator consumers can no longer read the queue. Alert: ZkqChildListTooLarge.",
      "id": 11,
      "datasource": {
        "type": "prometheus",
        "uid": "${datasource}"
      },
      "gridPos": {
        "h": 8,
        "w": 24,
        "x": 0,
        "y": 25
      },
      "fieldConfig": {
        "defaults": {
          "unit": "percentunit",
          "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": true
          },
          "min": 0
        },
        "overrides": []
      },
      "options": {
        "legend": {
          "displayMode": "list",
          "placement": "bottom",
          "showLegend": true
        },
        "tooltip": {
          "mode": "multi",
          "sort": "desc"
        }
      },
      "targets": [
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "max by (queue) (zkq_queue_children_bytes{job=~\"$job\",namespace=~\"$namespace\",queue=~\"$queue\"}) / 1048575",
          "legendFormat": "{{ "{{" }}queue{{ "}}" }}",
          "refId": "A"
        }
      ]
    },
    {
      "type": "row",
      "title": "HTTP API",
      "collapsed": false,
      "id": 12,
      "gridPos": {
        "h": 1,
        "w": 24,
        "x": 0,
        "y": 33
      },
      "panels": []
    },
    {
      "type": "timeseries",
      "title": "API latency",
      "description": "Latency of every queue API request (long-polls included: a take or lease that waits counts its wait).",
      "id": 13,
      "datasource": {
        "type": "prometheus",
        "uid": "${datasource}"
      },
      "gridPos": {
        "h": 8,
        "w": 8,
        "x": 0,
        "y": 34
      },
      "fieldConfig": {
        "defaults": {
          "unit": "s",
          "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": true
          },
          "min": 0
        },
        "overrides": []
      },
      "options": {
        "legend": {
          "displayMode": "list",
          "placement": "bottom",
          "showLegend": true
        },
        "tooltip": {
          "mode": "multi",
          "sort": "desc"
        }
      },
      "targets": [
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "histogram_quantile(0.5, sum by (le) (rate(zkq_http_request_duration_seconds_bucket{job=~\"$job\",namespace=~\"$namespace\",route=~\"/v1/.*\"}[$__rate_interval])))",
          "legendFormat": "p50",
          "refId": "A"
        },
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "histogram_quantile(0.9, sum by (le) (rate(zkq_http_request_duration_seconds_bucket{job=~\"$job\",namespace=~\"$namespace\",route=~\"/v1/.*\"}[$__rate_interval])))",
          "legendFormat": "p90",
          "refId": "B"
        },
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "histogram_quantile(0.99, sum by (le) (rate(zkq_http_request_duration_seconds_bucket{job=~\"$job\",namespace=~\"$namespace\",route=~\"/v1/.*\"}[$__rate_interval])))",
          "legendFormat": "p99",
          "refId": "C"
        }
      ]
    },
    {
      "type": "timeseries",
      "title": "API p99 latency by route",
      "description": "99th percentile latency per route and method.",
      "id": 14,
      "datasource": {
        "type": "prometheus",
        "uid": "${datasource}"
      },
      "gridPos": {
        "h": 8,
        "w": 8,
        "x": 8,
        "y": 34
      },
      "fieldConfig": {
        "defaults": {
          "unit": "s",
          "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": true
          },
          "min": 0
        },
        "overrides": []
      },
      "options": {
        "legend": {
          "displayMode": "list",
          "placement": "bottom",
          "showLegend": true
        },
        "tooltip": {
          "mode": "multi",
          "sort": "desc"
        }
      },
      "targets": [
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "histogram_quantile(0.99, sum by (le, route, method) (rate(zkq_http_request_duration_seconds_bucket{job=~\"$job\",namespace=~\"$namespace\",route=~\"/v1/.*\"}[$__rate_interval])))",
          "legendFormat": "{{ "{{" }}method{{ "}}" }} {{ "{{" }}route{{ "}}" }}",
          "refId": "A"
        }
      ]
    },
    {
      "type": "timeseries",
      "title": "Put answers by status",
      "description": "Answers to puts, single (POST …/messages) and batch (POST …/batch): 201 stored; 503 ZooKeeper unavailable, shutting down or overloaded; 504 outcome_unknown. Alert: ZkqPutsFailing.",
      "id": 15,
      "datasource": {
        "type": "prometheus",
        "uid": "${datasource}"
      },
      "gridPos": {
        "h": 8,
        "w": 8,
        "x": 16,
        "y": 34
      },
      "fieldConfig": {
        "defaults": {
          "unit": "reqps",
          "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": true
          },
          "min": 0
        },
        "overrides": []
      },
      "options": {
        "legend": {
          "displayMode": "list",
          "placement": "bottom",
          "showLegend": true
        },
        "tooltip": {
          "mode": "multi",
          "sort": "desc"
        }
      },
      "targets": [
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "sum by (status) (rate(zkq_http_requests_total{job=~\"$job\",namespace=~\"$namespace\",route=~\"/v1/queues/[{]queue[}]/(messages|batch)\",method=\"POST\"}[$__rate_interval]))",
          "legendFormat": "{{ "{{" }}status{{ "}}" }}",
          "refId": "A"
        }
      ]
    },
    {
      "type": "timeseries",
      "title": "Requests by route and status",
      "description": "Every request, by route template, method and status.",
      "id": 16,
      "datasource": {
        "type": "prometheus",
        "uid": "${datasource}"
      },
      "gridPos": {
        "h": 8,
        "w": 24,
        "x": 0,
        "y": 42
      },
      "fieldConfig": {
        "defaults": {
          "unit": "reqps",
          "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": true
          },
          "min": 0
        },
        "overrides": []
      },
      "options": {
        "legend": {
          "displayMode": "list",
          "placement": "bottom",
          "showLegend": true
        },
        "tooltip": {
          "mode": "multi",
          "sort": "desc"
        }
      },
      "targets": [
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "sum by (route, method, status) (rate(zkq_http_requests_total{job=~\"$job\",namespace=~\"$namespace\"}[$__rate_interval]))",
          "legendFormat": "{{ "{{" }}method{{ "}}" }} {{ "{{" }}route{{ "}}" }} {{ "{{" }}status{{ "}}" }}",
          "refId": "A"
        }
      ]
    },
    {
      "type": "row",
      "title": "ZooKeeper",
      "collapsed": false,
      "id": 17,
      "gridPos": {
        "h": 1,
        "w": 24,
        "x": 0,
        "y": 50
      },
      "panels": []
    },
    {
      "type": "timeseries",
      "title": "Connection state",
      "description": "zkq instances in each ZooKeeper connection state (Curator's model). Alerts: ZkqZookeeperDisconnected, ZkqNotReady.",
      "id": 18,
      "datasource": {
        "type": "prometheus",
        "uid": "${datasource}"
      },
      "gridPos": {
        "h": 8,
        "w": 8,
        "x": 0,
        "y": 51
      },
      "fieldConfig": {
        "defaults": {
          "unit": "short",
          "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": true
          },
          "min": 0
        },
        "overrides": []
      },
      "options": {
        "legend": {
          "displayMode": "list",
          "placement": "bottom",
          "showLegend": true
        },
        "tooltip": {
          "mode": "multi",
          "sort": "desc"
        }
      },
      "targets": [
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "sum by (state) (zkq_zookeeper_connection_state{job=~\"$job\",namespace=~\"$namespace\"})",
          "legendFormat": "{{ "{{" }}state{{ "}}" }}",
          "refId": "A"
        }
      ]
    },
    {
      "type": "timeseries",
      "title": "Ready instances",
      "description": "zkq instances whose /readyz answers 200, of all scraped.",
      "id": 19,
      "datasource": {
        "type": "prometheus",
        "uid": "${datasource}"
      },
      "gridPos": {
        "h": 8,
        "w": 8,
        "x": 8,
        "y": 51
      },
      "fieldConfig": {
        "defaults": {
          "unit": "short",
          "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": true
          },
          "min": 0
        },
        "overrides": []
      },
      "options": {
        "legend": {
          "displayMode": "list",
          "placement": "bottom",
          "showLegend": true
        },
        "tooltip": {
          "mode": "multi",
          "sort": "desc"
        }
      },
      "targets": [
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "sum(zkq_ready{job=~\"$job\",namespace=~\"$namespace\"})",
          "legendFormat": "ready",
          "refId": "A"
        },
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "count(zkq_ready{job=~\"$job\",namespace=~\"$namespace\"})",
          "legendFormat": "instances",
          "refId": "B"
        }
      ]
    },
    {
      "type": "timeseries",
      "title": "ZooKeeper requests per message",
      "description": "ZooKeeper requests per message put, taken or leased (all queues of the selected instances; scrapes add one read per open queue).",
      "id": 20,
      "datasource": {
        "type": "prometheus",
        "uid": "${datasource}"
      },
      "gridPos": {
        "h": 8,
        "w": 8,
        "x": 16,
        "y": 51
      },
      "fieldConfig": {
        "defaults": {
          "unit": "short",
          "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": true
          },
          "min": 0
        },
        "overrides": []
      },
      "options": {
        "legend": {
          "displayMode": "list",
          "placement": "bottom",
          "showLegend": true
        },
        "tooltip": {
          "mode": "multi",
          "sort": "desc"
        }
      },
      "targets": [
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "sum(rate(zkq_zookeeper_requests_total{job=~\"$job\",namespace=~\"$namespace\"}[$__rate_interval])) / (sum(rate(zkq_messages_put_total{job=~\"$job\",namespace=~\"$namespace\"}[$__rate_interval])) + sum(rate(zkq_messages_taken_total{job=~\"$job\",namespace=~\"$namespace\"}[$__rate_interval])) + sum(rate(zkq_messages_leased_total{job=~\"$job\",namespace=~\"$namespace\"}[$__rate_interval])))",
          "legendFormat": "requests per message",
          "refId": "A"
        }
      ]
    },
    {
      "type": "timeseries",
      "title": "ZooKeeper requests by operation and outcome",
      "description": "Requests per second to ZooKeeper; outcomes other than ok are errors (no_node and bad_version are normal in races).",
      "id": 21,
      "datasource": {
        "type": "prometheus",
        "uid": "${datasource}"
      },
      "gridPos": {
        "h": 8,
        "w": 12,
        "x": 0,
        "y": 59
      },
      "fieldConfig": {
        "defaults": {
          "unit": "reqps",
          "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": true
          },
          "min": 0
        },
        "overrides": []
      },
      "options": {
        "legend": {
          "displayMode": "list",
          "placement": "bottom",
          "showLegend": true
        },
        "tooltip": {
          "mode": "multi",
          "sort": "desc"
        }
      },
      "targets": [
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "sum by (operation, outcome) (rate(zkq_zookeeper_requests_total{job=~\"$job\",namespace=~\"$namespace\"}[$__rate_interval]))",
          "legendFormat": "{{ "{{" }}operation{{ "}}" }} {{ "{{" }}outcome{{ "}}" }}",
          "refId": "A"
        }
      ]
    },
    {
      "type": "timeseries",
      "title": "ZooKeeper p99 latency by operation",
      "description": "99th percentile of ZooKeeper round trips.",
      "id": 22,
      "datasource": {
        "type": "prometheus",
        "uid": "${datasource}"
      },
      "gridPos": {
        "h": 8,
        "w": 12,
        "x": 12,
        "y": 59
      },
      "fieldConfig": {
        "defaults": {
          "unit": "s",
          "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": true
          },
          "min": 0
        },
        "overrides": []
      },
      "options": {
        "legend": {
          "displayMode": "list",
          "placement": "bottom",
          "showLegend": true
        },
        "tooltip": {
          "mode": "multi",
          "sort": "desc"
        }
      },
      "targets": [
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "histogram_quantile(0.99, sum by (le, operation) (rate(zkq_zookeeper_request_duration_seconds_bucket{job=~\"$job\",namespace=~\"$namespace\"}[$__rate_interval])))",
          "legendFormat": "{{ "{{" }}operation{{ "}}" }}",
          "refId": "A"
        }
      ]
    },
    {
      "type": "timeseries",
      "title": "Sessions lost and reconnects",
      "description": "Session expirations (locks lost, leased messages redelivered; alert ZkqZookeeperSessionLost) and reconnections to the same session.",
      "id": 23,
      "datasource": {
        "type": "prometheus",
        "uid": "${datasource}"
      },
      "gridPos": {
        "h": 8,
        "w": 12,
        "x": 0,
        "y": 67
      },
      "fieldConfig": {
        "defaults": {
          "unit": "short",
          "custom": {
            "drawStyle": "bars",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": true
          },
          "min": 0
        },
        "overrides": []
      },
      "options": {
        "legend": {
          "displayMode": "list",
          "placement": "bottom",
          "showLegend": true
        },
        "tooltip": {
          "mode": "multi",
          "sort": "desc"
        }
      },
      "targets": [
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "sum(increase(zkq_zookeeper_session_expirations_total{job=~\"$job\",namespace=~\"$namespace\"}[$__rate_interval]))",
          "legendFormat": "sessions lost",
          "refId": "A"
        },
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "sum(increase(zkq_zookeeper_reconnects_total{job=~\"$job\",namespace=~\"$namespace\"}[$__rate_interval]))",
          "legendFormat": "reconnects",
          "refId": "B"
        }
      ]
    },
    {
      "type": "timeseries",
      "title": "Background task restarts",
      "description": "Background tasks restarted after a panic or an unexpected end; anything above 0 is a bug worth reporting.",
      "id": 24,
      "datasource": {
        "type": "prometheus",
        "uid": "${datasource}"
      },
      "gridPos": {
        "h": 8,
        "w": 12,
        "x": 12,
        "y": 67
      },
      "fieldConfig": {
        "defaults": {
          "unit": "short",
          "custom": {
            "drawStyle": "bars",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": true
          },
          "min": 0
        },
        "overrides": []
      },
      "options": {
        "legend": {
          "displayMode": "list",
          "placement": "bottom",
          "showLegend": true
        },
        "tooltip": {
          "mode": "multi",
          "sort": "desc"
        }
      },
      "targets": [
        {
          "datasource": {
            "type": "prometheus",
            "uid": "${datasource}"
          },
          "expr": "sum by (task) (increase(zkq_background_task_restarts_total{job=~\"$job\",namespace=~\"$namespace\"}[$__rate_interval]))",
          "legendFormat": "{{ "{{" }}task{{ "}}" }}",
          "refId": "A"
        }
      ]
    }
  ]
}
{{- end -}}
