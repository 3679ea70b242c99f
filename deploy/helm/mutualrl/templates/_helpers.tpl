{{/* Names, labels and the pieces every template shares. */}}

{{- define "mutualrl.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "mutualrl.labels" -}}
app.kubernetes.io/name: mutualrl
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "mutualrl.selectorLabels" -}}
app.kubernetes.io/name: mutualrl
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "mutualrl.image" -}}
{{- printf "%s:%s" .Values.image.repository (default (printf "%s-cuda" .Chart.AppVersion) .Values.image.tag) -}}
{{- end -}}

{{/* The gang backend: the configured one, or for `auto` the first the cluster serves. */}}
{{- define "mutualrl.gang" -}}
{{- $g := .Values.mwra.gang -}}
{{- if eq $g "auto" -}}
{{- if .Capabilities.APIVersions.Has "kueue.x-k8s.io/v1beta1" -}}kueue
{{- else if .Capabilities.APIVersions.Has "scheduling.run.ai/v2alpha2" -}}kai
{{- else if .Capabilities.APIVersions.Has "scheduling.volcano.sh/v1beta1" -}}volcano
{{- else if .Capabilities.APIVersions.Has "scheduling.k8s.io/v1alpha2" -}}native
{{- else -}}mwra
{{- end -}}
{{- else -}}{{ $g }}{{- end -}}
{{- end -}}

{{- define "mutualrl.hmacSecret" -}}{{ default (printf "%s-hmac" (include "mutualrl.fullname" .)) .Values.hmac.existingSecret }}{{- end -}}
{{- define "mutualrl.apiSecret" -}}{{ default (printf "%s-api" (include "mutualrl.fullname" .)) .Values.api.existingSecret }}{{- end -}}
{{- define "mutualrl.weightsClaim" -}}{{ default (printf "%s-weights" (include "mutualrl.fullname" .)) .Values.weights.existingClaim }}{{- end -}}
{{- define "mutualrl.redisSecret" -}}{{ default (printf "%s-redis" (include "mutualrl.fullname" .)) .Values.redis.external.existingSecret }}{{- end -}}
{{- define "mutualrl.runNamespace" -}}{{ printf "mutualrl:%s" .Release.Name }}{{- end -}}

{{- define "mutualrl.seeKeysSecret" -}}{{ printf "%s-see-keys" (include "mutualrl.fullname" .) }}{{- end -}}

{{/* A static pod's SEE signing keys (`mutualrl.see.identity`): its own and those of the services
     it reads — a rollout service its learner's, a learner every rollout service's — each from the
     keys Secret, joined into MUTUALRL_SEE_KEYS by the kubelet's $(VAR) expansion. Call with
     (dict "root" $ "policy" "<policy>" "role" "<role>"). */}}
{{- define "mutualrl.seeKeys" -}}
{{- $svcs := list (printf "%s.%s" .policy .role) -}}
{{- if eq .role "rollout" }}{{ $svcs = append $svcs (printf "%s.learner" .policy) }}
{{- else }}{{ range .root.Values.policies }}{{ $svcs = append $svcs (printf "%s.rollout" .name) }}{{ end }}{{ end -}}
{{- $pairs := list -}}
{{- range $svcs | uniq }}
{{- $var := printf "MUTUALRL_SEE_KEY_%s" (regexReplaceAll "[^A-Za-z0-9]" . "_" | upper) }}
{{- $pairs = append $pairs (printf "%s=$(%s)" . $var) }}
- name: {{ $var }}
  valueFrom:
    secretKeyRef: {name: {{ include "mutualrl.seeKeysSecret" $.root }}, key: {{ . | quote }}}
{{- end }}
- {name: MUTUALRL_SEE_KEYS, value: {{ join "," $pairs | quote }}}
{{- end -}}

{{- define "mutualrl.redisUsersSecret" -}}{{ printf "%s-redis-users" (include "mutualrl.fullname" .) }}{{- end -}}

{{/* A pod's own Redis identity (bundled Redis: ACL users, `mutualrl see acl`). Call with
     (dict "root" $ "user" "<policy>.<role>"). */}}
{{- define "mutualrl.redisIdentity" -}}
{{- if .root.Values.redis.bundled }}
- {name: MUTUALRL_REDIS_USERNAME, value: {{ .user | quote }}}
- name: MUTUALRL_REDIS_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ include "mutualrl.redisUsersSecret" .root }}, key: {{ .user | quote }}}
{{- end }}
{{- end -}}

{{/* The broker URL every pod reads (bundled Redis, or the external one's Secret). */}}
{{- define "mutualrl.redisUrl" -}}
- name: MUTUALRL_REDIS_URL
  valueFrom:
    secretKeyRef: {name: {{ include "mutualrl.redisSecret" . }}, key: redis-url}
{{- end -}}

{{/* The broker URL and the run key (the controller: MWRA-created pods derive their keys from it). */}}
{{- define "mutualrl.redisEnv" -}}
{{ include "mutualrl.redisUrl" . }}
- name: MUTUALRL_HMAC_KEY
  valueFrom:
    secretKeyRef: {name: {{ include "mutualrl.hmacSecret" . }}, key: hmac-key}
{{- end -}}

{{/* The experiment file: the values' experiment, policies, broker and MWRA settings. */}}
{{- define "mutualrl.experiment" -}}
{{- $exp := deepCopy .Values.experiment -}}
{{- $pols := list -}}
{{- range .Values.policies -}}
{{- $p := dict "name" .name "model" .model -}}
{{- if .tokenizer }}{{ $_ := set $p "tokenizer" .tokenizer }}{{ end -}}
{{- if .optim }}{{ $_ := set $p "optim" .optim }}{{ end -}}
{{- if .warmStart }}{{ $_ := set $p "warm_start" .warmStart }}{{ end -}}
{{- $learnerGpus := int (default 0 (dig "gpus" 0 (default dict .learner))) -}}
{{- $eng := dict "backend" .engine.backend "device" (ternary "cuda" "cpu" (gt $learnerGpus 0)) -}}
{{- if ne .engine.backend "hf" }}{{ $_ := set $eng "url" "http://127.0.0.1:8000" }}{{ end -}}
{{- if hasKey .engine "temperature" }}{{ $_ := set $eng "temperature" .engine.temperature }}{{ end -}}
{{- $_ := set $p "engine" $eng -}}
{{- $r := default dict .rollout -}}
{{- $res := dict "rollout_tp" (int (default 1 $r.tensorParallel)) "rollout_replicas" (int (default 1 $r.replicas)) "learner_gpus" (max 1 $learnerGpus) -}}
{{- if .engine.image }}{{ $_ := set $res "engine_image" .engine.image }}{{ end -}}
{{- if .engine.args }}{{ $_ := set $res "engine_args" .engine.args }}{{ end -}}
{{- $_ := set $p "resources" $res -}}
{{- $pols = append $pols $p -}}
{{- end -}}
{{- $_ := set $exp "policies" $pols -}}
{{- $_ := set $exp "broker" (dict "backend" "redis" "hmac_key_env" "MUTUALRL_HMAC_KEY") -}}
{{- $_ := set $exp "launcher" (merge (dict "host" "0.0.0.0") (default dict $exp.launcher)) -}}
{{- $k8s := dict "namespace" .Release.Namespace "image" (include "mutualrl.image" .) "gang" (include "mutualrl.gang" .) "queue" .Values.mwra.queue "admission_timeout_s" .Values.mwra.admissionTimeoutSeconds "weights_claim" (include "mutualrl.weightsClaim" .) "hmac_secret" (include "mutualrl.hmacSecret" .) "redis_url_secret" (include "mutualrl.redisSecret" .) -}}
{{- if .Values.redis.bundled }}{{ $_ := set $k8s "redis_users_secret" (include "mutualrl.redisUsersSecret" .) }}{{ end -}}
{{- $_ := set $exp "mwra" (dict "backend" "kubernetes" "min_gain" .Values.mwra.minGain "move_cost_s" .Values.mwra.moveCostSeconds "kubernetes" $k8s) -}}
{{- toYaml $exp -}}
{{- end -}}

{{- define "mutualrl.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{- define "mutualrl.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
{{- end -}}
