"""`core.urls`: a URL as shown never holds its password or query credentials (issue 62 item 13), for
generated URLs of every shape: with and without userinfo, port, path, several query parameters."""

from __future__ import annotations

import random
import string

import pytest

from prompt_r1.core.urls import MASK, redact_url, redact_urls_in, scrub_secrets, url_secrets

SECRET_NAMES = ["api_key", "key", "token", "access_token", "X-Api-Key", "sig", "password", "auth", "client_secret"]
PLAIN_NAMES = ["version", "api-version", "deployment", "model", "region"]


def _secret(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_letters + string.digits + "-_.~") for _ in range(rng.randint(6, 40)))


def _url(rng: random.Random) -> tuple[str, list[str]]:
    secrets, netloc = [], f"host{rng.randint(0, 9)}.example"
    if rng.random() < 0.3:
        netloc += f":{rng.randint(1, 65535)}"
    if rng.random() < 0.6:
        password = _secret(rng)
        secrets.append(password)
        netloc = f"user{rng.randint(0, 9)}:{password}@{netloc}"
    query = []
    for _ in range(rng.randint(0, 4)):
        if rng.random() < 0.5:
            value = _secret(rng)
            secrets.append(value)
            query.append(f"{rng.choice(SECRET_NAMES)}={value}")
        else:
            query.append(f"{rng.choice(PLAIN_NAMES)}=2024-0{rng.randint(1, 9)}")
    return f"{rng.choice(['http', 'https'])}://{netloc}/v{rng.randint(1, 2)}" + ("?" + "&".join(query) if query else ""), secrets


@pytest.mark.parametrize("seed", range(40))
def test_no_secret_survives_redaction_or_scrubbing(seed) -> None:
    rng = random.Random(seed)
    url, secrets = _url(rng)
    shown = redact_url(url)
    message = f"cannot connect to {url} (ConnectError: [Errno 111] {url})"
    scrubbed = scrub_secrets(message, url_secrets(url))
    for secret in secrets:
        assert secret not in shown and secret not in scrubbed
    assert (MASK in shown) == bool(secrets)
    if not secrets:
        assert shown == url  # a URL without secrets is shown as it is
    dump = redact_urls_in({"environment": {"base_url": url}, "eval": {"environments": [{"base_url": url}]}})
    assert all(secret not in str(dump) for secret in secrets)


@pytest.mark.parametrize("url", ["not a url", "http://[::1", "", "http://h/v1?&&=x&key"])
def test_odd_urls_do_not_fail(url) -> None:
    assert isinstance(redact_url(url), str)
