"""Leader election on a coordination.k8s.io/v1 Lease, with controller-runtime's semantics.

- `settings`: the Lease's name and namespace, this replica's identity, the timings (env).
- `lease`: reading and writing the Lease (optimistic concurrency on resourceVersion).
- `elector`: acquire, renew, lose, release; what `netval operator` runs its terms under.
"""
