"""Error groups: the same failure on different items, told apart from other failures.

A group is an error's first line with ids, numbers and quoted values replaced by placeholders
(`normalise_error`). `group_pattern` turns a group back into a regular expression over stored
errors, so a list or a bulk operation can select exactly a group's items. The pattern is
written for both databases: Python's `re` on SQLite and PostgreSQL's advanced regular
expressions (no \\d and no \\b, whose meaning differs there). `group_key` names a group in the
failure history (queues.engine.history), which counts each group's failures per minute and hour.
"""

import hashlib
import re

from queues.engine.db import is_postgres

MESSAGE_LIMIT = 300
# A generated id without dashes in the usual places ("s1a2ddad3-4", "req_8fK2pQ9x"): a token of 8
# or more word characters with letters between its digits. Replacing only its digits would make
# each id a group of its own; a word with one number in it ("Win32Error", "utf-8") is not an id.
_GENERATED_ID = (r"(?=[A-Za-z0-9_-]*[0-9][A-Za-z0-9_-]*[A-Za-z][A-Za-z0-9_-]*[0-9])"
             r"[A-Za-z0-9_-]{8,}(?![A-Za-z0-9_-])")
_NORMALISERS = [
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I), "<uuid>"),
    (re.compile(r"0x[0-9a-f]+|\b[0-9a-f]{16,}\b", re.I), "<hex>"),
    (re.compile(r"'[^']*'|\"[^\"]*\""), "'…'"),
    (re.compile(r"(?<![A-Za-z0-9_-])" + _GENERATED_ID), "<id>"),
    (re.compile(r"\d+(\.\d+)?"), "<n>"),
]
_KIND = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Timeout|Failure|Exit|Interrupt)|HTTP <n>)")
# What each placeholder stood for, as a pattern both databases read the same way.
_PLACEHOLDERS = {
    "<uuid>": "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "<hex>": "(?:0[xX][0-9a-fA-F]+|[0-9a-fA-F]{16,})",
    "'…'": "(?:'[^']*'|\"[^\"]*\")",
    "<id>": _GENERATED_ID,
    "<n>": "[0-9]+(?:[.][0-9]+)?",
}
_PLACEHOLDER = re.compile("|".join(re.escape(p) for p in _PLACEHOLDERS))
# What str.splitlines ends the first line at, as the characters themselves: both databases
# read them alike in brackets.
_LINE_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"


def normalise_error(error: str) -> tuple[str, str]:
    """(kind, message): the first line with ids, numbers and quoted values replaced, so that
    the same failure on different items groups together."""
    # Blanks at the end of the first line do not make another group (group_pattern allows them).
    line = error.strip().splitlines()[0].rstrip() if error.strip() else "(no message)"
    message = line[:MESSAGE_LIMIT]
    for pattern, replacement in _NORMALISERS:
        message = pattern.sub(replacement, message)
    match = _KIND.match(message)
    return (match.group(1) if match else "Error"), message


def group_key(kind: str, message: str) -> str:
    """A short fixed-width name for a group, under which the failure history keeps it."""
    return hashlib.sha256(f"{kind}\n{message}".encode()).hexdigest()[:16]


def group_pattern(message: str) -> str:
    """A regular expression matching the stored errors whose group is `message`: from the
    start of the error (leading blanks allowed) to the end of its first line."""
    # SQLite matches with Python's backtracking `re`: placeholders side by side ("<n><n>…", which
    # anyone may type) over a long run of digits tried every split, and 12 froze a web process
    # for minutes. An atomic group takes each placeholder's longest match once, as the
    # normaliser did; PostgreSQL's engine does not backtrack and has no such group.
    atomic = "(?>{})" if not is_postgres() else "{}"
    parts, end = [], 0
    for placeholder in _PLACEHOLDER.finditer(message):
        parts.append(_literal(message[end:placeholder.start()]))
        parts.append(atomic.format(_PLACEHOLDERS[placeholder.group()]))
        end = placeholder.end()
    parts.append(_literal(message[end:]))
    prefix = "".join(parts)
    # The group ends where the first line does, or "boom" would also take "boomerang failed";
    # unless that line was longer than MESSAGE_LIMIT, when the group is only its beginning.
    # PostgreSQL counts at most 255 repetitions at once, hence the nested count.
    longer = f"(?=(?:[^{_LINE_BREAKS}]{{100}}){{{MESSAGE_LIMIT // 100}}}[^{_LINE_BREAKS}])"
    return (f"^[ \t\r\n]*(?:{longer}{prefix}|{prefix}[ \t]*(?:[{_LINE_BREAKS}]|$))")


def _literal(text: str) -> str:
    # Every character not a letter, digit or space goes in brackets: the same in both dialects.
    return "".join(c if c.isalnum() or c == " " else "[" + ("\\" + c if c in "\\[]^" else c)
                   + "]" for c in text)
