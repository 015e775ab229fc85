"""In memory: validations and their reports, aggregation into status, east-west, peer ports."""
