"""Log formats: human text by default, one JSON object per line with LOG_FORMAT=json.

The JSON lines carry `ts` (UTC, RFC 3339), `level`, `logger`, `message`, the process and
thread, `exc_info` when there is one, and every `extra={...}` field a caller passed.
"""
from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_RESERVED = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime",
                                                                             "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
            "thread": record.threadName,
        }
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        # default=str: an extra that JSON cannot hold (a model, a datetime) is logged as text.
        return json.dumps(entry, default=str, ensure_ascii=False)
