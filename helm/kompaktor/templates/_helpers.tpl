{{/* Chart name, truncated to 63 characters. */}}
{{- define "kompaktor.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart unless the release name already holds the chart name. */}}
{{- define "kompaktor.fullname" -}}
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

{{- define "kompaktor.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kompaktor.labels" -}}
helm.sh/chart: {{ include "kompaktor.chart" . }}
{{ include "kompaktor.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kompaktor
{{- end }}

{{- define "kompaktor.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kompaktor.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kompaktor.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (printf "%s-operator" (include "kompaktor.fullname" .)) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* An image reference: repository:tag, pinned to its digest when one is given
(repository:tag@sha256:…). The digest is what makes a rebuilt image with the same tag roll: the
reference changes, so the pod template does, and every node runs that exact image rather than
whatever it cached under the tag (docs/upgrading.md, "The same release, rebuilt"). */}}
{{- define "kompaktor.image" -}}
{{- printf "%s:%s" .image.repository .tag }}
{{- with .image.digest }}@{{ . }}{{ end }}
{{- end }}

{{- define "kompaktor.operatorImage" -}}
{{- include "kompaktor.image" (dict "image" .Values.operator.image "tag" (default .Chart.AppVersion .Values.operator.image.tag)) }}
{{- end }}

{{- define "kompaktor.compactorImage" -}}
{{- include "kompaktor.image" (dict "image" .Values.compactor.image "tag" (default .Chart.AppVersion .Values.compactor.image.tag)) }}
{{- end }}

{{- define "kompaktor.redisImage" -}}
{{- include "kompaktor.image" (dict "image" .Values.redis.image "tag" (default .Chart.AppVersion .Values.redis.image.tag)) }}
{{- end }}

{{/* The Secret holding the Redis URL, and its key. */}}
{{- define "kompaktor.redisSecret" -}}
{{- if and (not .Values.redis.bundled) .Values.redis.external.existingSecret }}
{{- .Values.redis.external.existingSecret }}
{{- else if and .Values.redis.bundled .Values.redis.existingSecret }}
{{- .Values.redis.existingSecret }}
{{- else }}
{{- printf "%s-redis" (include "kompaktor.fullname" .) }}
{{- end }}
{{- end }}

{{- define "kompaktor.redisSecretKey" -}}
{{- if and (not .Values.redis.bundled) .Values.redis.external.existingSecret }}
{{- .Values.redis.external.existingSecretKey }}
{{- else }}url{{- end }}
{{- end }}

{{/* Redis users per role (compactor, coordinator, operator, admin; rights in files/redis-users.acl,
     generated from kompaktor.metadata.acl): with the bundled Redis whose passwords the chart manages.
     Each role's URL is in its own Secret; with redis.existingSecret or an external Redis every
     component uses the one URL (docs/kubernetes.md says how to give an external Redis the users). */}}
{{/* The roles (the first word of each line of files/redis-users.acl), as a JSON list. */}}
{{- define "kompaktor.redisRoles" -}}
{{- $roles := list }}
{{- range $line := .Files.Get "files/redis-users.acl" | trim | splitList "\n" }}
{{- $roles = append $roles (first (splitList " " $line)) }}
{{- end }}
{{- toJson $roles }}
{{- end }}

{{- define "kompaktor.redisUsers" -}}
{{- if and .Values.redis.bundled (not .Values.redis.existingSecret) }}true{{- end }}
{{- end }}

{{/* The Secret and key holding a role's Redis URL; call with (dict "root" $ "role" "compactor"). */}}
{{- define "kompaktor.redisRoleSecret" -}}
{{- if include "kompaktor.redisUsers" .root }}
{{- printf "%s-redis-%s" (include "kompaktor.fullname" .root) .role }}
{{- else }}
{{- include "kompaktor.redisSecret" .root }}
{{- end }}
{{- end }}

{{- define "kompaktor.redisRoleSecretKey" -}}
{{- if include "kompaktor.redisUsers" .root }}url{{- else }}{{ include "kompaktor.redisSecretKey" .root }}{{- end }}
{{- end }}

{{- define "kompaktor.redisHost" -}}
{{- printf "%s-redis.%s.svc" (include "kompaktor.fullname" .) .Release.Namespace }}
{{- end }}

{{/* The compactor pods' ServiceAccount (no API rights, no token mounted). */}}
{{- define "kompaktor.compactorServiceAccount" -}}
{{- printf "%s-compactor" (include "kompaktor.fullname" .) }}
{{- end }}

{{/* The Secret (key `token`) whose value authorizes POST /drain from outside a compactor pod. */}}
{{- define "kompaktor.groupKeySecret" -}}
{{- printf "%s-group-key" (include "kompaktor.fullname" .) }}
{{- end }}

{{- define "kompaktor.drainTokenSecret" -}}
{{- default (printf "%s-drain-token" (include "kompaktor.fullname" .)) .Values.drain.existingSecret }}
{{- end }}

{{/* Namespaces that hold compactor pods the chart knows of: the release's and the watched ones. */}}
{{- define "kompaktor.compactorNamespaces" -}}
{{- toJson (uniq (prepend .Values.operator.watchNamespaces .Release.Namespace)) }}
{{- end }}

{{/* Labels of the operator pod (its NetworkPolicy identity). */}}
{{- define "kompaktor.operatorPodLabels" -}}
{{ include "kompaktor.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Where clients find the bundled Redis' CA (rediss:// with TLS on). */}}
{{- define "kompaktor.redisCaDir" -}}/etc/kompaktor/redis-tls{{- end }}
{{- define "kompaktor.redisTlsSecret" -}}
{{- default (printf "%s-redis-tls" (include "kompaktor.fullname" .)) .Values.redis.tls.existingSecret }}
{{- end }}
{{- define "kompaktor.redisTls" -}}
{{- if and .Values.redis.bundled .Values.redis.tls.enabled }}true{{- end }}
{{- end }}
{{- define "kompaktor.redisCaConfigMap" -}}
{{- printf "%s-redis-ca" (include "kompaktor.fullname" .) }}
{{- end }}
