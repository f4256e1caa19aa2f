"""What the object-store bindings' URLs share (``s3://``, ``gs://``, ``azure://``).

A URL names a bucket (or container), a key prefix and options in its query; credentials never
belong in it. ``StoreUrl.parse`` checks one such URL and returns its parts, or raises
``InvalidConfig`` saying what is wrong, with the URL shown redacted (user info and the values
of secret-looking query keys replaced by ``***``): not a string, malformed, another scheme,
user info or a secret-looking option (the message says where credentials go instead), a
fragment or ``;params``, no bucket, an unknown, repeated or empty option. ``StoreUrl.number``
checks a numeric option's value and range. Each binding then reads its own options.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlparse

from slts.errors import InvalidConfig


@dataclass(frozen=True, slots=True)
class StoreUrl:
    """The URL rules of one object-store binding."""

    #: The URL scheme, e.g. ``s3``.
    scheme: str
    #: The service as messages name it, e.g. ``S3``, and with its article, e.g. ``an S3``.
    service: str
    a_service: str
    #: What the URL's host part names: ``bucket`` or ``container``.
    container: str
    #: The query options the binding knows.
    options: tuple[str, ...]
    #: Query keys containing one of these (lower case) are taken for credentials.
    secret_words: tuple[str, ...]
    #: Where credentials go instead, ending the refusal's message (``use ...``).
    credentials_hint: str

    def redacted(self, url: str) -> str:
        """``url`` with user info and secret-looking query values replaced by ``***``."""
        try:
            parsed = urlparse(url)
            pairs = parse_qsl(parsed.query, keep_blank_values=True)
        except ValueError:
            return f"{self.scheme}://***"
        netloc = parsed.netloc.rpartition("@")[2]
        shown = [(key, "***" if self._secret(key) else value) for key, value in pairs]
        query = f"?{urlencode(shown, safe=':/')}" if shown else ""
        return f"{parsed.scheme}://{'***@' if '@' in parsed.netloc else ''}{netloc}{parsed.path}{query}"

    def parse(self, url: object) -> tuple[str, str, dict[str, str], str]:
        """(bucket, prefix unquoted, options by name, the URL redacted) of ``url``; every
        check of the module doc, ``InvalidConfig`` at the first that fails."""
        if not isinstance(url, str):
            raise InvalidConfig(f"{self.a_service} URL must be a string, got {type(url).__name__}")
        shown = self.redacted(url)
        try:
            parsed = urlparse(url)
            pairs = parse_qsl(parsed.query, keep_blank_values=True, strict_parsing=bool(parsed.query))
        except ValueError as exc:
            raise InvalidConfig(f"malformed {self.service} URL: {shown}") from exc
        if parsed.scheme != self.scheme:
            article = "an" if self.scheme[0] in "aeiou" or self.scheme == "s3" else "a"
            raise InvalidConfig(f"not {article} {self.scheme}:// URL: {shown}")
        if "@" in parsed.netloc or any(self._secret(key) for key, _ in pairs):
            raise InvalidConfig(
                f"credentials do not belong in the chunk storage URL ({shown}): use {self.credentials_hint}"
            )
        if parsed.fragment or parsed.params:
            raise InvalidConfig(f"{self.service} URL has a fragment or parameters: {shown}")
        if not parsed.netloc:
            raise InvalidConfig(f"{self.service} URL has no {self.container}: {shown}")
        options: dict[str, str] = {}
        for key, value in pairs:
            if key not in self.options:
                raise InvalidConfig(
                    f"unknown {self.service} URL option {key!r} in {shown}; known: {', '.join(self.options)}"
                )
            if key in options:
                raise InvalidConfig(f"{self.service} URL option {key!r} given twice in {shown}")
            if not value:
                raise InvalidConfig(f"{self.service} URL option {key!r} is empty in {shown}")
            options[key] = value
        return parsed.netloc, unquote(parsed.path), options, shown

    def number(self, key: str, text: str, kind: type, low: float, high: float) -> Any:
        """Option ``key``'s ``text`` as a ``kind`` (``int`` or ``float``) in ``[low, high]``."""
        try:
            value = kind(text)
        except ValueError as exc:
            raise InvalidConfig(f"{self.service} URL option {key} must be a number, got {text!r}") from exc
        if not low <= value <= high:
            raise InvalidConfig(f"{self.service} URL option {key} must be in [{low}, {high}], got {value}")
        return value

    def _secret(self, key: str) -> bool:
        return any(word in key.lower() for word in self.secret_words)
