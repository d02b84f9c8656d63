{{/* Names and labels shared by every object of the chart. */}}

{{- define "kuberl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* <release>-<name>, or the release name alone when it already contains the chart name. */}}
{{- define "kuberl.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kuberl.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Selector labels of the operator pod. The component label keeps them apart from the job pods, which also
carry app.kubernetes.io/name=kuberl (and app.kubernetes.io/instance=<job>, which may equal the release).
*/}}
{{- define "kuberl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kuberl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "kuberl.labels" -}}
helm.sh/chart: {{ include "kuberl.chart" . }}
{{ include "kuberl.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kuberl
{{- end -}}

{{- define "kuberl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kuberl.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
The operator image: <registry>/<repository>:<tag>. A repository whose first part is a registry host (it has a
"." or ":", or is localhost, as image references tell them) already names the whole image.
*/}}
{{- define "kuberl.image" -}}
{{- $repository := .Values.image.repository -}}
{{- $first := first (splitList "/" $repository) -}}
{{- $hasHost := and (contains "/" $repository) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $registry := trimSuffix "/" (.Values.image.registry | default "") -}}
{{- $name := ternary $repository (printf "%s/%s" $registry $repository) (or $hasHost (not $registry)) -}}
{{- printf "%s:%s" $name (include "kuberl.imageTag" .) -}}
{{- end -}}

{{- define "kuberl.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag -}}
{{- end -}}

{{/* jobDefaults.imagePullSecrets as the operator reads them: names separated by commas. */}}
{{- define "kuberl.jobPullSecrets" -}}
{{- $names := list -}}
{{- range .Values.jobDefaults.imagePullSecrets }}{{ $names = append $names .name }}{{ end -}}
{{- join "," $names -}}
{{- end -}}

{{/* The job images' prefix: jobDefaults.imageRegistry, else the operator image's registry. */}}
{{- define "kuberl.jobImageRegistry" -}}
{{- trimSuffix "/" (default (.Values.image.registry | default "") .Values.jobDefaults.imageRegistry) -}}
{{- end -}}

{{/* The job images' tag: jobDefaults.imageTag, else the operator image's. */}}
{{- define "kuberl.jobImageTag" -}}
{{- default (include "kuberl.imageTag" .) .Values.jobDefaults.imageTag -}}
{{- end -}}

{{/*
The operator's rules on namespaced resources: a ClusterRole when it serves every namespace, a Role in each
watched namespace otherwise. Exactly what kuberl_operator does; no wildcards (tests/charts checks both).
*/}}
{{- define "kuberl.namespacedRules" -}}
# RLJobs: kopf watches them, keeps its bookkeeping in annotations and adds its finalizer (patch, update).
- apiGroups: ["kuberl.io"]
  resources: ["rljobs"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["kuberl.io"]
  resources: ["rljobs/status"]
  verbs: ["get", "patch", "update"]
# Setting blockOwnerDeletion on children needs update on the owner's finalizers
# (the OwnerReferencesPermissionEnforcement admission plugin).
- apiGroups: ["kuberl.io"]
  resources: ["rljobs/finalizers"]
  verbs: ["update"]
# Pods come from one watch (observation); failed and preempted pods are deleted to restart them.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "delete"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
# The job's children, created by name, merge-patched and deleted by name: no list or watch needed.
- apiGroups: [""]
  resources: ["configmaps", "secrets", "services", "serviceaccounts"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "create", "patch", "delete"]
# Deployments: the default sandbox pool by name; a job's per-image sandbox pools are listed by its labels.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "create", "patch", "delete"]
# Per-image sandbox pools on agent-sandbox (spec.sandbox.pools.engine: agent-sandbox, or auto where it is
# installed): a SandboxTemplate and a SandboxWarmPool per image, listed by the job's labels.
- apiGroups: ["extensions.agents.x-k8s.io"]
  resources: ["sandboxtemplates", "sandboxwarmpools"]
  verbs: ["get", "list", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "create", "patch", "delete"]
# Each job's learner Role grants get on its RLJob, get/patch on its rljobs/status and get on its ConfigMap.
# Kubernetes' escalation check lets a subject create a Role (and bind it) only if it holds every permission
# in it already; the rules above grant those, so no `escalate` or `bind` verb is needed (or granted).
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "create", "patch", "delete"]
# For jobs with spec.sandbox.autoscaler: hpa.
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "create", "patch", "delete"]
{{- if .Values.kueue.enabled }}
# Kueue admission: one Workload per job.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["get"]
{{- end }}
{{- end -}}

{{/* Cluster-scoped reads: a ClusterRole in both RBAC modes. */}}
{{- define "kuberl.clusterRules" -}}
# kopf scans CustomResourceDefinitions to resolve the RLJob resource.
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
{{- if not .Values.watchNamespaces }}
# Serving every namespace, kopf lists and watches namespaces.
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end }}
{{- if .Values.rbac.nodes }}
# The node index: spot labels (GPU-hours on spot) and preemption-notice taints.
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get", "list", "watch"]
{{- end }}
{{- end -}}

{{/* The job pods' labels, as the operator sets them (kuberl_operator.meta), made the target labels
`rljob` (not `job`: Prometheus keeps that for the scrape job) and `tier`, as in the job metrics. */}}
{{- define "kuberl.podMonitorRelabelings" -}}
- sourceLabels: [__meta_kubernetes_pod_label_kuberl_io_job]
  targetLabel: rljob
- sourceLabels: [__meta_kubernetes_pod_label_kuberl_io_tier]
  targetLabel: tier
{{- end -}}
