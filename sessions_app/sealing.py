"""Values a run reads back are stored exactly, and the secrets in them are kept encrypted.

A JSON column (a step's payload, a checkpoint's state, an SDK item, a paused run state)
holds what a run wrote. When the redactor finds a secret in such a value, or the value
holds what PostgreSQL cannot keep as it is (a NUL, a lone surrogate, a float that jsonb
would turn into a different number, our own envelope key), the column holds an envelope:

    {...the value with its secrets masked..., "$sealed": {"v": 1, "key": <key id>,
                                                          "box": <the exact value, encrypted>}}

(a value that is not an object: {"$sealed": ..., "$view": <masked>}). Everything that reads
the column through the model field gets the masked view (`Sealed`, a dict, list or str):
pages, the API, exports, search and the admin show no secret without doing anything. The
store and the adapters, which hand the value back to a run, call `exact` and get what was
written, byte for byte. A masked view written back unchanged (a fork's copy, a rollback)
stores its envelope again, secrets intact.

Keys: RESPAWN_SEAL_KEYS (the first seals, every one opens; by default one derived from
SECRET_KEY, with SECRET_KEY_FALLBACKS opening too). `manage.py reseal` re-encrypts every
envelope under the first key, after which an old key can be dropped.
"""

from __future__ import annotations

import base64
import hashlib
import json
from functools import lru_cache
from typing import Any

from cryptography.fernet import Fernet, InvalidToken

SEALED = "$sealed"
VIEW = "$view"
VERSION = 1


class SealError(Exception):
    """A sealed value cannot be opened: its key is not configured, or it was altered."""


class Sealed:
    """A masked view of a sealed value (mixed into dict, list and str): it reads as the
    masked value; `exact` opens the box; writing it back stores the same envelope."""

    seal: dict[str, Any]


class SealedDict(dict, Sealed):
    pass


class SealedList(list, Sealed):
    pass


class SealedStr(str, Sealed):
    pass


def _fernet(secret: str) -> Fernet:
    digest = hashlib.sha256(b"respawn-seal:" + secret.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def _key_id(secret: str) -> str:
    return hashlib.sha256(b"respawn-seal-id:" + secret.encode()).hexdigest()[:12]


@lru_cache(maxsize=8)
def _keyring(secrets: tuple[str, ...]) -> tuple[str, dict[str, Fernet]]:
    if not secrets:
        raise SealError("no key to seal with: set RESPAWN_SEAL_KEYS (or SECRET_KEY)")
    ring = {_key_id(s): _fernet(s) for s in secrets}
    return _key_id(secrets[0]), ring


def keys() -> tuple[str, dict[str, Fernet]]:
    """The current key's id and every configured key by id (settings decide)."""
    from django.conf import settings

    return _keyring(tuple(settings.RESPAWN_SEAL_KEYS))


def current_key_id() -> str:
    return keys()[0]


def envelope(view: Any, exact: Any) -> dict[str, Any]:
    """The stored form of `exact`, shown as `view` (its masked, storable copy)."""
    key_id, ring = keys()
    text = json.dumps(exact, separators=(",", ":"), allow_nan=False)
    seal = {"v": VERSION, "key": key_id, "box": ring[key_id].encrypt(text.encode()).decode()}
    return _packed(view, seal)


def _packed(view: Any, seal: dict[str, Any]) -> dict[str, Any]:
    """A view and its seal as one JSON object: an object's keys beside the seal's (so a
    query on a key finds the masked value), anything else under VIEW."""
    if isinstance(view, dict):
        return {**view, SEALED: seal}
    return {SEALED: seal, VIEW: view}


def _view(stored_value: dict[str, Any]) -> Any:
    """The masked view an envelope holds."""
    if VIEW in stored_value:
        return stored_value[VIEW]
    return {k: v for k, v in stored_value.items() if k != SEALED}


def is_envelope(value: Any) -> bool:
    return (
        isinstance(value, dict) and isinstance(value.get(SEALED), dict) and "box" in value[SEALED]
    )


def opened(value: Any) -> Any:
    """What a read of a stored value gives: an envelope becomes its masked view (a
    `Sealed` carrying the seal); anything else is returned as it is."""
    if isinstance(value, Sealed) or not is_envelope(value):
        return value
    seal = value[SEALED]
    view = _view(value)
    wrapped: Sealed
    if isinstance(view, dict):
        wrapped = SealedDict(view)
    elif isinstance(view, list):
        wrapped = SealedList(view)
    elif isinstance(view, str):
        wrapped = SealedStr(view)
    else:  # a masked number: nothing of it was a secret, the box has it all
        return exact(value)
    wrapped.seal = seal
    return wrapped


def stored(value: Sealed) -> dict[str, Any]:
    """The envelope a masked view came from, to be written back as it was."""
    view: Any
    if isinstance(value, dict):
        view = dict(value)
    elif isinstance(value, list):
        view = list(value)
    else:
        view = str(value)
    return _packed(view, value.seal)


def exact(value: Any) -> Any:
    """The value as it was written: the box of a masked view or of a raw envelope opened;
    any other value as it is."""
    if isinstance(value, Sealed):
        seal = value.seal
    elif is_envelope(value):
        seal = value[SEALED]
    else:
        return value
    opened_text = decrypt_bytes(str(seal.get("key")), str(seal.get("box", "")).encode())
    try:
        return json.loads(opened_text)
    except ValueError as exc:
        raise SealError(f"a sealed value under key {seal.get('key')} is not JSON") from exc


def encrypt_bytes(data: bytes) -> tuple[str, bytes]:
    """Bytes encrypted under the current key: (key id, token)."""
    key_id, ring = keys()
    return key_id, ring[key_id].encrypt(data)


def decrypt_bytes(key_id: str, token: bytes) -> bytes:
    fernet = keys()[1].get(key_id)
    if fernet is None:
        raise SealError(
            f"a value was sealed with key {key_id}, which is not among RESPAWN_SEAL_KEYS"
            " (or SECRET_KEY and its fallbacks): add that key back to read it"
        )
    try:
        return fernet.decrypt(token)
    except InvalidToken as exc:
        raise SealError(f"a sealed value under key {key_id} cannot be opened") from exc


def resealed(value: Any) -> Any:
    """A stored value sealed under an older key, sealed again under the current one (the
    same view); None when it needs nothing."""
    if not is_envelope(value) or value[SEALED].get("key") == current_key_id():
        return None
    return envelope(_view(value), exact(value))


def keep_secrets(edited: Any, shown: Any) -> Any:
    """An edit made on a masked view (an admin form, a corrected result prefilled with the
    current value): every part the person left as it was shown is taken from the exact
    value, so a masked secret they did not touch is kept, not replaced by its marker."""
    if not isinstance(shown, Sealed):
        return edited
    return _keep(edited, shown, exact(shown))


def _keep(edited: Any, shown: Any, original: Any) -> Any:
    if edited == shown:
        return original
    if isinstance(edited, dict) and isinstance(shown, dict) and isinstance(original, dict):
        return {
            key: _keep(item, shown[key], original[key])
            if key in shown and key in original
            else item
            for key, item in edited.items()
        }
    if (
        isinstance(edited, list)
        and isinstance(shown, list)
        and isinstance(original, list)
        and len(shown) == len(original)
    ):
        return [
            _keep(item, shown[i], original[i]) if i < len(shown) else item
            for i, item in enumerate(edited)
        ]
    return edited
