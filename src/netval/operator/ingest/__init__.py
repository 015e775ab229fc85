"""From the broker: decoding untrusted messages, the subscription, the retained assignments."""
