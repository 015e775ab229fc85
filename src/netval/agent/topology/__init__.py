"""Fabric topology discovery on the node (issue 21): LLDP neighbours of the judged netdevs."""
