{{/* Names and labels, as in most charts (and MetalLB's). */}}

{{- define "ferrolb.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ferrolb.fullname" -}}
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

{{- define "ferrolb.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "ferrolb.labels" -}}
helm.sh/chart: {{ include "ferrolb.chart" . }}
{{ include "ferrolb.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "ferrolb.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ferrolb.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ferrolb.controller.serviceAccountName" -}}
{{- if .Values.controller.serviceAccount.create }}
{{- default (printf "%s-controller" (include "ferrolb.fullname" .)) .Values.controller.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.controller.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "ferrolb.speaker.serviceAccountName" -}}
{{- if .Values.speaker.serviceAccount.create }}
{{- default (printf "%s-speaker" (include "ferrolb.fullname" .)) .Values.speaker.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.speaker.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "ferrolb.secretName" -}}
{{- default (printf "%s-memberlist" (include "ferrolb.fullname" .)) .Values.speaker.secretName }}
{{- end }}

{{/* image: repository, then @digest or :tag (default the appVersion). Argument: the image values and the root context. */}}
{{- define "ferrolb.image" -}}
{{- $image := index . 0 }}
{{- $root := index . 1 }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default $root.Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{/* MetalLB's log levels mapped onto ferrolb's (tracing) levels. */}}
{{- define "ferrolb.logLevel" -}}
{{- $levels := dict "all" "trace" "none" "off" }}
{{- get $levels . | default . }}
{{- end }}

{{/*
The Secret (type kubernetes.io/tls) whose tls.crt and tls.key a component serves its metrics and
health pages with, or "" for plain HTTP. MetalLB's names for it: prometheus.<component>MetricsTLSSecret
(0.15) or tls.<component>MetricsTLSSecret (0.16). Argument: list of root context and component.
*/}}
{{- define "ferrolb.metricsTLSSecret" -}}
{{- $root := index . 0 -}}
{{- $key := printf "%sMetricsTLSSecret" (index . 1) -}}
{{- $fromTLS := "" -}}
{{- with $root.Values.tls }}{{- $fromTLS = get . $key | default "" }}{{- end -}}
{{- get $root.Values.prometheus $key | default $fromTLS -}}
{{- end }}

{{/* Where the metrics TLS Secret is mounted. */}}
{{- define "ferrolb.metricsTLSPath" -}}
/etc/ferrolb/metrics-tls
{{- end }}

{{/* An HTTP probe from a values block: enabled, thresholds and timings. Argument: list of probe values, path and scheme. */}}
{{- define "ferrolb.probe" -}}
{{- $probe := index . 0 -}}
httpGet:
  path: {{ index . 1 }}
  port: monitoring
  {{- if eq (index . 2) "HTTPS" }}
  scheme: HTTPS
  {{- end }}
{{- range $key := list "initialDelaySeconds" "periodSeconds" "timeoutSeconds" "successThreshold" "failureThreshold" }}
{{- if hasKey $probe $key }}
{{ $key }}: {{ get $probe $key }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Values a MetalLB values file may carry that ferrolb cannot honour: refuse them with a message that
says what to do, rather than ignore a setting the user relies on.
*/}}
{{- define "ferrolb.refuseUnsupported" -}}
{{- if .Values.speaker.frr.enabled }}
{{- fail "speaker.frr.enabled: ferrolb speaks BGP itself and has no FRR mode; remove the value (docs/migrating-from-metallb.md)" }}
{{- end }}
{{- if .Values.frrk8s.enabled }}
{{- fail "frrk8s.enabled: ferrolb speaks BGP itself and has no frr-k8s backend; set it to false (docs/migrating-from-metallb.md)" }}
{{- end }}
{{- if eq .Values.controller.webhookMode "onlywebhook" }}
{{- fail "controller.webhookMode: ferrolb has no webhook (the CRDs validate with CEL rules); use enabled or disabled" }}
{{- end }}
{{- if not .Values.speaker.memberlist.enabled }}
{{- fail "speaker.memberlist.enabled: the speakers' heartbeats cannot be turned off (they decide which node owns a layer 2 IP)" }}
{{- end }}
{{- if .Values.speaker.memberlist.mlBindAddrOverride }}
{{- fail "speaker.memberlist.mlBindAddrOverride: not supported; the speakers use the node's addresses" }}
{{- end }}
{{- if and .Values.controller.nodeAddresses.enabled (not .Values.speaker.enabled) }}
{{- fail "controller.nodeAddresses.enabled needs speaker.enabled: a node's address is listed only while ferrolb's speaker runs on it (docs/k3s.md)" }}
{{- end }}
{{- if .Values.speaker.ignoreExcludeLB }}
{{- fail "speaker.ignoreExcludeLB: not supported; nodes labelled node.kubernetes.io/exclude-from-external-load-balancers never announce" }}
{{- end }}
{{- if and (not .Values.speaker.excludeInterfaces.enabled) (not .Values.speaker.ignoreInterfaces) }}
{{- fail "speaker.excludeInterfaces.enabled=false: set speaker.ignoreInterfaces to the prefixes to skip instead (ferrolb always skips some)" }}
{{- end }}
{{- with .Values.tls }}
{{- range $key, $value := . }}
{{- if and $value (not (has $key (list "controllerMetricsTLSSecret" "speakerMetricsTLSSecret"))) }}
{{- fail (printf "tls.%s: ferrolb's metrics TLS takes a certificate Secret only (tls.speakerMetricsTLSSecret, tls.controllerMetricsTLSSecret) and uses TLS 1.2 and 1.3 with rustls' cipher suites; remove the value (docs/migrating-from-metallb.md)" $key) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
