{{/* Names, labels and the pieces every template shares. */}}

{{/* A DNS-1123 label from a list of parts: lower case, runs of other characters as "-", and a name longer
     than 63 characters cut to 54 plus a hash of the whole, so long names with a common prefix stay apart
     (MWRA's `dns_name` makes the same names). */}}
{{- define "mutualrl.dnsName" -}}
{{- $s := regexReplaceAll "[^a-z0-9-]+" (lower (join "-" .)) "-" | trimAll "-" -}}
{{- if gt (len $s) 63 -}}
{{- printf "%s-%s" (regexReplaceAll "-+$" (trunc 54 $s) "") (sha256sum $s | trunc 8) -}}
{{- else -}}{{ $s }}{{- end -}}
{{- end -}}

{{/* The release's base name: 40 characters at most (room for "-<policy>-<role>"), with a hash when cut. */}}
{{- define "mutualrl.fullname" -}}
{{- $s := ternary .Release.Name (printf "%s-%s" .Release.Name .Chart.Name) (contains .Chart.Name .Release.Name) -}}
{{- if gt (len $s) 40 -}}
{{- printf "%s-%s" (regexReplaceAll "-+$" (trunc 31 $s) "") (sha256sum $s | trunc 8) -}}
{{- else -}}{{ $s }}{{- end -}}
{{- end -}}

{{/* The name of one policy role's objects. Call with (dict "root" $ "policy" "<name>" "role" "<role>"). */}}
{{- define "mutualrl.roleName" -}}
{{- include "mutualrl.dnsName" (list (include "mutualrl.fullname" .root) .policy .role) -}}
{{- end -}}

{{/* The run id the controller gives the chart's experiment (its pods' mutualrl.io/run label). */}}
{{- define "mutualrl.runId" -}}
{{- .Values.experiment.name | lower | replace "_" "-" | replace "." "-" | trunc 40 -}}
{{- end -}}

{{/* The policy's state PVC (checkpoints, learner state, the rollout ledger). Call with (dict "root" $ "policy"
     "<name>"). */}}
{{- define "mutualrl.stateClaim" -}}
{{- include "mutualrl.dnsName" (list (include "mutualrl.fullname" .root) .policy "state") -}}
{{- end -}}

{{/* Where and how one policy's pods run, as the experiment file's policies[].kubernetes (snake case): the one
     source both the static workloads and MWRA's gangs are built from. Call with (dict "root" $ "p" <policy>). */}}
{{- define "mutualrl.podConfig" -}}
{{- $p := .p -}}
{{- $eng := default dict $p.engine -}}
{{- $defaultResources := dict "requests" (dict "cpu" "4" "memory" "16Gi") "limits" (dict "memory" "16Gi") -}}
{{- $out := dict "resources" (default $defaultResources $p.resources) "engine_resources" (default dict $eng.resources) "engine_shm_size" (default "16Gi" $eng.shmSize) "node_selector" (default dict $p.nodeSelector) "tolerations" (default list $p.tolerations) "affinity" (default dict $p.affinity) -}}
{{- with $p.runtimeClassName }}{{ $_ := set $out "runtime_class_name" . }}{{ end -}}
{{- with (default .root.Values.priorityClassName $p.priorityClassName) }}{{ $_ := set $out "priority_class_name" . }}{{ end -}}
{{- $probes := dict -}}
{{- range $name, $d := dict "startup" (list 10 90) "readiness" (list 10 3) "liveness" (list 20 6) -}}
{{- $v := default dict (get (default dict $p.probes) $name) -}}
{{- $_ := set $probes $name (dict "period_s" (int (default (index $d 0) $v.periodSeconds)) "failure_threshold" (int (default (index $d 1) $v.failureThreshold))) -}}
{{- end -}}
{{- $_ := set $out "probes" $probes -}}
{{- toYaml $out -}}
{{- end -}}

{{/* The policy's GPUs and checks that they fit its engine: (dict "rollout" <per replica> "learner" <n>). Call with
     a policy. */}}
{{- define "mutualrl.policyGpus" -}}
{{- $r := default dict .rollout -}}
{{- $tp := int (default 1 $r.tensorParallel) -}}
{{- $external := ne .engine.backend "hf" -}}
{{- $rg := int (ternary (default $tp $r.gpus) (default 0 $r.gpus) $external) -}}
{{- if and $external (eq $rg 0) -}}
{{- fail (printf "policies[%s]: engine.backend %s serves on GPUs, but rollout.gpus is 0 (use engine.backend hf on CPU)" .name .engine.backend) -}}
{{- end -}}
{{- if and (gt $rg 0) (ne $rg $tp) -}}
{{- fail (printf "policies[%s]: rollout.gpus %d per replica must equal rollout.tensorParallel %d (one tensor-parallel group per replica; add replicas for more)" .name $rg $tp) -}}
{{- end -}}
{{- if and (not $external) (gt $tp 1) -}}
{{- fail (printf "policies[%s]: rollout.tensorParallel %d needs engine.backend vllm or sglang (the hf engine runs on one device)" .name $tp) -}}
{{- end -}}
{{- toYaml (dict "rollout" $rg "learner" (int (dig "gpus" 0 (default dict .learner)))) -}}
{{- end -}}

{{/* Fails on values the schema cannot check: policy names must be unique. */}}
{{- define "mutualrl.checkPolicies" -}}
{{- $seen := dict -}}
{{- range .Values.policies -}}
{{- if hasKey $seen .name }}{{ fail (printf "policies: the name %q is used twice; policy names must be unique" .name) }}{{ end -}}
{{- $_ := set $seen .name true -}}
{{- $_ := include "mutualrl.policyGpus" . -}}
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

{{/* The gang backend as configured; `auto` is decided by the controller when it starts, from the API groups the
     cluster serves then (a render has no cluster to ask: `helm template`, GitOps). */}}
{{- define "mutualrl.gang" -}}{{ .Values.mwra.gang }}{{- end -}}

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

{{/* The Secret of the services' Redis passwords: the chart's for its bundled Redis, or
     redis.external.usersSecret for yours (empty: the services share the URL's identity). */}}
{{- define "mutualrl.redisUsers" -}}
{{- if .Values.redis.bundled }}{{ include "mutualrl.redisUsersSecret" . }}{{ else }}{{ .Values.redis.external.usersSecret }}{{ end -}}
{{- end -}}

{{/* A pod's own Redis identity (ACL users, `mutualrl redis acl`). Call with
     (dict "root" $ "user" "<policy>.<role>"). */}}
{{- define "mutualrl.redisIdentity" -}}
{{- with include "mutualrl.redisUsers" .root }}
- {name: MUTUALRL_REDIS_USERNAME, value: {{ $.user | quote }}}
- name: MUTUALRL_REDIS_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ . }}, key: {{ $.user | quote }}}
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
{{- $root := . -}}
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
{{- if hasKey .engine "topK" }}{{ $_ := set $eng "top_k" .engine.topK }}{{ end -}}
{{- if hasKey .engine "topP" }}{{ $_ := set $eng "top_p" .engine.topP }}{{ end -}}
{{- $_ := set $p "engine" $eng -}}
{{- $r := default dict .rollout -}}
{{- $res := dict "rollout_tp" (int (default 1 $r.tensorParallel)) "rollout_replicas" (int (default 1 $r.replicas)) "learner_gpus" (max 1 $learnerGpus) -}}
{{- $_ := set $p "kubernetes" (include "mutualrl.podConfig" (dict "root" $root "p" .) | fromYaml) -}}
{{- if .engine.image }}{{ $_ := set $res "engine_image" .engine.image }}{{ end -}}
{{- if .engine.args }}{{ $_ := set $res "engine_args" .engine.args }}{{ end -}}
{{- $_ := set $p "resources" $res -}}
{{- $pols = append $pols $p -}}
{{- end -}}
{{- $_ := set $exp "policies" $pols -}}
{{- $_ := set $exp "broker" (dict "backend" "redis" "hmac_key_env" "MUTUALRL_HMAC_KEY") -}}
{{- $_ := set $exp "launcher" (merge (dict "host" "0.0.0.0") (default dict $exp.launcher)) -}}
{{- $k8s := dict "namespace" .Release.Namespace "image" (include "mutualrl.image" .) "gang" (include "mutualrl.gang" .) "queue" .Values.mwra.queue "admission_timeout_s" .Values.mwra.admissionTimeoutSeconds "weights_claim" (include "mutualrl.weightsClaim" .) "hmac_secret" (include "mutualrl.hmacSecret" .) "redis_url_secret" (include "mutualrl.redisSecret" .) -}}
{{- with include "mutualrl.redisUsers" . }}{{ $_ := set $k8s "redis_users_secret" . }}{{ end -}}
{{- $_ := set $k8s "models" (include "mutualrl.modelsConfig" . | fromYaml) -}}
{{- if .Values.state.enabled -}}
{{- $claims := dict -}}
{{- range $pol := .Values.policies }}{{ range $role := list "rollout" "learner" }}{{ $_ := set $claims (printf "%s.%s" $pol.name $role) (include "mutualrl.stateClaim" (dict "root" $root "policy" $pol.name)) }}{{ end }}{{ end -}}
{{- $_ := set $k8s "state_claims" $claims -}}
{{- end -}}
{{- with .Values.imagePullSecrets }}{{ $_ := set $k8s "image_pull_secrets" (pluck "name" .) }}{{ end -}}
{{- with .Values.tracking.credentialsSecret }}{{ $_ := set $k8s "tracking_secret" . }}{{ end -}}
{{- $_ := set $exp "tracking" (include "mutualrl.tracking" . | fromYaml) -}}
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

{{/* The model volume as the experiment file's mwra.kubernetes.models. */}}
{{- define "mutualrl.modelsConfig" -}}
{{- $m := .Values.models -}}
{{- $out := dict "hf_home" $m.hfHome -}}
{{- with $m.existingClaim }}{{ $_ := set $out "claim" . }}{{ end -}}
{{- with $m.hostPath }}{{ $_ := set $out "host_path" . }}{{ end -}}
{{- with $m.hfTokenSecret }}{{ $_ := set $out "hf_token_secret" . }}{{ end -}}
{{- with (include "mutualrl.modelsDownload" . | fromYaml) }}{{ $_ := set $out "download" . }}{{ end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* What fills the model volume: models.download's image and command, else `mutualrl models get` of
     models.presets in the chart's own image (its converted folders under /models/mutualrl). */}}
{{- define "mutualrl.modelsDownload" -}}
{{- $m := .Values.models -}}
{{- if (dig "download" "image" "" $m) -}}
{{- toYaml (dict "image" $m.download.image "command" $m.download.command) -}}
{{- else if $m.presets -}}
{{- $cmd := concat (list "mutualrl" "models" "get") $m.presets (list "--cache" "/models/mutualrl") -}}
{{- if $m.acceptLicense }}{{ $cmd = append $cmd "--accept-license" }}{{ end -}}
{{- toYaml (dict "image" (include "mutualrl.image" .) "command" $cmd) -}}
{{- end -}}
{{- end -}}

{{/* Requests and limits with `gpus` NVIDIA GPUs added (an extended resource's request equals its limit), as
     MWRA's service_resources adds them. Call with (dict "resources" <requests/limits> "gpus" <n>). */}}
{{- define "mutualrl.withGpus" -}}
{{- $out := dict -}}
{{- range $part := list "requests" "limits" -}}
{{- $amounts := deepCopy (default dict (get $.resources $part)) -}}
{{- if gt (int $.gpus) 0 }}{{ $_ := set $amounts "nvidia.com/gpu" (toString $.gpus) }}{{ end -}}
{{- if $amounts }}{{ $_ := set $out $part $amounts }}{{ end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* HF_HOME on the model volume, and HF_TOKEN from its Secret when one is named. */}}
{{- define "mutualrl.modelsEnv" -}}
- {name: HF_HOME, value: {{ .Values.models.hfHome | quote }}}
{{- if .Values.models.presets }}
- {name: MUTUALRL_CACHE, value: /models/mutualrl}
{{- end }}
{{- with .Values.models.hfTokenSecret }}
- name: HF_TOKEN
  valueFrom:
    secretKeyRef: {name: {{ . }}, key: token}
{{- end }}
{{- end -}}

{{/* The `models` volume: the PVC, the node directory, or a per-pod emptyDir (filled by the download, if any). */}}
{{- define "mutualrl.modelsVolume" -}}
- name: models
{{- if .Values.models.existingClaim }}
  persistentVolumeClaim: {claimName: {{ .Values.models.existingClaim }}, readOnly: {{ not (include "mutualrl.modelsDownload" .) }}}
{{- else if .Values.models.hostPath }}
  hostPath: {path: {{ .Values.models.hostPath }}, type: Directory}
{{- else }}
  emptyDir: {}
{{- end }}
{{- end -}}

{{/* The init container that fills the model volume, when models.download names an image or models.presets
     names presets. */}}
{{- define "mutualrl.modelDownload" -}}
{{- with (include "mutualrl.modelsDownload" . | fromYaml) }}
initContainers:
  - name: models
    image: {{ .image }}
    command: {{- toYaml .command | nindent 6 }}
    env:
      {{- include "mutualrl.modelsEnv" $ | nindent 6 }}
      - {name: HOME, value: /tmp}
    securityContext: {{- include "mutualrl.containerSecurityContext" $ | nindent 6 }}
    volumeMounts:
      - {name: models, mountPath: /models}
      - {name: tmp, mountPath: /tmp}
{{- end }}
{{- end -}}


{{/* The experiment file's tracking section from the values (docs/tracking.md). */}}
{{- define "mutualrl.tracking" -}}
{{- $t := .Values.tracking -}}
{{- $out := dict "backends" $t.backends -}}
{{- $ml := dict -}}
{{- with $t.mlflow.trackingUri }}{{ $_ := set $ml "tracking_uri" . }}{{ end -}}
{{- with $t.mlflow.experiment }}{{ $_ := set $ml "experiment" . }}{{ end -}}
{{- if $ml }}{{ $_ := set $out "mlflow" $ml }}{{ end -}}
{{- $wb := dict "project" $t.wandb.project "mode" $t.wandb.mode -}}
{{- with $t.wandb.entity }}{{ $_ := set $wb "entity" . }}{{ end -}}
{{- $_ := set $out "wandb" $wb -}}
{{- with $t.tags }}{{ $_ := set $out "tags" . }}{{ end -}}
{{- toYaml $out -}}
{{- end -}}
