"""Fabric topology at the operator (issue 21): levels, agreement, the status aggregate."""
