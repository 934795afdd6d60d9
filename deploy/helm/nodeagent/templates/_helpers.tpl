{{/* The image reference: repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "nodeagent.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* Whether the agent picks its config per node (config.map or an external ConfigMap). */}}
{{- define "nodeagent.perNode" -}}
{{- if or .Values.config.name .Values.config.map }}true{{ end }}
{{- end }}

{{/* The ConfigMap holding the per-node entries. */}}
{{- define "nodeagent.entriesConfigMap" -}}
{{ .Values.config.name | default (printf "%s-configs" .Release.Name) }}
{{- end }}

{{/*
The device list strategy the values ask for, as a list, or nothing: deviceListStrategy, else
cdi-cri when cdi.enabled (the GPU Operator's meaning of cdi.enabled).
*/}}
{{- define "nodeagent.deviceListStrategy" -}}
{{- $s := .Values.deviceListStrategy -}}
{{- if and (not $s) .Values.cdi.enabled }}{{ $s = "cdi-cri" }}{{ end -}}
{{- if $s }}{{ kindIs "string" $s | ternary (list $s) $s | toJson }}{{ end -}}
{{- end }}

{{/*
One agent config file as the node reads it. The values that environment variables cannot
carry (a list) are written into the file: the text is kept verbatim when there are none.
*/}}
{{- define "nodeagent.configFile" -}}
{{- $strategy := include "nodeagent.deviceListStrategy" .root -}}
{{- if $strategy -}}
{{- $doc := fromYaml .text -}}
{{- if hasKey $doc "Error" }}{{ fail (printf "config entry %s is not YAML: %s" .name $doc.Error) }}{{ end -}}
{{- $plugin := get $doc "device_plugin" | default dict -}}
{{- $_ := set $plugin "device_list_strategy" (fromJsonArray $strategy) -}}
{{- $_ := set $doc "device_plugin" $plugin -}}
{{- toYaml $doc -}}
{{- else -}}
{{- .text -}}
{{- end -}}
{{- end }}
