{{/* Names ------------------------------------------------------------------------------ */}}

{{- define "cronwell.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* "<release>-cronwell", or the release name when it already contains the chart name. */}}
{{- define "cronwell.fullname" -}}
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

{{/* Component names: <fullname>-<component>, within 63 characters. Call with (list $ "x"). */}}
{{- define "cronwell.componentName" -}}
{{- $root := index . 0 }}
{{- printf "%s-%s" (include "cronwell.fullname" $root | trunc 40 | trimSuffix "-") (index . 1) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "cronwell.workerName" -}}
{{- include "cronwell.componentName" (list (index . 0) (printf "worker-%s" (index . 1))) }}
{{- end }}

{{- define "cronwell.leaseName" -}}
{{- include "cronwell.componentName" (list . "operator") }}
{{- end }}

{{- define "cronwell.webhookServiceName" -}}
{{- include "cronwell.componentName" (list . "webhook") }}
{{- end }}

{{- define "cronwell.webhookSecretName" -}}
{{- include "cronwell.componentName" (list . "webhook-tls") }}
{{- end }}

{{/* Labels ------------------------------------------------------------------------------ */}}

{{- define "cronwell.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cronwell.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "cronwell.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "cronwell.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: cronwell
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels of one component. Call with (list $ "scheduler"). */}}
{{- define "cronwell.componentLabels" -}}
{{ include "cronwell.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "cronwell.componentSelectorLabels" -}}
{{ include "cronwell.selectorLabels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/* Worker pools ------------------------------------------------------------------------- */}}

{{/* "true" when this render creates the WorkerPool objects: wanted
(worker.createWorkerPoolObjects) and served by the cluster. On a fresh install the
WorkerPool CRD is a template of this same release, not served yet, and Helm cannot map a
kind the cluster does not know: the objects are skipped then (NOTES.txt says how to add
them) instead of failing the install. The worker Deployments leave `replicas` to the
operator exactly when this is "true", so a pool is never left without a replica count. */}}
{{- define "cronwell.workerPoolObjects" -}}
{{- if and .Values.worker.createWorkerPoolObjects (.Capabilities.APIVersions.Has "cronwell.dev/v1alpha1/WorkerPool") }}true{{ end }}
{{- end }}

{{/* Image -------------------------------------------------------------------------------- */}}

{{/* repository@digest, or repository:tag (default: appVersion). Call with
(dict "root" $ "image" $override): an override with a repository replaces the whole image
(a handler image built FROM cronwell's), otherwise .Values.image is used. */}}
{{- define "cronwell.image" -}}
{{- $img := .root.Values.image }}
{{- if and .image .image.repository }}
{{- $img = .image }}
{{- end }}
{{- if $img.digest }}
{{- printf "%s@%s" $img.repository $img.digest }}
{{- else }}
{{- printf "%s:%s" $img.repository (toString (default .root.Chart.AppVersion $img.tag)) }}
{{- end }}
{{- end }}

{{/* Database access: required Secret, mounted as a file ------------------------------- */}}

{{- define "cronwell.databaseSecret" -}}
{{- required "database.existingSecret is required: the name of a Secret in the release namespace holding the PostgreSQL URL (see docs/deploy.md)" .Values.database.existingSecret }}
{{- end }}

{{/* Environment shared by every cronwell container. */}}
{{- define "cronwell.env" -}}
- name: CRONWELL_DATABASE_URL_FILE
  value: /etc/cronwell/database/{{ .Values.database.secretKey }}
- name: PGSSLMODE
  value: {{ .Values.database.sslmode | quote }}
{{- if has .Values.database.sslmode (list "verify-ca" "verify-full") }}
- name: PGSSLROOTCERT
  value: {{ if .Values.database.sslRootCert.existingSecret }}/etc/cronwell/database-ca/{{ .Values.database.sslRootCert.key }}{{ else }}system{{ end }}
{{- end }}
- name: CRONWELL_PARTITIONS
  value: {{ .Values.config.partitions | quote }}
- name: CRONWELL_LOG_LEVEL
  value: {{ .Values.config.logLevel | quote }}
- name: CRONWELL_LOG_FORMAT
  value: {{ .Values.config.logFormat | quote }}
- name: CRONWELL_METRICS_PORT
  value: {{ .Values.metrics.port | quote }}
- name: HOME
  value: /tmp
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- with .Values.config.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "cronwell.volumeMounts" -}}
- name: database
  mountPath: /etc/cronwell/database
  readOnly: true
{{- if and .Values.database.sslRootCert.existingSecret (has .Values.database.sslmode (list "verify-ca" "verify-full")) }}
- name: database-ca
  mountPath: /etc/cronwell/database-ca
  readOnly: true
{{- end }}
- name: tmp
  mountPath: /tmp
{{- end }}

{{- define "cronwell.volumes" -}}
- name: database
  secret:
    secretName: {{ include "cronwell.databaseSecret" . }}
    defaultMode: 0440
    items:
      - key: {{ .Values.database.secretKey }}
        path: {{ .Values.database.secretKey }}
{{- if and .Values.database.sslRootCert.existingSecret (has .Values.database.sslmode (list "verify-ca" "verify-full")) }}
- name: database-ca
  secret:
    secretName: {{ .Values.database.sslRootCert.existingSecret }}
    defaultMode: 0444
    items:
      - key: {{ .Values.database.sslRootCert.key }}
        path: {{ .Values.database.sslRootCert.key }}
{{- end }}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.config.tmpSizeLimit }}
{{- end }}

{{/* Pod-level settings common to every pod. */}}
{{- define "cronwell.podCommon" -}}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "cronwell.metricsPort" -}}
- name: metrics
  containerPort: {{ .Values.metrics.port }}
  protocol: TCP
{{- end }}

{{/* Webhook TLS (Helm-generated) --------------------------------------------------------
A CA and a serving certificate for the webhook Service, as YAML {ca.crt, tls.crt, tls.key}
(base64). Reuses the existing Secret's when there is one (`helm upgrade` keeps the
certificate); generated once per render and cached, so the Secret, the caBundle and the
pods' checksum all see the same one. */}}
{{- define "cronwell.webhookCert" -}}
{{- $cache := .Values.operator.webhook }}
{{- if not (hasKey $cache "_generated") }}
{{- $secret := lookup "v1" "Secret" .Release.Namespace (include "cronwell.webhookSecretName" .) }}
{{- if and $secret $secret.data (hasKey $secret.data "ca.crt") (hasKey $secret.data "tls.crt") (hasKey $secret.data "tls.key") }}
{{- $_ := set $cache "_generated" (dict "ca.crt" (index $secret.data "ca.crt") "tls.crt" (index $secret.data "tls.crt") "tls.key" (index $secret.data "tls.key")) }}
{{- else }}
{{- $svc := include "cronwell.webhookServiceName" . }}
{{- $ns := .Release.Namespace }}
{{- $days := int .Values.operator.webhook.generatedCertDays }}
{{- $ca := genCA (printf "%s-ca" $svc) $days }}
{{- $dns := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) }}
{{- $cert := genSignedCert (printf "%s.%s.svc" $svc $ns) nil $dns $days $ca }}
{{- $_ := set $cache "_generated" (dict "ca.crt" ($ca.Cert | b64enc) "tls.crt" ($cert.Cert | b64enc) "tls.key" ($cert.Key | b64enc)) }}
{{- end }}
{{- end }}
{{- toYaml (get $cache "_generated") }}
{{- end }}

{{/* Tenant safety, for the operator and the workers: the egress policy (checked at
admission and at connect time) and the key of Secret-backed header values (a file). */}}
{{- define "cronwell.tenancyEnv" -}}
- name: CRONWELL_EGRESS_ALLOW_CIDRS
  value: {{ join "," .Values.egress.allowCidrs | quote }}
- name: CRONWELL_EGRESS_ALLOW_HOSTS
  value: {{ join "," .Values.egress.allowHosts | quote }}
- name: CRONWELL_EGRESS_DENY_CIDRS
  value: {{ join "," (concat .Values.egress.denyCidrs .Values.egress.apiServerCidrs) | quote }}
- name: CRONWELL_EGRESS_DENY_HOSTS
  value: {{ join "," .Values.egress.denyHosts | quote }}
{{- if .Values.operator.enabled }}
- name: CRONWELL_SECRETS_KEY_FILE
  value: /etc/cronwell/secrets-key/{{ .Values.secretsKey.key }}
{{- end }}
{{- end }}

{{- define "cronwell.secretsKeySecretName" -}}
{{- .Values.secretsKey.existingSecret | default (printf "%s-secrets-key" (include "cronwell.fullname" .)) }}
{{- end }}

{{- define "cronwell.secretsKeyMount" -}}
{{- if .Values.operator.enabled }}
- name: secrets-key
  mountPath: /etc/cronwell/secrets-key
  readOnly: true
{{- end }}
{{- end }}

{{- define "cronwell.secretsKeyVolume" -}}
{{- if .Values.operator.enabled }}
- name: secrets-key
  secret:
    secretName: {{ include "cronwell.secretsKeySecretName" . }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{/* The read replica (database.read): only the pods whose reads it serves (operator, ui). */}}
{{- define "cronwell.readEnv" -}}
{{- if .Values.database.read.existingSecret }}
- name: CRONWELL_DATABASE_READ_URL_FILE
  value: /etc/cronwell/database-read/{{ .Values.database.read.secretKey }}
- name: CRONWELL_DATABASE_READ_MAX_LAG_SECONDS
  value: {{ .Values.database.read.maxLagSeconds | quote }}
{{- end }}
{{- end }}

{{- define "cronwell.readMount" -}}
{{- if .Values.database.read.existingSecret }}
- name: database-read
  mountPath: /etc/cronwell/database-read
  readOnly: true
{{- end }}
{{- end }}

{{- define "cronwell.readVolume" -}}
{{- if .Values.database.read.existingSecret }}
- name: database-read
  secret:
    secretName: {{ .Values.database.read.existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ .Values.database.read.secretKey }}
        path: {{ .Values.database.read.secretKey }}
{{- end }}
{{- end }}
