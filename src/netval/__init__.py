"""netval: continuous validation of the network fabric of GPU clusters."""

__version__ = "0.1.0"
