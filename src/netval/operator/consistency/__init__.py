"""Fleet consistency (issue 22): fingerprints, cohorts, findings and status.consistency."""
