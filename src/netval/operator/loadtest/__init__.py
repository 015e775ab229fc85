"""NetworkLoadTest, the operator's side, by stage: `validate` (spec against its validation),
`plan` (participants, stages, per-node plans), `aggregate` (results -> figures, breaches),
`status` (what the CR shows). Pure: the Kopf handlers and the MQTT wiring call these.
"""
