"""Workload gating at admission: Pods and Jobs annotated `netval.io/require-healthy: <name>`.

The operator serves two webhooks over HTTPS (`--webhook-addr`), each for Pods and Jobs:

- mutating (`gating.admission: gate`, the default, and `deny` alike): adds the required node
  affinity `netval.io/fabric NotIn [unhealthy]` (merged into any existing required terms); in
  gate mode, while the validation is not Healthy, also the scheduling gate `netval.io/fabric`
  and the label `netval.io/gated-by: <validation>` by which the operator finds the Pod again
  and removes the gate once the validation is Healthy (`GateReleaser`). A Pod admitted while
  Healthy loses a gate it inherited from its Job's template: health is judged when each Pod
  is created. A Job's template gets the annotation too, so the Job's Pods pass through the
  same webhooks when the Job controller creates them.
- validating (`gating.admission: deny`): refuses while the validation is not Healthy, naming
  the failing nodes and checks.

An annotation naming no NetworkValidation is refused in both modes (HTTP 400); so is every
annotated object while the validation cannot be looked up (503, "retry"). Whether the API
server admits objects when the webhook cannot be reached at all is the failurePolicy's
choice (`--webhook-failure-policy`, default Fail).

Serving: Kopf's `WebhookServer` (TLS, certificate reloading) calls `Reviewer` directly, not
Kopf's admission handlers (see `Reviewer` for why). netval writes the two webhook
configurations (both named `netval.io`) itself: Kopf's managed configurations hard-code
`timeoutSeconds: 30` and a failurePolicy fixed at import time, and cannot express the
`matchConditions` that keep unannotated objects from ever reaching the webhook (a CEL test of
the annotation, evaluated by the API server; objectSelector matches labels only).

Modules, in the order a request meets them:

- `options`: `netval operator --webhook-*` parsed into `WebhookOptions`.
- `configurations`: the webhooks (ids, rules, matchConditions) and the two configurations the
  operator writes.
- `server`: the TLS server (`WebhookService`), feeding each client config to the writer.
- `reviewer`: answers AdmissionReviews (`Reviewer`): looks up the validation and judges.
- `mutate`: the pure Pod/Job mutations and the JSON-patch diff the review answers with.
- `gate_release`: removes the gate once the validation is Healthy (`GateReleaser`).
- `handlers`: the Kopf start-up/clean-up handlers that run the server and the releaser; only
  importing it registers them (`netval operator` does, and only then).
"""
