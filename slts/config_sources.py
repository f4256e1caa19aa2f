"""Where a ``StorageConfig`` comes from: defaults, a TOML file, ``SLTS_*`` variables, flags.

Each source overrides the one before it::

    defaults  <  slts.toml  <  SLTS_<FIELD> environment variables  <  --set FIELD=VALUE flags

The file is the one named by ``--config``, else by ``$SLTS_CONFIG``, else ``slts.toml`` in
the store's folder (the embedded default's ``--store FOLDER``; with a storage URL, the
``--metadata`` folder) if there is one there. Its keys are ``StorageConfig``'s fields at the
top level (``docs/config.md`` lists them)::

    gc_delay_s = 120
    verify_checksums_on_read = true
    rolling_length_bytes_default = 134_217_728

Every value is checked where it is read: an unknown key, a value of the wrong type or out
of range raises ``InvalidConfig`` naming the key and its source (the file's path, the
variable, the flag), before anything is opened. A TOML value keeps its type (``true`` for
a switch, an integer for a count or size, a number for seconds); a variable's or a flag's
text is parsed into the field's type.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slts.config import ENV_PREFIX, StorageConfig, check_field, parse_value
from slts.errors import InvalidArgument, InvalidConfig
from slts.limiter import BURST_S_DEFAULT, MIN_SHARE_DEFAULT, Limit, PriorityLimiter, TrafficClass
from slts.prices import PRICE_KEYS, Prices, list_prices

#: The file's name in a store's folder.
CONFIG_FILE_NAME = "slts.toml"
#: The variable naming the file.
CONFIG_FILE_ENV = "SLTS_CONFIG"

_FIELDS = {field.name: field for field in dataclasses.fields(StorageConfig)}
#: The limiter's settings (``slts.limiter``), as dotted keys: a ``[limits]`` table in the
#: file (``[limits.defrag]``, ...), ``SLTS_LIMITS_DEFRAG_BYTES_PER_S``, ``--set
#: limits.defrag.bytes_per_s=...``. Numbers; unset is the limiter's default (no limit).
LIMIT_KEYS: tuple[str, ...] = (
    "limits.min_share",
    "limits.burst_s",
    *(
        f"limits.{scope}.{unit}"
        for scope in ("total", *(kind.name.lower() for kind in TrafficClass))
        for unit in ("bytes_per_s", "requests_per_s")
    ),
)
#: Settings given as tables of numbers (``[limits]``, ``[prices]``: ``slts.cost.PRICE_KEYS``).
_NUMBER_TABLES = ("limits", "prices")
_NUMBER_KEYS: tuple[str, ...] = (*LIMIT_KEYS, *PRICE_KEYS)


@dataclass(frozen=True, slots=True)
class ResolvedConfig:
    """A configuration and, for each field, where its value came from (``"default"``, the
    file's path, ``"$SLTS_<FIELD>"`` or ``"--set"``)."""

    config: StorageConfig
    sources: Mapping[str, str]
    file: str | None
    #: The limiter's settings that were set (``LIMIT_KEYS``).
    limits: Mapping[str, float] = dataclasses.field(default_factory=dict)
    #: The prices that were set (``slts.cost.PRICE_KEYS``).
    prices: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def fields(self) -> dict[str, Any]:
        """The configuration as ``slts.open`` keyword arguments."""
        return {name: getattr(self.config, name) for name in _FIELDS}

    def limiter(self) -> PriorityLimiter | None:
        """A limiter with the ``limits`` settings (None if none is set); share it among the
        instances that use one chunk storage."""
        return build_limiter(self.limits) if self.limits else None

    def price_list(self, store_url: str | None = None) -> Prices:
        """The rates ``slts cost`` prices with: the defaults of the store's service
        (``slts.prices.list_prices``), with the ``prices`` set."""
        return Prices.from_settings(self.prices, list_prices(store_url)[0])


def build_limiter(limits: Mapping[str, float]) -> PriorityLimiter:
    """The ``PriorityLimiter`` of the dotted ``limits`` settings; ``InvalidArgument`` from
    the limiter for values it refuses."""

    def limit(scope: str) -> Limit:
        return Limit(limits.get(f"limits.{scope}.bytes_per_s"), limits.get(f"limits.{scope}.requests_per_s"))

    per_class = {kind: limit(kind.name.lower()) for kind in TrafficClass}
    return PriorityLimiter(
        per_class,
        total=limit("total"),
        min_share=limits.get("limits.min_share", MIN_SHARE_DEFAULT),
        burst_s=limits.get("limits.burst_s", BURST_S_DEFAULT),
    )


def find_config_file(explicit: str | None, env: Mapping[str, str], folder: str | None) -> str | None:
    """The file to read: ``explicit``, else ``$SLTS_CONFIG``, else ``folder/slts.toml`` if it
    exists (None: no file). A file named explicitly or by the variable must exist:
    ``InvalidConfig`` otherwise."""
    for path, source in ((explicit, "--config"), (env.get(CONFIG_FILE_ENV), f"${CONFIG_FILE_ENV}")):
        if path:
            if not os.path.isfile(path):
                raise InvalidConfig(f"{source} names {path!r}, which is not a file")
            return path
    if folder:
        candidate = os.path.join(folder, CONFIG_FILE_NAME)
        if os.path.isfile(candidate):
            return candidate
    return None


def read_config_file(path: str) -> dict[str, Any]:
    """The values in the TOML file ``path``, each checked against its field (see module
    doc). ``InvalidConfig`` for a file that cannot be read or parsed, an unknown key or a
    bad value, naming the file and the key."""
    try:
        with open(path, "rb") as file:
            document = tomllib.load(file)
    except OSError as exc:
        raise InvalidConfig(f"configuration file {path!r} cannot be read: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise InvalidConfig(f"configuration file {path!r} is not valid TOML: {exc}") from exc
    values: dict[str, Any] = {}
    for key, value in _flattened(document):
        source = f"{path}: {key}"
        if key in _NUMBER_KEYS:
            values[key] = _number_value(key, value, source)
            continue
        if key not in _FIELDS:
            raise InvalidConfig(f"{source}: unknown key (the keys are listed in docs/config.md)")
        values[key] = _checked(key, _typed(key, value, source), source)
    return values


def _flattened(document: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """The ``[limits]`` and ``[prices]`` tables as dotted keys; every other value as it is."""
    for key, value in document.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and dotted.partition(".")[0] in _NUMBER_TABLES:
            yield from _flattened(value, dotted + ".")
        else:
            yield dotted, value


def _number_value(key: str, value: Any, source: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise InvalidConfig(f"{source}: {value!r} is not a non-negative number")
    return float(value)


def resolve_config(
    file: str | None = None,
    env: Mapping[str, str] | None = None,
    flags: Sequence[str] = (),
) -> ResolvedConfig:
    """Defaults < ``file`` < ``SLTS_*`` variables of ``env`` (default ``os.environ``) <
    ``flags`` (``FIELD=VALUE`` texts). ``InvalidConfig`` names the key and the source of
    the first bad value; a relation between two fields that fails names both sources."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    sources = dict.fromkeys(_FIELDS, "default")
    if file is not None:
        for key, value in read_config_file(file).items():
            values[key], sources[key] = value, file
    for key in (*_FIELDS, *_NUMBER_KEYS):
        variable = ENV_PREFIX + key.replace(".", "_").upper()
        raw = env.get(variable)
        if raw is not None:
            values[key] = _from_text(key, raw, f"${variable}")
            sources[key] = f"${variable}"
    for flag in flags:
        key, sep, raw = flag.partition("=")
        source = f"--set {flag}"
        if not sep or (key not in _FIELDS and key not in _NUMBER_KEYS):
            raise InvalidConfig(f"{source}: not FIELD=VALUE with a field of docs/config.md")
        values[key] = _from_text(key, raw, source)
        sources[key] = "--set"
    limits = {key: values.pop(key) for key in LIMIT_KEYS if key in values}
    prices = {key: values.pop(key) for key in PRICE_KEYS if key in values}
    try:
        config = StorageConfig(**values)
    except InvalidConfig as exc:  # a relation between fields: name where each value came from
        where = ", ".join(f"{key} from {sources[key]}" for key in sorted(values))
        raise InvalidConfig(f"{exc} ({where or 'all defaults'}; the rest default)") from exc
    try:
        build_limiter(limits)
    except InvalidArgument as exc:
        named = ", ".join(f"{key} from {sources[key]}" for key in sorted(limits))
        raise InvalidConfig(f"limits: {exc} ({named})") from exc
    return ResolvedConfig(config, sources, file, limits, prices)


def _from_text(key: str, raw: str, source: str) -> Any:
    """A variable's or flag's text as the value of ``key``, checked."""
    if key in _NUMBER_KEYS:
        try:
            number = float(raw)
        except ValueError:
            raise InvalidConfig(f"{source}: {raw!r} is not a number") from None
        return _number_value(key, number, source)
    return _checked(key, _parsed(key, str(_FIELDS[key].type), raw, source), source)


def _typed(key: str, value: Any, source: str) -> Any:
    """A TOML value of the field's type (an integer also for seconds), else ``InvalidConfig``."""
    type_name = str(_FIELDS[key].type)
    if "str" in type_name:
        ok = isinstance(value, str)
    elif "bool" in type_name:
        ok = isinstance(value, bool)
    elif "float" in type_name:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    else:
        ok = isinstance(value, int) and not isinstance(value, bool)
    if not ok:
        raise InvalidConfig(f"{source}: {value!r} is not a {type_name}")
    return value


def _parsed(key: str, type_name: str, raw: str, source: str) -> Any:
    try:
        return parse_value(type_name, raw)
    except ValueError:
        raise InvalidConfig(f"{source}: {raw!r} is not a {type_name}") from None


def _checked(key: str, value: Any, source: str) -> Any:
    """``value`` if field ``key`` may hold it, else ``InvalidConfig`` naming ``source``."""
    try:
        check_field(key, value)
    except InvalidConfig as exc:
        raise InvalidConfig(f"{source}: {exc}") from exc
    return value
