"""Kueue AdmissionCheck controller for `controllerName: netval.io/fabric`.

Modelled on Kueue's own check controllers (provisioning, multikueue):

- AdmissionCheck: `spec.parameters` must name a NetworkValidation (`apiGroup: netval.io`,
  `kind: NetworkValidation`, `name`). The controller keeps the `Active` condition: True when
  the validation is known, False with reason `BadParameters` (wrong reference) or
  `ValidationNotFound` (no such validation; confirmed with the API first, so an operator
  restart that has not loaded the validations yet does not deactivate ClusterQueues).
- Workload: only once it has reserved quota (`QuotaReserved=True`) and is not finished, and
  only the `status.admissionChecks` entries of our AdmissionChecks: `Pending` -> `Ready` when
  the validation is Healthy and none of the nodes its admission names (topology assignment,
  `kubernetes.io/hostname` or any node-label levels) is unhealthy; `Pending` -> `Retry` when
  such an assigned node is unhealthy (Kueue releases the quota and places it again);
  `Pending` with a message while the validation is unknown or not Healthy; `Ready` -> `Retry`
  when the validation turns unhealthy before the Workload is admitted. An admitted (running)
  Workload is never evicted by this controller, as Kueue's provisioning controller does not
  retry admitted workloads. `Retry` is left for Kueue to reset (it does so on eviction).
  `Rejected` (which deactivates the Workload) is never set: no fabric condition is permanent.

Writes are merge patches of `status` carrying the object's resourceVersion (the whole
`admissionChecks` list, only our entries changed; a 409 re-reads and decides again).

The group is watched without a version: Kopf serves the cluster's preferred version, so
`v1beta2` where Kueue serves it, else `v1beta1`; writes use the version of the object read.
Enabled by `NETVAL_KUEUE_ENABLED=true` (`OperatorSettings.kueue_enabled`): only then does
`netval operator` import `netval.operator.kueue.handlers` (Kopf then watches Kueue objects,
which needs RBAC).

Modules, split as Kueue's own check controllers are:

- `decisions`: pure -- the AdmissionCheck parameters and Active condition, a check entry's
  next state (`decide`), the admissionChecks list with the verdicts applied.
- `topology`: the nodes a Workload's topology assignment names (Kueue's v1beta2 slices and
  v1beta1 domains).
- `admission_checks`: our AdmissionChecks as the watch delivers them, and their Active
  condition.
- `workloads`: the Workloads naming one of our AdmissionChecks as the watch delivers them
  (trimmed), and their check entries.
- `assignments`: where each cached Workload is placed, the Workloads on each node, and the
  node index (by hostname and topology level) placements are found in.
- `controller`: `KueueController`, reconciling per Workload from a keyed work queue
  (`netval.operator.kube.work_queue`) fed by watch events and by the verdict changes of the
  nodes a Workload is placed on.
- `handlers`: the Kopf handlers feeding it (importing the module registers them).
"""
