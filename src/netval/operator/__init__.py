"""The netval operator: Kopf handlers, manifest rendering, aggregation, gating, webhooks."""
