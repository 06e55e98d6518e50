"""URLs as they may be shown: without the password or credential query values they carry.

An environment's `base_url` may hold a secret (`https://user:PASSWORD@host/v1`, or
`...?api_key=KEY` for gateways that read a key from the query), and that URL used to reach the
console, the warehouse's `error` columns, MLflow params and artifacts and Prefect's database
verbatim. Everything that shows or stores a URL goes through `redact_url`, and every error text
an environment produces (including what an HTTP library wrote, which may quote the URL) through
`scrub_secrets`, so only `***` stands where a secret was. The URL used for the request keeps them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import parse_qsl, urlsplit, urlunsplit

MASK = "***"
# query parameters whose value is a credential (matched as a part of the name, case-insensitive)
_SECRET_PARAM = re.compile(r"key|token|secret|passw|pwd|auth|sig|credential|session|code", re.IGNORECASE)


def url_secrets(url: str) -> list[str]:
    """The secrets `url` carries: the userinfo password and the values of credential-like query
    parameters (longest first, so a secret that contains another is masked whole).

    >>> url_secrets("https://bob:s3cret@h/v1?api_key=K123&version=2")
    ['s3cret', 'K123']
    >>> url_secrets("http://127.0.0.1:8000/v1")
    []
    """
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # not parseable as a URL: nothing to pick out
        return []
    found = [password] if password else []
    found += [value for name, value in parse_qsl(parts.query, keep_blank_values=True)
              if value and _SECRET_PARAM.search(name)]
    return sorted(set(found), key=lambda s: (-len(s), found.index(s)))


def redact_url(url: str) -> str:
    """`url` with its password and credential query values as `***` (the user name and other
    parameters stay: they say which account and API version, and are no secret).

    >>> redact_url("https://bob:s3cret@h:8/v1?api_key=K123&version=2")
    'https://bob:***@h:8/v1?api_key=***&version=2'
    >>> redact_url("http://127.0.0.1:8000/v1")
    'http://127.0.0.1:8000/v1'
    """
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return scrub_secrets(url, url_secrets(url))
    netloc = parts.netloc
    if password:
        userinfo, _, host = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:{MASK}@{host}"
    query = "&".join(
        f"{name}={MASK if value and _SECRET_PARAM.search(name) else value}" if sep else name
        for name, sep, value in (item.partition("=") for item in parts.query.split("&") if item))
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def scrub_secrets(text: str, secrets: Iterable[str]) -> str:
    """`text` with every secret (at least 4 characters: a shorter one would mask ordinary text)
    replaced by `***`.

    >>> scrub_secrets("cannot connect to https://bob:s3cret@h/v1", ["s3cret"])
    'cannot connect to https://bob:***@h/v1'
    """
    for secret in secrets:
        if len(secret) >= 4:
            text = text.replace(secret, MASK)
    return text


def redact_urls_in(data: object, key: str = "base_url") -> object:
    """A copy of a config dump (nested dicts and lists, or a flat dict of dotted keys) with every
    `key` entry's URL redacted, for what is logged or stored beside a run.

    >>> redact_urls_in({"environment": {"base_url": "http://u:pw123@h/v1"}, "n": [1]})
    {'environment': {'base_url': 'http://u:***@h/v1'}, 'n': [1]}
    >>> redact_urls_in({"environment.base_url": "http://u:pw123@h/v1"})
    {'environment.base_url': 'http://u:***@h/v1'}
    """
    if isinstance(data, dict):
        return {k: (redact_url(v) if isinstance(v, str) and str(k).rsplit(".", 1)[-1] == key
                    else redact_urls_in(v, key)) for k, v in data.items()}
    if isinstance(data, list):
        return [redact_urls_in(v, key) for v in data]
    return data
