"""Authlib's JOSE API (``authlib.jose``), imported once with its deprecation warning silenced.

Authlib 1.6+ warns on every import of ``authlib.jose`` that it will move to joserfc in 2.0; the
API works unchanged through 1.x, and pagegate's design names authlib. ``authlib.deprecate`` turns
its own warning class to "always" when first imported, so it is imported before the filter is set.
"""

from __future__ import annotations

import warnings

from authlib.deprecate import AuthlibDeprecationWarning

with warnings.catch_warnings():
    warnings.simplefilter("ignore", AuthlibDeprecationWarning)
    from authlib.jose import JsonWebKey, JsonWebToken, Key, KeySet
    from authlib.jose.errors import ExpiredTokenError, InvalidClaimError, JoseError, MissingClaimError

__all__ = ["ExpiredTokenError", "InvalidClaimError", "JoseError", "JsonWebKey", "JsonWebToken", "Key", "KeySet",
           "MissingClaimError"]
