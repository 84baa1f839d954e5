"""Credentials in URLs the user gives tfgpu (``output.mlflow.tracking_uri``, ``MLFLOW_TRACKING_URI``, a sweep's
``--storage``): found once, where the URL enters tfgpu, and never written to a file, a log, a message or MLflow.

A URL's userinfo (``USER:PASSWORD@`` after ``scheme://``) is read as ``urllib.parse.urlsplit`` reads it (the
last ``@`` of the authority: a password may hold ``@`` and ``:``), and also as SQLAlchemy reads a database URL
whose password holds a ``/`` (``postgresql://alice:pa/ss@host/db``: urlsplit would end the authority at the
``/``): when the authority has a ``:`` or ``@`` and an ``@`` follows before the query, everything up to that
last ``@`` is the userinfo. A URL with an ``@`` in its path after ``host:port`` is then masked too much, never
too little. https://docs.python.org/3/library/urllib.parse.html#urllib.parse.urlsplit
"""

from __future__ import annotations

from typing import Optional
from urllib.parse import unquote, urlsplit

#: What replaces a URL's userinfo in messages and records (``postgresql://***@host/db``).
MASK = "***"


def split_userinfo(url: str) -> tuple[str, Optional[str]]:
    """``(the URL without its userinfo, the userinfo)``; ``(url, None)`` when it has none (or is no URL: a path).

    ``split_userinfo("http://alice:s3cret@127.0.0.1:5000/x?a=1")`` is ``("http://127.0.0.1:5000/x?a=1",
    "alice:s3cret")``.
    """
    if not isinstance(url, str) or "://" not in url:
        return url, None
    try:
        netloc = urlsplit(url).netloc
    except ValueError:  # (an invalid IPv6 host, e.g.): mask from the text alone
        netloc = url.split("://", 1)[1].split("/", 1)[0]
    start = url.index("://") + 3
    rest = url[start:]
    head_end = min([i for i in (rest.find("?"), rest.find("#")) if i >= 0] or [len(rest)])
    at = rest.rfind("@", 0, head_end)
    if at < 0 or not ("@" in netloc or ":" in netloc):
        return url, None
    return url[:start] + rest[at + 1:], rest[:at]


def masked(url: Optional[str]) -> Optional[str]:
    """``url`` as messages and records show it: its userinfo (user and password) replaced by :data:`MASK`
    (``postgresql://alice:pa/ss@host/db`` -> ``postgresql://***@host/db``); anything else unchanged."""
    if not url:
        return url
    clean, userinfo = split_userinfo(url)
    if userinfo is None:
        return url
    start = clean.index("://") + 3
    return f"{clean[:start]}{MASK}@{clean[start:]}"


def credentials(url: Optional[str]) -> tuple[Optional[str], Optional[str], Optional[str]]:
    """``(the URL without userinfo, user, password)``, user and password percent-decoded (``None`` when absent):
    ``credentials("http://alice:s%2F3@h:5000")`` is ``("http://h:5000", "alice", "s/3")``."""
    if not url:
        return url, None, None
    clean, userinfo = split_userinfo(url)
    if userinfo is None:
        return url, None, None
    user, sep, password = userinfo.partition(":")
    return clean, unquote(user) or None, unquote(password) if sep else None


def redact(text: str, *urls: Optional[str]) -> str:
    """``text`` (an exception's message, say) with each of ``urls`` masked (:func:`masked`) and their passwords
    and userinfo, as given and percent-decoded, replaced by :data:`MASK`."""
    for url in urls:
        if not url:
            continue
        clean, userinfo = split_userinfo(url)
        if userinfo is None:
            continue
        text = text.replace(url, masked(url))
        _, user, password = credentials(url)
        secrets = {userinfo, unquote(userinfo), userinfo.partition(":")[2], password or ""}
        for secret in sorted((s for s in secrets if s), key=len, reverse=True):
            text = text.replace(secret, MASK)
    return text
