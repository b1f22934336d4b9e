"""Keep secrets of a job spec out of anything shown: error messages, reprs, logs, Dagster metadata, MLflow params.

A value is secret when its key looks like one (``password``, ``aws_secret_access_key``, ``sasl.password``,
``token``, ``credential``, ``api_key``, ...) or when it sits anywhere under a container that holds
credentials by design: a source's ``storage_options`` and an Iceberg catalog's ``properties``. User
information in URLs (``postgresql://user:PASSWORD@host/db``) is masked wherever it appears.

Kafka security keys: the spec never holds the SASL password (``sasl_password`` and its spellings are
refused at load; ``sasl_password_env`` names the variable that does). The ``sasl_*`` values and
``ssl_keyfile`` are masked anyway (their words are secret words: a user name is half a credential);
``security_protocol``, ``ssl_cafile`` and ``ssl_certfile`` are shown. The client settings built from the
variable (``sasl_plain_password``, see :mod:`primus_dagster.data.sources.kafka.security`) are masked too.

Example::

    from primus_dagster.spec import redact
    redact({"uri": "s3://b/t", "storage_options": {"aws_secret_access_key": "abc"}})
    # {'uri': 's3://b/t', 'storage_options': {'aws_secret_access_key': '***'}}
    metadata = redact(source)          # a spec model: its JSON dump, redacted

Use :func:`redact` for display only: the real values still have to reach the storage clients.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel

REDACTED = "***"

#: Keys whose every value (at any depth below) is secret: fsspec / object-store options and catalog
#: properties carry access keys, SAS tokens, passwords next to harmless settings, under names that
#: vary by backend.
SECRET_CONTAINERS = frozenset({"storage_options", "properties", "credentials", "headers"})

# Split a key into words (snake, kebab, dotted, camelCase) and look for a secret word among them.
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
_SECRET_WORDS = frozenset(
    {
        "key",
        "keys",
        "secret",
        "secrets",
        "password",
        "passwd",
        "pwd",
        "passphrase",
        "token",
        "tokens",
        "credential",
        "credentials",
        "sasl",
        "jaas",
        "keytab",
        "signature",
        "sas",
        "sig",
        "auth",
        "authorization",
        "cookie",
        "private",
        # run-together spellings
        "apikey",
        "accesskey",
        "secretkey",
        "privatekey",
        "accesstoken",
        "authtoken",
        "clientsecret",
    }
)
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@:\s]*):(?P<password>[^/@\s]*)@")
_URL_QUERY_PARAM = re.compile(r"(?P<lead>[?&](?P<name>[A-Za-z0-9_.-]+)=)(?P<value>[^&#\s'\"]*)")


def is_secret_key(key: object) -> bool:
    """Whether a mapping key names a secret (``aws_secret_access_key``, ``sasl.password``, ``apiKey``,
    ``token``); ``storage_options`` and the other :data:`SECRET_CONTAINERS` are secret as a whole."""
    if not isinstance(key, str):
        return False
    if key in SECRET_CONTAINERS:
        return True
    words = [w.lower() for w in _WORD_SPLIT.split(key) if w]
    return any(w in _SECRET_WORDS for w in words)


def is_secret_path(path: Iterable[object]) -> bool:
    """Whether a value at this key path (e.g. a pydantic error ``loc``) is, or lies inside, a secret."""
    return any(is_secret_key(part) for part in path)


def redact_text(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@host`` masked, and the values of
    secret-like URL query parameters (``?sig=...``, ``X-Amz-Signature=...``, ``token=...``)."""
    text = _URL_USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{REDACTED}@", text)
    return _URL_QUERY_PARAM.sub(
        lambda m: f"{m['lead']}{REDACTED}" if is_secret_key(m["name"]) and m["value"] else m[0], text
    )


def redact(value: Any) -> Any:
    """A copy of ``value`` (a mapping, list, scalar or spec model) safe to show: the values of secret keys
    become ``"***"`` (keys are kept, so one still sees which options are set), URL passwords are masked.
    A pydantic model is dumped first (``model_dump(mode="json")``)."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return _redact(value, secret=False)


def _redact(value: Any, secret: bool) -> Any:
    if isinstance(value, Mapping):
        return {k: _redact(v, secret or is_secret_key(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_redact(v, secret) for v in value)
    if secret and value is not None:
        return REDACTED
    if isinstance(value, str):
        return redact_text(value)
    return value
