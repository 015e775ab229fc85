"""DRA device taints for failing NICs (docs/gating.md, "Gate the NIC, not the node").

- `drivers`: which ResourceSlice attributes name a NIC's PCI function, netdev and RDMA device,
  per DRA driver (dranet by default; configurable for SR-IOV and others).
- `slices`: the devices of the node-local ResourceSlices, only what matching needs (pure).
- `rules`: DeviceTaintRule objects, their names and the changes to reach what the verdict
  wants (pure).
- `api`: discovery of the served version and the calls (list/watch slices, create, delete,
  list rules).
- `slice_watch`: the ResourceSlice list and watch, per configured driver.
- `stage`: the stage the gating round asks: which validations may taint devices, which
  rules to write, one Event per problem.
"""
