{{/*
The ServiceMonitor of a daemon's metrics Service (the device plugin's or the
DRA driver's): args dict "root" (the top context) and "component". It takes
metrics.serviceMonitor's interval, timeout, labels and relabelings, and adds
the label node from the scraped pod's node, before the user's relabelings.
*/}}
{{- define "nri-vgpu.daemonServiceMonitor" -}}
{{- $root := .root -}}
{{- $sm := $root.Values.metrics.serviceMonitor }}
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: {{ include "nri-vgpu.fullname" $root }}-{{ .component }}
  namespace: {{ include "nri-vgpu.namespace" $root }}
  labels:
    {{- include "nri-vgpu.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
    {{- with $sm.additionalLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  selector:
    matchLabels:
      {{- include "nri-vgpu.selectorLabels" (dict "root" $root "component" .component) | nindent 6 }}
  namespaceSelector:
    matchNames:
      - {{ include "nri-vgpu.namespace" $root }}
  endpoints:
    - port: metrics
      path: /metrics
      {{- with $sm.interval }}
      interval: {{ . }}
      {{- end }}
      {{- with $sm.scrapeTimeout }}
      scrapeTimeout: {{ . }}
      {{- end }}
      relabelings:
        # The node the series come from (docs/metrics.md: no series of the
        # daemons carries it).
        - sourceLabels: [__meta_kubernetes_pod_node_name]
          targetLabel: node
          action: replace
        {{- with $sm.relabelings }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with $sm.metricRelabelings }}
      metricRelabelings:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end }}
