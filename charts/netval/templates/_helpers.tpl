{{/*
Names, labels and shared values of the netval chart.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "netval.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The prefix of object names: fullnameOverride, else the release name, plus "-<chart name>"
unless the release name already contains it. At most 63 characters (DNS labels).
*/}}
{{- define "netval.fullname" -}}
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

{{/* "name-version" of the chart, for the helm.sh/chart label. */}}
{{- define "netval.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Fixed ServiceAccount names: the operator renders agent DaemonSets that name "netval-agent"
(netval.operator.manifests.AGENT_SERVICE_ACCOUNT).
*/}}
{{- define "netval.operatorServiceAccount" -}}netval-operator{{- end -}}
{{- define "netval.agentServiceAccount" -}}netval-agent{{- end -}}


{{/* Selector labels of one component: call with (dict "ctx" $ "component" "operator"). */}}
{{- define "netval.selectorLabels" -}}
app.kubernetes.io/name: {{ include "netval.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* All standard labels of one component: call with (dict "ctx" $ "component" "operator"). */}}
{{- define "netval.labels" -}}
helm.sh/chart: {{ include "netval.chart" .ctx }}
{{ include "netval.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: netval
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
{{- end -}}

{{/* An image reference repository[:tag][@digest]: with a digest the runtime pulls by digest. */}}
{{- define "netval.imageRef" -}}
{{- $image := .image -}}
{{- $tag := default .default $image.tag | toString -}}
{{- $ref := $image.repository -}}
{{- if $tag -}}
{{- $ref = printf "%s:%s" $ref $tag -}}
{{- end -}}
{{- if $image.digest -}}
{{- $ref = printf "%s@%s" $ref $image.digest -}}
{{- end -}}
{{- $ref -}}
{{- end -}}

{{/* The netval image (operator, and agents unless agent.image is set). */}}
{{- define "netval.image" -}}
{{- include "netval.imageRef" (dict "image" .Values.image "default" .Chart.AppVersion) -}}
{{- end -}}

{{- define "netval.agentImage" -}}
{{- default (include "netval.image" .) .Values.agent.image -}}
{{- end -}}

{{- define "netval.brokerImage" -}}
{{- include "netval.imageRef" (dict "image" .Values.mqtt.broker.image "default" "") -}}
{{- end -}}

{{/* Object names. */}}
{{- define "netval.brokerName" -}}{{ include "netval.fullname" . }}-mqtt{{- end -}}
{{- define "netval.operatorMqttSecret" -}}{{ include "netval.fullname" . }}-mqtt-operator{{- end -}}
{{- define "netval.agentMqttSecret" -}}{{ include "netval.fullname" . }}-mqtt-agent{{- end -}}
{{- define "netval.webhookService" -}}{{ include "netval.fullname" . }}-webhook{{- end -}}
{{- define "netval.webhookTlsSecret" -}}{{ default (printf "%s-webhook-tls" (include "netval.fullname" .)) .Values.webhook.existingSecret }}{{- end -}}

{{/* The DNS names of the webhook Service, as a list. */}}
{{- define "netval.webhookDnsNames" -}}
{{- $svc := include "netval.webhookService" . -}}
{{- $ns := .Release.Namespace -}}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) | toJson -}}
{{- end -}}

{{/*
MQTT wiring, one place for the operator Deployment: the broker URL and credentials of the
operator and of the agents, for the bundled broker or an external one.
*/}}
{{- define "netval.mqttUrl" -}}
{{- if .Values.mqtt.external.enabled -}}
{{- required "mqtt.external.url is required when mqtt.external.enabled is true" .Values.mqtt.external.url -}}
{{- else -}}
{{- printf "%s://%s.%s.svc:%s" (ternary "mqtts" "mqtt" .Values.mqtt.tls.enabled) (include "netval.brokerShardName" (dict "ctx" . "shard" 0)) .Release.Namespace (include "netval.brokerPort" .) -}}
{{- end -}}
{{- end -}}

{{/*
Sharded brokers (mqtt.shards > 1, bundled broker only; docs/operations.md "Brokers beyond one
process"): N independent Mosquitto Deployments and Services <fullname>-mqtt-<i>, every agent
on the shard of its node (netval.model.shards.shard_of), the operator on all. One shard keeps
today's names (<fullname>-mqtt): an upgrade moves nothing.
*/}}
{{- define "netval.brokerShards" -}}
{{- $n := int .Values.mqtt.shards -}}
{{- if and (gt $n 1) .Values.mqtt.external.enabled -}}
{{- fail "mqtt.shards > 1 runs several bundled brokers: it does not apply to mqtt.external (a clustered broker is one URL); set mqtt.shards=1" -}}
{{- end -}}
{{- $n -}}
{{- end -}}
{{- define "netval.brokerShardName" -}}
{{- if gt (int (include "netval.brokerShards" .ctx)) 1 -}}
{{- printf "%s-%d" (include "netval.brokerName" .ctx) (int .shard) -}}
{{- else -}}
{{- include "netval.brokerName" .ctx -}}
{{- end -}}
{{- end -}}
{{/* Every shard's URL, {shard} for the index; empty with one shard. */}}
{{- define "netval.mqttUrlPattern" -}}
{{- if gt (int (include "netval.brokerShards" .)) 1 -}}
{{- printf "%s://%s-{shard}.%s.svc:%s" (ternary "mqtts" "mqtt" .Values.mqtt.tls.enabled) (include "netval.brokerName" .) .Release.Namespace (include "netval.brokerPort" .) -}}
{{- end -}}
{{- end -}}

{{/* The bundled broker's port: the TLS listener's (mqtt.tls.enabled) or the plaintext one's. */}}
{{- define "netval.brokerPort" -}}
{{- ternary (int .Values.mqtt.broker.tlsPort) (int .Values.mqtt.broker.port) .Values.mqtt.tls.enabled -}}
{{- end -}}

{{/*
Broker TLS (bundled broker, mqtt.tls.enabled). The broker's certificate, key and CA are in
Secret brokerTlsSecret (tls.crt, tls.key, ca.crt): the user's (mqtt.tls.existingSecret),
cert-manager's (mqtt.tls.certManager) or the chart's (genCA/genSignedCert, kept by lookup).
Clients get only the CA: with the chart's certificate a CA-only Secret brokerCaSecret is
rendered in the release namespace and the agents' one; otherwise they read ca.crt of the
TLS Secret (release namespace) or mqtt.tls.agentCaSecret (another agents' namespace: the
broker's key is never copied where agents run).
*/}}
{{- define "netval.brokerTlsEnabled" -}}
{{- if and (not .Values.mqtt.external.enabled) .Values.mqtt.tls.enabled -}}true{{- end -}}
{{- end -}}
{{- define "netval.brokerTlsSecret" -}}{{ default (printf "%s-mqtt-tls" (include "netval.fullname" .)) .Values.mqtt.tls.existingSecret }}{{- end -}}
{{- define "netval.brokerCaSecret" -}}{{ include "netval.fullname" . }}-mqtt-ca{{- end -}}
{{- define "netval.brokerSelfSigned" -}}
{{- if and (include "netval.brokerTlsEnabled" .) (not .Values.mqtt.tls.certManager.enabled) (not .Values.mqtt.tls.existingSecret) -}}true{{- end -}}
{{- end -}}

{{/* The broker's certificate comes from a Secret renewed behind the chart's back
(cert-manager or the user's) and the broker pod runs `netval broker-reloader` to SIGHUP it. */}}
{{- define "netval.brokerReloader" -}}
{{- if and (include "netval.brokerTlsEnabled" .) (not (include "netval.brokerSelfSigned" .)) .Values.mqtt.tls.reloadOnRenewal -}}true{{- end -}}
{{- end -}}

{{/* The DNS names of the broker Service, as a list (the URL uses the third). */}}
{{- define "netval.brokerDnsNames" -}}
{{- $ns := .Release.Namespace -}}
{{- $names := list -}}
{{- range $i := until (int (include "netval.brokerShards" .)) -}}
{{- $svc := include "netval.brokerShardName" (dict "ctx" $ "shard" $i) -}}
{{- $names = concat $names (list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns)) -}}
{{- end -}}
{{- $names | toJson -}}
{{- end -}}

{{/*
The chart's broker certificate: the existing Secret's (lookup: kept across `helm upgrade`),
else a new CA and certificate. JSON {"crt", "key", "ca"} (base64), cached in .Values so the
Secrets and checksum annotations in every file see the same one.
*/}}
{{- define "netval.brokerTls" -}}
{{- if not (hasKey .Values "__netvalBrokerTls") -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "netval.brokerTlsSecret" .) -}}
{{- $dnsNames := include "netval.brokerDnsNames" . | fromJsonArray -}}
{{- $tls := dict -}}
{{- /* a Secret made for another shard count lacks names: made again (mqtt.shards changed) */ -}}
{{- $madeFor := "1" -}}
{{- if and $existing $existing.metadata.annotations -}}
{{- $madeFor = default "1" (index $existing.metadata.annotations "netval.io/mqtt-shards") -}}
{{- end -}}
{{- if and $existing $existing.data (hasKey $existing.data "tls.crt") (hasKey $existing.data "tls.key") (hasKey $existing.data "ca.crt") (eq $madeFor (include "netval.brokerShards" .)) -}}
{{- $tls = dict "crt" (index $existing.data "tls.crt") "key" (index $existing.data "tls.key") "ca" (index $existing.data "ca.crt") -}}
{{- else -}}
{{- $days := int .Values.mqtt.tls.selfSigned.validityDays -}}
{{- $genCa := genCA (printf "%s-mqtt-ca" (include "netval.fullname" .)) $days -}}
{{- $cert := genSignedCert (index $dnsNames 2) nil $dnsNames $days $genCa -}}
{{- $tls = dict "crt" ($cert.Cert | b64enc) "key" ($cert.Key | b64enc) "ca" ($genCa.Cert | b64enc) -}}
{{- end -}}
{{- $_ := set .Values "__netvalBrokerTls" $tls -}}
{{- end -}}
{{- toJson (get .Values "__netvalBrokerTls") -}}
{{- end -}}

{{/* Secret (release namespace, key ca.crt) the operator verifies the broker with; empty: none. */}}
{{- define "netval.mqttCaSecret" -}}
{{- if .Values.mqtt.external.enabled -}}
{{- .Values.mqtt.external.caSecret -}}
{{- else if include "netval.brokerSelfSigned" . -}}
{{- include "netval.brokerCaSecret" . -}}
{{- else if include "netval.brokerTlsEnabled" . -}}
{{- include "netval.brokerTlsSecret" . -}}
{{- end -}}
{{- end -}}

{{/* Secret (agents' namespace, key ca.crt) the agents verify the broker with; empty: none. */}}
{{- define "netval.agentMqttCaSecret" -}}
{{- if .Values.mqtt.external.enabled -}}
{{- .Values.mqtt.external.caSecret -}}
{{- else if include "netval.brokerSelfSigned" . -}}
{{- include "netval.brokerCaSecret" . -}}
{{- else if include "netval.brokerTlsEnabled" . -}}
{{- if eq (include "netval.agentNamespace" .) .Release.Namespace -}}
{{- default (include "netval.brokerTlsSecret" .) .Values.mqtt.tls.agentCaSecret -}}
{{- else -}}
{{- required "mqtt.tls.agentCaSecret is required with mqtt.tls.existingSecret or mqtt.tls.certManager when agents run in agent.namespace (a Secret there with the broker's CA under ca.crt)" .Values.mqtt.tls.agentCaSecret -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "netval.mqttUsername" -}}
{{- if .Values.mqtt.external.enabled -}}
{{- .Values.mqtt.external.username -}}
{{- else if not (include "netval.brokerIdentity" .) -}}
{{- .Values.mqtt.broker.operatorUsername -}}
{{- end -}}
{{- end -}}

{{- define "netval.mqttPasswordSecret" -}}
{{- if include "netval.brokerIdentity" . -}}
{{- else if .Values.mqtt.external.enabled -}}
{{- if .Values.mqtt.external.username -}}
{{- required "mqtt.external.existingSecret is required when mqtt.external.username is set" .Values.mqtt.external.existingSecret -}}
{{- end -}}
{{- else -}}
{{- include "netval.brokerOperatorSecret" . -}}
{{- end -}}
{{- end -}}

{{- define "netval.agentMqttUsername" -}}
{{- if .Values.mqtt.external.enabled -}}
{{- default .Values.mqtt.external.username .Values.mqtt.external.agentUsername -}}
{{- else -}}
{{- .Values.mqtt.broker.agentUsername -}}
{{- end -}}
{{- end -}}

{{- define "netval.agentMqttPasswordSecret" -}}
{{- if .Values.mqtt.external.enabled -}}
{{- default .Values.mqtt.external.existingSecret .Values.mqtt.external.agentExistingSecret -}}
{{- else -}}
{{- include "netval.brokerAgentSecret" . -}}
{{- end -}}
{{- end -}}

{{/* The bundled broker's Secrets: the user's (mqtt.broker.*ExistingSecret) or the chart's. */}}
{{- define "netval.brokerOperatorSecret" -}}
{{- default (include "netval.operatorMqttSecret" .) .Values.mqtt.broker.operatorExistingSecret -}}
{{- end -}}
{{- define "netval.brokerAgentSecret" -}}
{{- default (include "netval.agentMqttSecret" .) .Values.mqtt.broker.agentExistingSecret -}}
{{- end -}}

{{/*
A password kept across upgrades: the "password" key of Secret .name in .namespace when it
exists (lookup; offline rendering finds nothing), else 32 new random alphanumerics.
Call with (dict "namespace" NS "name" NAME).
*/}}
{{- define "netval.keptPassword" -}}
{{- $existing := lookup "v1" "Secret" .namespace .name -}}
{{- if and $existing $existing.data (hasKey $existing.data "password") -}}
{{- index $existing.data "password" | b64dec -}}
{{- else -}}
{{- randAlphaNum 32 -}}
{{- end -}}
{{- end -}}

{{/* The restricted security context every netval-chart container runs with. */}}
{{- define "netval.containerSecurityContext" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* mosquitto.conf of the bundled broker. */}}
{{- define "netval.brokerConfig" -}}
{{- $b := .Values.mqtt.broker -}}
# netval's broker: agents publish reports (retained, QoS 1), the operator subscribes.
{{- if .Values.mqtt.tls.enabled }}
# TLS only (mqtt.tls): the certificate names the broker Service; clients verify it and the
# host name. No plaintext listener.
listener {{ int $b.tlsPort }}
protocol mqtt
{{- if include "netval.brokerIdentity" . }}
# Per-node identity (docs/architecture.md "Broker identity"): every client shows a certificate
# of the identity CA; its common name (<validation>/<node>, or netval-operator) is the user
# name the ACL's patterns expand, and the client id, so no certificate can take over another
# identity's session. No password file, no per-client state.
cafile /mosquitto/identity/ca.crt
require_certificate true
use_identity_as_username true
use_username_as_clientid true
{{- else }}
cafile /mosquitto/tls/ca.crt
{{- end }}
certfile /mosquitto/tls/tls.crt
keyfile /mosquitto/tls/tls.key
tls_version tlsv1.2
{{- else }}
# Plaintext (mqtt.tls.enabled=false): passwords and reports cross the network in clear.
listener {{ int $b.port }}
protocol mqtt
{{- end }}
allow_anonymous false
{{- if not (include "netval.brokerIdentity" .) }}
password_file /mosquitto/auth/passwd
{{- end }}
{{- if $b.acl }}
acl_file /mosquitto/config/acl
{{- end }}
# Send small packets at once: without it a request answered by two packets (PUBACK, then a
# reply) waits for the peer's delayed ACK, ~40 ms a round trip.
set_tcp_nodelay true
{{- if $b.persistence }}
persistence true
persistence_location /mosquitto/data/
autosave_interval 60
{{- else }}
persistence false
{{- end }}
# Per-client limits, sized for the fleet (values mqtt.broker.limits, docs/operations.md
# "Broker sizing"): Mosquitto's defaults would drop the retained replay beyond ~500 nodes.
max_queued_messages {{ int64 $b.limits.maxQueuedMessages }}
max_queued_bytes {{ int64 $b.limits.maxQueuedBytes }}
max_inflight_messages {{ int64 $b.limits.maxInflightMessages }}
{{- if $b.limits.maxPacketSize }}
max_packet_size {{ int64 $b.limits.maxPacketSize }}
{{- end }}
{{- with $b.limits.persistentClientExpiration }}
persistent_client_expiration {{ . }}
{{- end }}
log_dest stdout
log_type error
log_type warning
log_type notice
connection_messages true
log_timestamp_format %Y-%m-%dT%H:%M:%S
{{- end -}}

{{/*
The broker's ACL. Topics: netval/v1/<validation>/<node>/{report,beat,state,endpoint,assignment,
loadplan,loadresult} (docs/architecture.md "MQTT"). The operator reads everything and writes
assignments and plans; an agent writes its reports, beats, states (the last will included),
endpoint announcements and load-test results, and reads its assignment and plan. With
per-node identity the user name is the certificate's <validation>/<node>, so `%u` confines
each agent to its own node's topics of its own validation; with the shared login every
agent may write any node's topics (docs/operations.md "Broker ACL").
*/}}
{{- define "netval.brokerAcl" -}}
{{- $b := .Values.mqtt.broker -}}
user {{ ternary "netval-operator" $b.operatorUsername (not (empty (include "netval.brokerIdentity" .))) }}
topic readwrite netval/#
{{- if include "netval.brokerIdentity" . }}

# The operator's ACL check observes with its own identity (one session per identity: the
# operator's would end the ingest's); it reads netval's topics (so can an admin with its
# certificate) and writes only the reserved probe validation's assignment and plan.
user netval-observer
topic read netval/#
topic write netval/v1/_netval-acl-probe/+/assignment
topic write netval/v1/_netval-acl-probe/+/loadplan

# Every agent: its own node's topics of its own validation (user name <validation>/<node>).
pattern write netval/v1/%u/report
pattern write netval/v1/%u/beat
pattern readwrite netval/v1/%u/state
pattern write netval/v1/%u/endpoint
pattern write netval/v1/%u/loadresult
pattern read netval/v1/%u/assignment
pattern read netval/v1/%u/loadplan
{{- else }}

user {{ $b.agentUsername }}
topic write netval/v1/+/+/report
topic write netval/v1/+/+/beat
topic readwrite netval/v1/+/+/state
topic write netval/v1/+/+/endpoint
topic read netval/v1/+/+/assignment
topic write netval/v1/+/+/loadresult
topic read netval/v1/+/+/loadplan
{{- end }}
{{- end -}}

{{/*
Name of both webhook configurations, which the operator writes itself
(netval.operator.admission.configurations.CONFIGURATION_NAME); the RBAC restricts the operator to it.
*/}}
{{- define "netval.webhookConfigurationName" -}}netval.io{{- end -}}

{{/* The agents' namespace: agent.namespace, else the release namespace. */}}
{{- define "netval.agentNamespace" -}}
{{- default .Release.Namespace .Values.agent.namespace -}}
{{- end -}}

{{/* The agents' pull secrets: agent.imagePullSecrets, else imagePullSecrets. */}}
{{- define "netval.agentImagePullSecrets" -}}
{{- if .Values.agent.imagePullSecrets -}}
{{- toJson .Values.agent.imagePullSecrets -}}
{{- else -}}
{{- toJson .Values.imagePullSecrets -}}
{{- end -}}
{{- end -}}

{{- define "netval.operatorDeployment" -}}{{ include "netval.fullname" . }}-operator{{- end -}}

{{/*
The MQTT passwords of the bundled broker: the existing Secrets' (mqtt.broker.*ExistingSecret:
nothing rendered), else generated once and kept (lookup). Returns a JSON object
{"operator": PASSWORD, "agent": PASSWORD}, computed once per render and cached in .Values
(template variables do not cross files: the Secrets, their copy in the agents' namespace
and the checksum annotations must all see the same passwords, offline too).
*/}}
{{- define "netval.brokerPasswords" -}}
{{- if not (hasKey .Values "__netvalBrokerPasswords") -}}
{{- $ns := .Release.Namespace -}}
{{- $op := include "netval.keptPassword" (dict "namespace" $ns "name" (include "netval.operatorMqttSecret" .)) -}}
{{- $agent := include "netval.keptPassword" (dict "namespace" $ns "name" (include "netval.agentMqttSecret" .)) -}}
{{- $_ := set .Values "__netvalBrokerPasswords" (dict "operator" $op "agent" $agent) -}}
{{- end -}}
{{- toJson (get .Values "__netvalBrokerPasswords") -}}
{{- end -}}

{{/*
The self-signed webhook certificate (webhook.enabled, no cert-manager, no existingSecret):
the existing Secret's (lookup: kept across `helm upgrade`), else a new CA and serving
certificate. JSON {"crt", "key", "ca"} (base64), cached in .Values like the passwords so
the Secret and the operator's checksum annotation see the same one.
*/}}
{{- define "netval.webhookTls" -}}
{{- if not (hasKey .Values "__netvalWebhookTls") -}}
{{- $fullname := include "netval.fullname" . -}}
{{- $secretName := include "netval.webhookTlsSecret" . -}}
{{- $dnsNames := include "netval.webhookDnsNames" . | fromJsonArray -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace $secretName -}}
{{- $tls := dict -}}
{{- /* a Secret made for another shard count lacks names: made again (mqtt.shards changed) */ -}}
{{- $madeFor := "1" -}}
{{- if and $existing $existing.metadata.annotations -}}
{{- $madeFor = default "1" (index $existing.metadata.annotations "netval.io/mqtt-shards") -}}
{{- end -}}
{{- if and $existing $existing.data (hasKey $existing.data "tls.crt") (hasKey $existing.data "tls.key") (hasKey $existing.data "ca.crt") (eq $madeFor (include "netval.brokerShards" .)) -}}
{{- $tls = dict "crt" (index $existing.data "tls.crt") "key" (index $existing.data "tls.key") "ca" (index $existing.data "ca.crt") -}}
{{- else -}}
{{- $days := int .Values.webhook.selfSigned.validityDays -}}
{{- $genCa := genCA (printf "%s-webhook-ca" $fullname) $days -}}
{{- $cert := genSignedCert (index $dnsNames 2) nil $dnsNames $days $genCa -}}
{{- $tls = dict "crt" ($cert.Cert | b64enc) "key" ($cert.Key | b64enc) "ca" ($genCa.Cert | b64enc) -}}
{{- end -}}
{{- $_ := set .Values "__netvalWebhookTls" $tls -}}
{{- end -}}
{{- toJson (get .Values "__netvalWebhookTls") -}}
{{- end -}}

{{/* Whether the chart renders the webhook's TLS Secret itself. */}}
{{- define "netval.webhookSelfSigned" -}}
{{- if and .Values.webhook.enabled (not .Values.webhook.certManager.enabled) (not .Values.webhook.existingSecret) -}}true{{- end -}}
{{- end -}}

{{/*
Per-node MQTT identity (docs/architecture.md "Broker identity"): "true" when the agents
enroll for client certificates of the identity CA (mqtt.identity.enabled, the webhook's
server and certificate serving enrollment) and the broker authenticates by them: the bundled
one, or an external one with mqtt.external.clientCertificates.
*/}}
{{- define "netval.identityEnabled" -}}
{{- if and .Values.mqtt.identity.enabled .Values.webhook.enabled (or (not .Values.mqtt.external.enabled) .Values.mqtt.external.clientCertificates) -}}true{{- end -}}
{{- end -}}
{{/* The bundled broker authenticates by client certificate (no password file). */}}
{{- define "netval.brokerIdentity" -}}
{{- if and (not .Values.mqtt.external.enabled) (include "netval.identityEnabled" .) -}}true{{- end -}}
{{- end -}}
{{- define "netval.identityCaSecret" -}}{{ default (printf "%s-mqtt-identity-ca" (include "netval.fullname" .)) .Values.mqtt.identity.existingSecret }}{{- end -}}
{{/*
The identity CA made by the chart (no mqtt.identity.existingSecret): the existing Secret's
(lookup: kept across `helm upgrade`), else a new one. JSON {"crt", "key"} (base64), cached in
.Values so the Secret and the checksum annotations see the same one.
*/}}
{{- define "netval.identityCa" -}}
{{- if not (hasKey .Values "__netvalIdentityCa") -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "netval.identityCaSecret" .) -}}
{{- $ca := dict -}}
{{- if and $existing $existing.data (hasKey $existing.data "tls.crt") (hasKey $existing.data "tls.key") -}}
{{- $ca = dict "crt" (index $existing.data "tls.crt") "key" (index $existing.data "tls.key") -}}
{{- else -}}
{{- $gen := genCA (printf "%s-mqtt-identity-ca" (include "netval.fullname" .)) (int .Values.mqtt.identity.selfSigned.validityDays) -}}
{{- $ca = dict "crt" ($gen.Cert | b64enc) "key" ($gen.Key | b64enc) -}}
{{- end -}}
{{- $_ := set .Values "__netvalIdentityCa" $ca -}}
{{- end -}}
{{- toJson (get .Values "__netvalIdentityCa") -}}
{{- end -}}
{{- define "netval.enrollCaConfigMap" -}}{{ include "netval.fullname" . }}-enroll-ca{{- end -}}

{{/* The agents as NetworkPolicy peers (the broker's MQTT port, the operator's enrollment
port): their pods by label, for plugins that identify host-network pods, and
networkPolicy.broker.agentSources (their node addresses) minus podCidrs. */}}
{{- define "netval.agentPeers" -}}
{{- $np := .Values.networkPolicy -}}
- namespaceSelector:
    matchLabels:
      kubernetes.io/metadata.name: {{ include "netval.agentNamespace" . }}
  podSelector:
    matchLabels:
      app.kubernetes.io/name: netval-agent
{{- range $np.broker.agentSources }}
{{- $peer := deepCopy . }}
{{- if and (hasKey $peer "ipBlock") $np.broker.podCidrs }}
{{- $cidr := $peer.ipBlock.cidr }}
{{- $v6 := contains ":" $cidr }}
{{- $except := list }}
{{- range $np.broker.podCidrs }}
{{- if eq $v6 (contains ":" .) }}
{{- $except = append $except . }}
{{- end }}
{{- end }}
{{- if $except }}
{{- $_ := set $peer.ipBlock "except" (concat ($peer.ipBlock.except | default list) $except) }}
{{- end }}
{{- end }}
- {{ toYaml $peer | indent 2 | trim }}
{{- end }}
{{- end -}}

{{/* The broker ACL start check's login with an external broker (JSON {username, secret};
{} for none): mqtt.external.aclProbe, else the agents'. */}}
{{- define "netval.aclProbe" -}}
{{- $p := .Values.mqtt.external.aclProbe | default dict -}}
{{- $username := default (include "netval.agentMqttUsername" .) $p.username -}}
{{- if and .Values.mqtt.external.enabled (ne $p.enabled false) $username -}}
{{- toJson (dict "username" $username "secret" (default (include "netval.agentMqttPasswordSecret" .) $p.existingSecret)) -}}
{{- else -}}
{}
{{- end -}}
{{- end -}}
