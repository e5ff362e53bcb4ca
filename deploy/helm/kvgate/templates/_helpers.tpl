{{- define "kvgate.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kvgate.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvgate.labels" -}}
{{ include "kvgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kvgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kvgate.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kvgate.keysSecret" -}}
{{- default (printf "%s-keys" (include "kvgate.fullname" .)) .Values.keys.existingSecret -}}
{{- end -}}

{{- define "kvgate.syncKeySecret" -}}
{{- default (printf "%s-sync-key" (include "kvgate.fullname" .)) .Values.replicaSync.keySecret -}}
{{- end -}}
