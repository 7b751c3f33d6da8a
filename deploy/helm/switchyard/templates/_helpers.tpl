{{/*
Names, labels and the pieces every Switchyard pod shares.
*/}}

{{- define "switchyard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name: <release>-<chart>, or the release name alone when it already holds the chart's
name; truncated to 63 characters less room for a component suffix.
*/}}
{{- define "switchyard.fullname" -}}
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

{{- define "switchyard.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "switchyard.labels" -}}
helm.sh/chart: {{ include "switchyard.chart" . }}
{{ include "switchyard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: switchyard
{{- end }}

{{- define "switchyard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "switchyard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of one component: (dict "ctx" $ "component" "web"). */}}
{{- define "switchyard.componentLabels" -}}
{{ include "switchyard.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "switchyard.componentSelectorLabels" -}}
{{ include "switchyard.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "switchyard.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "switchyard.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "switchyard.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The Secret the credentials are read from: existingSecret, or the chart's own. */}}
{{- define "switchyard.secretName" -}}
{{- default (include "switchyard.fullname" .) .Values.existingSecret }}
{{- end }}

{{- define "switchyard.collectorHost" -}}
{{- default (printf "%s-collector.%s.svc" (include "switchyard.fullname" .) .Release.Namespace) .Values.collector.advertisedHost }}
{{- end }}

{{/* Host names Django answers to: the probes', the pod's own address, the Ingress hosts and
config.allowedHosts. POD_IP is expanded by the kubelet from the variable before it. */}}
{{- define "switchyard.allowedHosts" -}}
{{- $hosts := list "localhost" "127.0.0.1" "$(POD_IP)" }}
{{- if .Values.ingress.enabled }}
{{- range .Values.ingress.hosts }}
{{- $hosts = append $hosts .host }}
{{- end }}
{{- end }}
{{- $hosts = concat $hosts .Values.config.allowedHosts }}
{{- join "," (uniq $hosts) }}
{{- end }}

{{/* The non-secret settings, the ConfigMap's data. */}}
{{- define "switchyard.configData" -}}
SWITCHYARD_PRODUCTION: "true"
SWITCHYARD_CSRF_TRUSTED_ORIGINS: {{ join "," .Values.config.csrfTrustedOrigins | quote }}
SWITCHYARD_SSL_REDIRECT: {{ .Values.config.sslRedirect | toString | quote }}
SWITCHYARD_TRUST_PROXY_HEADERS: {{ .Values.config.trustProxyHeaders | toString | quote }}
SWITCHYARD_SECURE_COOKIES: {{ .Values.config.secureCookies | toString | quote }}
SWITCHYARD_LOG_LEVEL: {{ .Values.config.logLevel | quote }}
SWITCHYARD_LOG_FORMAT: {{ .Values.config.logFormat | quote }}
SWITCHYARD_DB_CONN_MAX_AGE: {{ .Values.config.dbConnMaxAge | toString | quote }}
SWITCHYARD_SHARDS: {{ .Values.config.shards | toString | quote }}
SWITCHYARD_ROUTE_PORTS: {{ .Values.config.routePorts | quote }}
SWITCHYARD_COLLECTOR_HOST: {{ include "switchyard.collectorHost" . | quote }}
SWITCHYARD_COLLECTOR_PORT: {{ .Values.collector.port | toString | quote }}
SWITCHYARD_S3_ENDPOINT_URL: {{ .Values.config.s3EndpointUrl | quote }}
SWITCHYARD_S3_REGION: {{ .Values.config.s3Region | quote }}
SWITCHYARD_PROMETHEUS_URL: {{ .Values.config.prometheusUrl | quote }}
{{- with .Values.metrics.allowNets }}
SWITCHYARD_METRICS_ALLOW_NETS: {{ join "," . | quote }}
{{- end }}
{{- range $name, $value := .Values.config.extra }}
{{ $name }}: {{ $value | toString | quote }}
{{- end }}
{{- end }}

{{/* The chart's own Secret's data, when there is no existingSecret. */}}
{{- define "switchyard.secretData" -}}
SECRET_KEY: {{ required "secretKey is required (or existingSecret)" .Values.secretKey | b64enc | quote }}
DATABASE_URL: {{ required "database.url is required (or existingSecret)" .Values.database.url | b64enc | quote }}
REDIS_URL: {{ required "redis.url is required (or existingSecret)" .Values.redis.url | b64enc | quote }}
{{- with .Values.metrics.token }}
SWITCHYARD_METRICS_TOKEN: {{ . | b64enc | quote }}
{{- end }}
{{- with .Values.s3.accessKeyId }}
SWITCHYARD_S3_ACCESS_KEY_ID: {{ . | b64enc | quote }}
{{- end }}
{{- with .Values.s3.secretAccessKey }}
SWITCHYARD_S3_SECRET_ACCESS_KEY: {{ . | b64enc | quote }}
{{- end }}
{{- end }}

{{/* One variable read from the credentials Secret: (dict "ctx" $ "env" NAME "key" KEY
"optional" bool). */}}
{{- define "switchyard.secretEnv" -}}
- name: {{ .env }}
  valueFrom:
    secretKeyRef:
      name: {{ .secret }}
      key: {{ .key }}
      {{- if .optional }}
      optional: true
      {{- end }}
{{- end }}

{{/* Environment of every Switchyard container: (dict "ctx" $ "secret" NAME "configMap" NAME);
the migration hook passes its own copies' names. */}}
{{- define "switchyard.env" -}}
{{- $ctx := .ctx }}
{{- $keys := $ctx.Values.existingSecretKeys }}
{{- $own := not $ctx.Values.existingSecret -}}
envFrom:
  - configMapRef:
      name: {{ .configMap }}
env:
  - name: POD_IP
    valueFrom:
      fieldRef:
        fieldPath: status.podIP
  - name: SWITCHYARD_ALLOWED_HOSTS
    value: {{ include "switchyard.allowedHosts" $ctx | quote }}
  {{- include "switchyard.secretEnv" (dict "env" "SECRET_KEY" "secret" .secret "key" (ternary "SECRET_KEY" $keys.secretKey $own)) | nindent 2 }}
  {{- include "switchyard.secretEnv" (dict "env" "DATABASE_URL" "secret" .secret "key" (ternary "DATABASE_URL" $keys.databaseUrl $own)) | nindent 2 }}
  {{- include "switchyard.secretEnv" (dict "env" "REDIS_URL" "secret" .secret "key" (ternary "REDIS_URL" $keys.redisUrl $own)) | nindent 2 }}
  {{- if or (not $own) $ctx.Values.metrics.token }}
  {{- include "switchyard.secretEnv" (dict "env" "SWITCHYARD_METRICS_TOKEN" "secret" .secret "key" (ternary "SWITCHYARD_METRICS_TOKEN" $keys.metricsToken $own) "optional" true) | nindent 2 }}
  {{- end }}
  {{- if or (not $own) $ctx.Values.s3.accessKeyId }}
  {{- include "switchyard.secretEnv" (dict "env" "SWITCHYARD_S3_ACCESS_KEY_ID" "secret" .secret "key" (ternary "SWITCHYARD_S3_ACCESS_KEY_ID" $keys.s3AccessKeyId $own) "optional" true) | nindent 2 }}
  {{- end }}
  {{- if or (not $own) $ctx.Values.s3.secretAccessKey }}
  {{- include "switchyard.secretEnv" (dict "env" "SWITCHYARD_S3_SECRET_ACCESS_KEY" "secret" .secret "key" (ternary "SWITCHYARD_S3_SECRET_ACCESS_KEY" $keys.s3SecretAccessKey $own) "optional" true) | nindent 2 }}
  {{- end }}
  {{- with $ctx.Values.extraEnv }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/* Writable folders under a read-only root: /tmp and the data folder. */}}
{{- define "switchyard.volumeMounts" -}}
volumeMounts:
  - name: tmp
    mountPath: /tmp
  - name: data
    mountPath: /srv/switchyard/data
  {{- with .Values.extraVolumeMounts }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/* The pod's volumes: (dict "ctx" $ "dataSizeLimit" "1Gi"). */}}
{{- define "switchyard.volumes" -}}
volumes:
  - name: tmp
    emptyDir:
      sizeLimit: 1Gi
  - name: data
    emptyDir:
      sizeLimit: {{ .dataSizeLimit | default "1Gi" }}
  {{- with .ctx.Values.extraVolumes }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/* What every pod spec shares: account, pull secrets, security context. */}}
{{- define "switchyard.podCommon" -}}
serviceAccountName: {{ include "switchyard.serviceAccountName" . }}
automountServiceAccountToken: {{ .Values.serviceAccount.automountToken }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end }}

{{/* A pod template's annotations: the settings' checksums roll the pods when they change. */}}
{{- define "switchyard.podAnnotations" -}}
checksum/config: {{ include "switchyard.configData" .ctx | sha256sum }}
{{- if not .ctx.Values.existingSecret }}
checksum/secret: {{ include "switchyard.secretData" .ctx | sha256sum }}
{{- end }}
{{- with .extra }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Scheduling of one component: its values (nodeSelector, tolerations, affinity, spread). */}}
{{- define "switchyard.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
