"""Kopf handlers: only `@kopf.*` functions, thin and idempotent. Importing this package
registers them with Kopf (`netval operator` and the tests load `netval.operator.handlers`)."""

from netval.operator.handlers import lifecycle, loadtests, nodes, validations

__all__ = ["lifecycle", "loadtests", "nodes", "validations"]
