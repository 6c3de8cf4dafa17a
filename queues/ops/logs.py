"""One JSON object per log line (QUEUEADMIN_LOG_FORMAT=json, the production default), so that
a log pipeline can filter by field instead of parsing messages.

Lines about an item pass `extra=queues.engine.logfields.item_fields(...)`: queue, item and
account then appear as fields of that line. Any other `extra` given to a log call is kept as a
field too.
"""

import json
import logging
import re
from datetime import UTC, datetime

# Attributes every LogRecord has; anything else on a record came from `extra=`.
STANDARD_ATTRIBUTES = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "taskName"}


# What a terminal or a line-splitting reader acts on, beyond the line feed: C0 controls but
# the tab (ESC starts cursor moves and colours), DEL, C1 controls (NEL breaks lines in Python's
# splitlines, CSI is a one-byte ESC [), and Unicode's line and paragraph separators. Errors
# and webhook responses come from elsewhere and reach log lines as they are.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def _escaped(text: str) -> str:
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(
                timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        for key, value in vars(record).items():
            if key not in STANDARD_ATTRIBUTES and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        # json escapes C0 controls itself; the rest would pass as they are.
        return _escaped(json.dumps(line, default=str, ensure_ascii=False))


class PlainFormatter(logging.Formatter):
    """Human-readable lines that stay one line each: a line break in a message (an identifier
    or an error can carry one) is written as \\n, and any other control character as \\uXXXX,
    so nobody can forge a log line or rewrite a terminal. Tracebacks keep their lines, after
    the message."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        message = super().formatMessage(record).replace("\r", "\\r").replace("\n", "\\n")
        return _escaped(message)

    def formatException(self, ei) -> str:
        return _escaped(super().formatException(ei))
