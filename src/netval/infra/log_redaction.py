"""Every log line redacted: a filter on the root handlers that passes each record through
`netval.model.redaction.redact`, so no line of netval's or of a library's carries a presigned
path, userinfo, a password or a token (tracebacks included)."""

from __future__ import annotations

import logging
from typing import Final

from netval.model.redaction import redact

__all__ = ["RedactingFilter", "install_log_redaction"]

_FORMATTER: Final = logging.Formatter()


class RedactingFilter(logging.Filter):
    """Rewrites every record's message through `redact` (arguments merged first), so that no
    log line of netval's or of a library's carries a presigned path or a password."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken %-format: let the handler report it as logging does
            return True
        redacted = redact(message)
        if redacted != message or record.args:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            # Formatter.format uses exc_text when set: the traceback's messages redacted too.
            record.exc_text = redact(_FORMATTER.formatException(record.exc_info))
        return True


def install_log_redaction(logger: logging.Logger | None = None) -> None:
    """Attach `RedactingFilter` to every handler of `logger` (the root by default): filters
    on handlers see records of every logger that propagates to them, loggers' filters don't."""
    target = logger or logging.getLogger()
    for handler in target.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
