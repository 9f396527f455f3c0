{{/* Name of the chart, or nameOverride. */}}
{{- define "nri-vgpu.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-qualified name; the release name alone when it already contains the chart name. */}}
{{- define "nri-vgpu.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "nri-vgpu.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "nri-vgpu.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "nri-vgpu.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "nri-vgpu.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component (device-plugin or nri-plugin). */}}
{{- define "nri-vgpu.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nri-vgpu.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "nri-vgpu.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Namespace of every object: namespaceOverride, else the release's. */}}
{{- define "nri-vgpu.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The ServiceAccount the pods run as. */}}
{{- define "nri-vgpu.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "nri-vgpu.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
Pod labels of one component: its selector labels, then podLabels.
Called with (dict "root" $ "component" "device-plugin").
*/}}
{{- define "nri-vgpu.podLabels" -}}
{{ include "nri-vgpu.selectorLabels" . }}
{{- with .root.Values.podLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
The DaemonSet's updateStrategy: the component's, else the global one.
Called with (dict "root" $ "values" .Values.devicePlugin).
*/}}
{{- define "nri-vgpu.updateStrategy" -}}
{{- toYaml (.values.updateStrategy | default .root.Values.updateStrategy) -}}
{{- end -}}

{{/*
Pod settings both DaemonSets share; placement is the component's when set,
else the global value. Called with (dict "root" $ "values" .Values.devicePlugin).
*/}}
{{- define "nri-vgpu.podCommon" -}}
{{- $root := .root -}}
serviceAccountName: {{ include "nri-vgpu.serviceAccountName" $root }}
automountServiceAccountToken: {{ $root.Values.serviceAccount.automountServiceAccountToken }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .values.nodeSelector | default $root.Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity | default $root.Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations | default $root.Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
