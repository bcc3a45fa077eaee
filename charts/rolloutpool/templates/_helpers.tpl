{{/* Names, labels and shared fragments of the rolloutpool chart. */}}

{{- define "rolloutpool.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Object-name prefix: the release name, suffixed with the chart name unless it already holds it. */}}
{{- define "rolloutpool.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "rolloutpool.operatorName" -}}
{{- printf "%s-operator" (include "rolloutpool.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rolloutpool.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels of the operator pod. `app.kubernetes.io/component: operator` keeps the selector
disjoint from the engine and router pods the operator creates (they carry
app.kubernetes.io/name=rolloutpool too, with app.kubernetes.io/instance=<pool name>).
*/}}
{{- define "rolloutpool.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rolloutpool.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels of every object the chart renders. */}}
{{- define "rolloutpool.labels" -}}
helm.sh/chart: {{ include "rolloutpool.chart" . }}
app.kubernetes.io/name: {{ include "rolloutpool.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rolloutpool
{{- end }}

{{- define "rolloutpool.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rolloutpool.operatorName" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image the operator runs and hands to engines and routers (ROLLOUTPOOL_IMAGE). */}}
{{- define "rolloutpool.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Watched namespaces (scope `namespaces`) as a JSON list; empty means the release namespace. */}}
{{- define "rolloutpool.watchNamespaces" -}}
{{- if .Values.watch.namespaces }}
{{- .Values.watch.namespaces | uniq | toJson }}
{{- else }}
{{- list .Release.Namespace | toJson }}
{{- end }}
{{- end }}

{{/*
The operator's rules, shared by the ClusterRole (scope `cluster`) and each Role (scope
`namespaces`). Exactly the agreed list (notes/interfaces.md): no wildcards, no configmaps,
and secrets `create` only: the operator makes each pool's router admin token
(`<pool>-router-admin`) and never reads, lists or changes a Secret. It holds every permission
it grants the routers (pods and rolloutpools get/list/watch), which RBAC requires of whoever
creates a Role.
*/}}
{{- define "rolloutpool.operatorRules" -}}
- apiGroups: ["rolloutpool.io"]
  resources: ["rolloutpools"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["rolloutpool.io"]
  resources: ["rolloutpools/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
- apiGroups: [""]
  resources: ["services", "serviceaccounts"]
  verbs: ["create", "get", "list", "watch", "patch", "delete"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["create", "get", "list", "watch", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["create", "get", "list", "watch", "patch", "delete"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{/* Namespace selector of the monitors: every namespace, or the watched ones. */}}
{{- define "rolloutpool.monitorNamespaceSelector" -}}
{{- if eq .Values.watch.scope "cluster" }}
any: true
{{- else }}
matchNames:
{{- range (include "rolloutpool.watchNamespaces" . | fromJsonArray) }}
  - {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}
