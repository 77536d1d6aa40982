"""The study key, sealed at rest: what would let a reader of the database compute correctness is
encrypted with a key file kept beside the database, never inside it.

Sealed (schema version 6): each trial's ``shown`` (the stream it plays and which tile each slot
shows), ``sources`` (slot -> backend) and ``expected`` (the right answer), in ``trials.sealed``;
each study's trial streams (which file holds which arrangement of tiles), catch pool, clips'
counterbalancing bits and the design seed they were drawn from, in ``config["sealed"]``. The
plain columns hold ``{}``/NULL/0 instead; ``ratings`` store the answer only (``correct`` is
computed from the unsealed trial by :func:`evalkit.study.analyse.raw_ratings` once the key is open).
Catch trials keep ``expected`` and ``correct`` in plain text: the interim screening needs them,
and a catch trial's answer (reference against an obvious degradation) says nothing about the
test key.

Key file: 32 random bytes as 64 hex digits, created with mode 0600 by ``study create`` at
:func:`default_path` (``<db>.key`` beside an SQLite file; ``<media folder>.key`` beside the
media folder of a PostgreSQL or in-memory database), its path recorded in
``config["seal"]["key_file"]`` with ``key_id`` (a SHA-256 of the key, to tell a wrong file).
``EVALKIT_STUDY_KEY`` (a path) overrides it: a server running elsewhere needs the key file where
it runs. Whoever reads the key file can unseal; keep it out of backups of the database.

Primitive (no ``cryptography`` package in the environment): encrypt-then-MAC from the standard
library. Keys ``k_enc = HMAC-SHA256(key, "evalkit seal enc")`` and ``k_mac = HMAC-SHA256(key,
"evalkit seal mac")``; a random 16-byte nonce; keystream block ``i`` = ``HMAC-SHA256(k_enc,
nonce || i as 8 bytes big-endian)`` XORed with the JSON text; tag = ``HMAC-SHA256(k_mac,
"s1" || len(aad) || aad || nonce || ciphertext)``, checked in constant time before decrypting.
The associated data ``aad`` binds a sealed value to its row (``trial:<rater id>:<ord>``,
``study:<id>``), so a value copied to another row does not open. Token: ``s1:`` + URL-safe
base64 of nonce || ciphertext || tag.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

from .errors import StudyError

#: environment variable naming the key file (overrides the path recorded in the study)
ENV = "EVALKIT_STUDY_KEY"
SCHEME = "s1"
SCHEME_TEXT = (
    "HMAC-SHA256 keystream (CTR), encrypt-then-MAC with HMAC-SHA256, random 128-bit "
    "nonce, key from a 0600 key file beside the database"
)
#: trial fields sealed in ``trials.sealed``
TRIAL_FIELDS = ("shown", "sources", "expected")
#: study config keys sealed in ``config["sealed"]``
CONFIG_FIELDS = ("streams", "catch_pool", "bits", "design_seed")
_NONCE = 16
_TAG = 32


class Key:
    """A loaded study key: ``path``, ``id`` (hex SHA-256 prefix of the key) and the derived
    encryption and MAC keys."""

    def __init__(self, raw: bytes, path: Path):
        self.path = Path(path)
        self.id = hashlib.sha256(b"evalkit key id" + raw).hexdigest()[:16]
        self._enc = hmac.new(raw, b"evalkit seal enc", hashlib.sha256).digest()
        self._mac = hmac.new(raw, b"evalkit seal mac", hashlib.sha256).digest()

    def _stream(self, nonce: bytes, n: int) -> bytes:
        out = bytearray()
        i = 0
        while len(out) < n:
            out += hmac.new(self._enc, nonce + i.to_bytes(8, "big"), hashlib.sha256).digest()
            i += 1
        return bytes(out[:n])

    def _tag(self, aad: str, nonce: bytes, ct: bytes) -> bytes:
        a = aad.encode()
        return hmac.new(
            self._mac, SCHEME.encode() + len(a).to_bytes(4, "big") + a + nonce + ct, hashlib.sha256
        ).digest()

    def seal(self, obj, aad: str) -> str:
        """``obj`` (JSON-able) as a sealed token bound to ``aad``."""
        plain = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
        nonce = secrets.token_bytes(_NONCE)
        ct = bytes(p ^ k for p, k in zip(plain, self._stream(nonce, len(plain))))
        return f"{SCHEME}:" + base64.urlsafe_b64encode(nonce + ct + self._tag(aad, nonce, ct)).decode()

    def unseal(self, token: str, aad: str):
        """The value sealed by :meth:`seal` with the same ``aad``; :class:`StudyError` naming
        the key file when it does not open (another key, or a changed value)."""
        try:
            if not token.startswith(SCHEME + ":"):
                raise ValueError
            raw = base64.urlsafe_b64decode(token[len(SCHEME) + 1 :].encode())
        except (ValueError, AttributeError, TypeError):
            raise StudyError(
                f"{aad}: expected a sealed value ({SCHEME}:...), found {str(token)[:20]!r}"
            ) from None
        nonce, ct, tag = raw[:_NONCE], raw[_NONCE:-_TAG], raw[-_TAG:]
        if len(raw) < _NONCE + _TAG or not hmac.compare_digest(tag, self._tag(aad, nonce, ct)):
            raise StudyError(
                f"{aad}: the sealed value does not open with the key file "
                f"{self.path} (another database's key, or the value was changed)"
            )
        return json.loads(bytes(c ^ k for c, k in zip(ct, self._stream(nonce, len(ct)))))


def default_path(db_path: Path | None, media_dir) -> Path:
    """Where a study's key file goes: ``<db>.key`` beside an SQLite file, else
    ``<media folder>.key`` beside the media folder (PostgreSQL, in-memory SQLite)."""
    if db_path is not None:
        return Path(str(Path(db_path).resolve()) + ".key")
    m = Path(media_dir).resolve()
    return m.with_name(m.name + ".key")


def create_or_load(path: Path) -> Key:
    """The key in ``path``, made first (32 random bytes, mode 0600, never overwritten) when
    there is none."""
    path = Path(path)
    if not path.exists():
        data = (secrets.token_hex(32) + "\n").encode()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # made meanwhile by another process: use it
            return load(path)
        except OSError as e:
            raise StudyError(f"{path}: cannot create the study key file ({e.strerror})") from None
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
    return load(path)


def load(path: Path) -> Key:
    """The key in ``path``; :class:`StudyError` (one line naming it) when missing or not a key."""
    path = Path(path)
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        raise StudyError(
            f"{path}: study key file not found (it seals the study key; it was made "
            f"beside the database by `evalkit study create`: restore it there, or "
            f"point {ENV} at it)"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise StudyError(f"{path}: cannot read the study key file ({e})") from None
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise StudyError(f"{path}: expected a study key (64 hex digits), found {len(text)} characters")
    return Key(bytes.fromhex(text), path)


def record(key: Key) -> dict:
    """``config["seal"]``: where the key file is, its id, the scheme."""
    return {"key_file": str(key.path), "key_id": key.id, "scheme": SCHEME_TEXT}


_CACHE: dict[tuple[str, float], Key] = {}


def study_key(config: dict) -> Key:
    """The key of a study from its ``config["seal"]`` (or ``$EVALKIT_STUDY_KEY``), checked
    against the recorded key id."""
    info = (config or {}).get("seal") or {}
    if not info.get("key_file"):
        raise StudyError(
            "study config: field 'seal': expected the key file's path, found none (a damaged study database)"
        )
    path = Path(os.environ.get(ENV) or info["key_file"])
    try:
        stamp = path.stat().st_mtime
    except OSError:
        stamp = -1.0
    key = _CACHE.get((str(path), stamp))
    if key is None:
        key = load(path)
        _CACHE[(str(path), stamp)] = key
    if info.get("key_id") and key.id != info["key_id"]:
        raise StudyError(
            f"{path}: not this study's key file (its id {key.id}, the study records {info['key_id']})"
        )
    return key


def trial_aad(rater_id: int, ord_: int) -> str:
    return f"trial:{int(rater_id)}:{int(ord_)}"


def study_aad(study_id: int) -> str:
    return f"study:{int(study_id)}"


def seal_trial(key: Key, rater_id: int, t: dict) -> dict:
    """A trial row for the database: its :data:`TRIAL_FIELDS` sealed in ``sealed``; ``shown``
    and ``sources`` left ``{}``; ``expected`` kept only for a catch trial (screening)."""
    row = {k: v for k, v in t.items() if k not in TRIAL_FIELDS}
    row["sealed"] = key.seal({k: t.get(k) for k in TRIAL_FIELDS}, trial_aad(rater_id, t["ord"]))
    row.update(shown={}, sources={}, expected=t.get("expected") if t["kind"] == "catch" else None)
    return row


def unseal_trial(key: Key, row: dict) -> dict:
    """A trial row (``rater_id``, ``ord``, ``sealed``) with its sealed fields restored."""
    out = dict(row)
    if row.get("sealed"):
        out.update(key.unseal(row["sealed"], trial_aad(row["rater_id"], row["ord"])))
    return out


def seal_config(key: Key, study_id: int, config: dict) -> dict:
    """``config`` with its :data:`CONFIG_FIELDS` moved into ``config["sealed"]``."""
    out = {k: v for k, v in config.items() if k not in CONFIG_FIELDS}
    out["sealed"] = key.seal({k: config.get(k) for k in CONFIG_FIELDS if k in config}, study_aad(study_id))
    out["seal"] = record(key)
    return out


def unseal_config(study_id: int, config: dict) -> dict:
    """A study's config with its sealed fields restored (the key from :func:`study_key`)."""
    config = dict(config or {})
    if "sealed" not in config:
        return config
    token = config.pop("sealed")
    config.update(study_key(config).unseal(token, study_aad(study_id)))
    return config


def open_trials(config: dict, rows) -> list[dict]:
    """Trial rows of one study as they were before sealing (the key from the study's
    ``config``): for code that holds the key file (the server, invitations, tests)."""
    rows = [dict(r) for r in rows]
    if not any(r.get("sealed") for r in rows):
        return rows
    key = study_key(config)
    return [unseal_trial(key, r) if r.get("sealed") else r for r in rows]


def answer_aad(rater_id: int, trial_id: int) -> str:
    return f"answer:{int(rater_id)}:{int(trial_id)}"


def seal_answer(key: Key | None, rater_id: int, trial_id: int, answer: str) -> str:
    """A rating's answer as stored: sealed (where raters' keys on a clip follow a public rule,
    as the counterbalancing did before the labels came from per-rater bits of the sealed design
    seed, answers aligned by it would show at interim how well raters agree, hence how well
    they tell the sides apart); as given for a study without a key."""
    return answer if key is None else key.seal(answer, answer_aad(rater_id, trial_id))


def open_answer(key: Key | None, rater_id: int, trial_id: int, stored):
    """A stored answer as given (:func:`seal_answer`'s inverse; plain values pass through)."""
    if key is None or not isinstance(stored, str) or not stored.startswith(SCHEME + ":"):
        return stored
    return key.unseal(stored, answer_aad(rater_id, trial_id))
