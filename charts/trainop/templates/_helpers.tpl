{{/*
Names and labels shared by every template. The RBAC rules live in _rbac.tpl, apart from everything that
reads .Values, so that the permissions the operator gets are one values-independent list.
*/}}

{{- define "trainop.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name; truncated at 52 so that "-operator-cluster" style suffixes stay within 63.
*/}}
{{- define "trainop.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "trainop.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "trainop.labels" -}}
helm.sh/chart: {{ include "trainop.chart" . }}
{{ include "trainop.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: trainop
{{- end }}

{{- define "trainop.selectorLabels" -}}
app.kubernetes.io/name: {{ include "trainop.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "trainop.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "trainop.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "trainop.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/*
Namespaces that get a NetworkPolicy for training pods: networkPolicy.namespaces, else the watched
namespaces, else the release namespace. Returned as a JSON list (templates cannot return lists).
*/}}
{{- define "trainop.networkPolicyNamespaces" -}}
{{- $namespaces := .Values.networkPolicy.namespaces }}
{{- if not $namespaces }}{{ $namespaces = .Values.watchNamespaces }}{{ end }}
{{- if not $namespaces }}{{ $namespaces = list .Release.Namespace }}{{ end }}
{{- toJson (uniq $namespaces) }}
{{- end }}

{{/*
Labels every pod the operator creates carries (the operator sets them; NetworkPolicy and PodMonitor
select on them).
*/}}
{{- define "trainop.trainingPodSelector" -}}
app.kubernetes.io/managed-by: trainop
{{- end }}
