"""Encryption of Secret-backed header values at rest in the store.

The operator (which alone reads Secrets) resolves `valueFrom.secretKeyRef` and stores the
values as one Fernet token per job (AES-128-CBC + HMAC-SHA256, from the `cryptography`
package); workers decrypt them for each attempt. The key comes from the chart's Secret
(`CRONWELL_SECRETS_KEY` or `CRONWELL_SECRETS_KEY_FILE`): a database dump alone reveals
no credential. Rotating the key: list the new key first and the old one after, comma
separated (MultiFernet); the operator re-encrypts on its next resolution pass.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from cronwell.errors import CronwellError


class SecretsKeyError(CronwellError):
    """No usable key: Secret-backed headers cannot be stored or read."""


def generate_key() -> str:
    """A new key (for the chart's Secret: `cronwell secrets-key`)."""
    return Fernet.generate_key().decode()


class SecretBox:
    def __init__(self, keys: str):
        parts = [k.strip() for k in keys.split(",") if k.strip()]
        if not parts:
            raise SecretsKeyError(
                "no secrets key: set CRONWELL_SECRETS_KEY (or _FILE) to a Fernet key "
                "(python -c 'from cronwell.secretbox import generate_key; print(generate_key())')"
            )
        try:
            self._fernet = MultiFernet([Fernet(k.encode()) for k in parts])
        except ValueError:
            raise SecretsKeyError(
                "CRONWELL_SECRETS_KEY is not a Fernet key (32 url-safe base64-encoded bytes)"
            ) from None
        self._mac_key = hashlib.sha256(b"cronwell-digest:" + parts[0].encode()).digest()

    @classmethod
    def from_settings(cls, key: str | None, key_file: Path | None) -> SecretBox | None:
        """The box of the configured key, or None when none is configured."""
        if key_file is not None:
            try:
                key = key_file.read_text()
            except OSError as e:
                raise SecretsKeyError(f"cannot read {key_file}: {e.strerror}") from None
        return cls(key) if key and key.strip() else None

    def encrypt(self, values: Mapping[str, str]) -> str:
        return self._fernet.encrypt(json.dumps(dict(values), sort_keys=True).encode()).decode()

    def decrypt(self, token: str) -> dict[str, str]:
        try:
            out: dict[str, str] = json.loads(self._fernet.decrypt(token.encode()))
        except InvalidToken:
            raise SecretsKeyError(
                "stored header values do not decrypt with CRONWELL_SECRETS_KEY: the operator "
                "and the workers must share the key (the chart's secrets Secret)"
            ) from None
        return out

    def digest(self, values: Mapping[str, str]) -> str:
        """A keyed hash (reveals nothing without the key): rewrite the row only on change."""
        msg = json.dumps(dict(values), sort_keys=True).encode()
        return hmac.new(self._mac_key, msg, hashlib.sha256).hexdigest()
