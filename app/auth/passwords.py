"""Passwords hashed with scrypt (memory-hard, in the standard library), and the random secrets of tokens."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

# 16 MiB and ~50 ms per hash: costly for an attacker with a stolen database, cheap for a login.
N, R, P = 2**14, 8, 1
# A hash to verify against when the name is unknown, so a login takes as long whether or not the user exists.
_DUMMY = ""


def hash_password(password: str) -> str:
    """`scrypt$N$r$p$salt$hash`, salt and hash in base64."""
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=N, r=R, p=P, maxmem=64 * 2**20, dklen=32)
    return "$".join(["scrypt", str(N), str(R), str(P), _b64(salt), _b64(digest)])


def verify_password(password: str, stored: str | None) -> bool:
    """True when `password` is the one `stored` was made from; with `stored` None, as slow as a real check."""
    global _DUMMY
    if stored is None:
        _DUMMY = _DUMMY or hash_password(secrets.token_urlsafe(16))
        stored, known = _DUMMY, False
    else:
        known = True
    scheme, n, r, p, salt, digest = stored.split("$")
    if scheme != "scrypt":
        return False
    got = hashlib.scrypt(password.encode(), salt=_unb64(salt), n=int(n), r=int(r), p=int(p), maxmem=64 * 2**20,
                         dklen=len(_unb64(digest)))  # fmt: skip
    return hmac.compare_digest(got, _unb64(digest)) and known


def new_password() -> str:
    """A password to print once: 20 characters, about 120 bits."""
    return secrets.token_urlsafe(15)


def new_secret(prefix: str = "") -> str:
    """A 256-bit random secret (a session id, an API token), URL-safe."""
    return prefix + secrets.token_urlsafe(32)


def sha256(secret: str) -> str:
    """How secrets of 256 random bits are stored: their SHA-256, which no one can turn back into them."""
    return hashlib.sha256(secret.encode()).hexdigest()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)
