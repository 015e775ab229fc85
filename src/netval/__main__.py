"""`python -m netval`: the `netval` command, for an interpreter other than the console
script's (the agent's capability interpreter, docs/topology.md "Privileges")."""

from netval.cli import main

raise SystemExit(main())
