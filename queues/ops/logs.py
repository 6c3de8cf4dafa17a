"""One JSON object per log line (QUEUEADMIN_LOG_FORMAT=json, the production default), so that
a log pipeline can filter by field instead of parsing messages.

Lines about an item pass `extra=queues.engine.logfields.item_fields(...)`: queue, item and
account then appear as fields of that line. Any other `extra` given to a log call is kept as a
field too.
"""

import json
import logging
from datetime import UTC, datetime

# Attributes every LogRecord has; anything else on a record came from `extra=`.
STANDARD_ATTRIBUTES = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "taskName"}


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
        return json.dumps(line, default=str, ensure_ascii=False)


class PlainFormatter(logging.Formatter):
    """Human-readable lines that stay one line each: a line break in a message (an identifier
    or an error can carry one) is written as \\n, so nobody can forge a log line. Tracebacks
    keep their lines, after the message."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return super().formatMessage(record).replace("\r", "\\r").replace("\n", "\\n")
