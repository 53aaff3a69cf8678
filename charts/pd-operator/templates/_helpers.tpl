{{/* Names, labels and the RBAC rules, shared by the templates. */}}

{{- define "pd-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pd-operator.fullname" -}}
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

{{- define "pd-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pd-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pd-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "pd-operator.labels" -}}
helm.sh/chart: {{ include "pd-operator.chart" . }}
{{ include "pd-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: pd-operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "pd-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "pd-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "pd-operator.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{- define "pd-operator.clusterwide" -}}
{{- if not .Values.watchNamespaces }}true{{ end }}
{{- end }}

{{/*
What the operator does in each namespace it serves, and nothing more (adapters/kube.py and
handlers/operator.py): watch PDDeployments and patch their status; server-side apply (create +
patch), delete, list and watch the Deployments, LeaderWorkerSets, Services and
PodDisruptionBudgets it owns, and
each router's ServiceAccount, Role (list/watch pods: rights the operator holds, so no
escalation), RoleBinding and HorizontalPodAutoscaler, and the PDPools of mode External (and
their status); watch their pods; post
Events (the operator's and kopf's own, both POST only). No get, except on the Secrets that
spec.scaling.prometheus names (rbac.readPrometheusSecrets): every other read comes from a watch,
and Secrets are never listed or watched.
*/}}
{{- define "pd-operator.namespacedRules" -}}
- apiGroups: ["pdoperator.io"]
  resources: ["pddeployments"]
  verbs: ["list", "watch"]
- apiGroups: ["pdoperator.io"]
  resources: ["pddeployments/status"]
  verbs: ["patch"]
# Children carry blockOwnerDeletion: under OwnerReferencesPermissionEnforcement (OpenShift's
# default) setting it needs update on the owner's finalizers. The operator adds no finalizer.
- apiGroups: ["pdoperator.io"]
  resources: ["pddeployments/finalizers"]
  verbs: ["update"]
# Mode External: each role's PDPool (the /scale target of an HPA, KEDA or GitOps), created
# and deleted by the operator, which writes its status and never its spec.replicas.
- apiGroups: ["pdoperator.io"]
  resources: ["pdpools"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["pdoperator.io"]
  resources: ["pdpools/status"]
  verbs: ["patch"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# Pools whose replicas span several nodes (accelerator.nodesPerReplica > 1) run as
# LeaderWorkerSets (sigs.k8s.io/lws); replicas are applied like a Deployment's, never /scale.
- apiGroups: ["leaderworkerset.x-k8s.io"]
  resources: ["leaderworkersets"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "patch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- if .Values.rbac.readPrometheusSecrets }}
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- end }}
{{- end }}

{{/*
Cluster-scoped reads, needed in both modes: nodes (placement and capacity), CRDs (kopf notices
a CRD upgraded after the operator started); namespaces when kopf serves a list of them.
*/}}
{{- define "pd-operator.clusterRules" -}}
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list", "watch"]
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- if .Values.watchNamespaces }}
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end }}
{{- end }}
