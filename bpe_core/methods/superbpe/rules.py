"""Which tokens SuperBPE's stage 2 may create, and the names of its choices: the merge rules
(:class:`Stage2Rules`, stored in the model file), the transition size (:func:`resolve_transition`)
and the stage-2 splits (:func:`normal_split`, :func:`model_split`)."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any, Optional

import regex

from ...formats.model import Model

DEFAULT_TRANSITION = 0.4
_DIGIT_RUN = regex.compile(r"\p{N}+")


@dataclass(frozen=True)
class Stage2Rules:
    """Which merged tokens stage 2 may create (stored in the model file)."""

    max_words: int = 4
    forbidden: tuple[str, ...] = (": ",)
    max_token_bytes: Optional[int] = None
    max_nonalnum: Optional[int] = None
    max_digits: Optional[int] = None
    distinct: bool = False

    def allows(self, left: bytes, right: bytes) -> bool:
        """Equivalent to ``reference.superbpe_allows`` (``distinct`` is checked by the caller, which
        knows the tokens so far).

        >>> Stage2Rules().allows(b" of", b" the"), Stage2Rules().allows(b"a:", b" b")
        (True, False)
        >>> Stage2Rules(max_digits=3).allows(b" 12", b"34")
        False
        """
        merged = left + right
        if len(merged.split()) > self.max_words:
            return False
        for f in self._forbidden_bytes:
            if f in merged:
                return False
        if self.max_token_bytes is not None and len(merged) > self.max_token_bytes:
            return False
        if self.max_nonalnum is None and self.max_digits is not None and merged.isascii():
            # (stage 2 asks before each of its merges, most of them ASCII) the only ASCII \p{N} are
            # 0-9, and ASCII bytes decode to themselves: the bytes searched for a run too long
            return self._ascii_digit_run.search(merged) is None
        if self.max_nonalnum is not None or self.max_digits is not None:
            text = merged.decode("utf-8", "surrogateescape")
            if self.max_nonalnum is not None:
                if sum(1 for c in text if not (c.isalnum() or c.isspace())) > self.max_nonalnum:
                    return False
            if self.max_digits is not None:
                if any(len(r) > self.max_digits for r in _DIGIT_RUN.findall(text)):
                    return False
        return True

    @classmethod
    def from_config(cls, config) -> "Stage2Rules":
        """The rules a :class:`~bpe_core.config.TrainConfig` asks for."""
        return cls(max_words=config.max_words, forbidden=tuple(config.forbidden),
                   max_token_bytes=config.max_token_bytes, max_nonalnum=config.max_nonalnum,
                   max_digits=config.max_digits, distinct=not config.stage2_duplicates)

    @cached_property
    def _forbidden_bytes(self) -> tuple[bytes, ...]:
        return tuple(f.encode("utf-8") for f in self.forbidden)

    @cached_property
    def _ascii_digit_run(self) -> "re.Pattern[bytes]":
        """A run of more than ``max_digits`` ASCII digits."""
        return re.compile(rb"[0-9]{%d}" % (int(self.max_digits or 0) + 1))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["forbidden"] = list(self.forbidden)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Stage2Rules":
        return cls(max_words=int(d.get("max_words", 4)), forbidden=tuple(d.get("forbidden", (": ",))),
                   max_token_bytes=d.get("max_token_bytes"), max_nonalnum=d.get("max_nonalnum"),
                   max_digits=d.get("max_digits"), distinct=bool(d.get("distinct", False)))


def resolve_transition(transition: float | int | None, vocab_size: int, n_specials: int) -> int:
    """The vocabulary size at the transition: an int is a size, a float in (0, 1] a fraction.

    >>> resolve_transition(0.4, 10000, 1), resolve_transition(3000, 10000, 1), resolve_transition(None, 1000, 0)
    (4000, 3000, 400)
    >>> resolve_transition(0.4, 300, 1)       # a fraction below 256 + specials starts at the base
    257
    """
    base = 256 + n_specials
    if transition is None:
        transition = DEFAULT_TRANSITION
    if isinstance(transition, float) and transition <= 1:
        if transition <= 0:
            raise ValueError(f"transition fraction must be in (0, 1], got {transition}")
        size = max(base, int(round(transition * vocab_size)))     # a fraction never goes below the base
    else:
        size = int(transition)
    if size < base or size > vocab_size:
        raise ValueError(f"transition {size} must be between {base} (256 + special tokens) and vocab_size {vocab_size}")
    return size


SPLITS = ("hf", "units", "default", "official")


def normal_split(split: str) -> str:
    """The canonical name of a stage-2 split (``"default"``, its name in older files, is ``"units"``).

    >>> normal_split("default"), normal_split("hf")
    ('units', 'hf')
    """
    if split not in SPLITS:
        raise ValueError(f"unknown stage2_split {split!r} (hf, units, official)")
    return "units" if split == "default" else split


def model_split(model: Model) -> str:
    """The stage-2 split a SuperBPE model was trained with (a file without the mark: ``"units"``)."""
    return normal_split(model.stages[1].get("split", "units")) if len(model.stages) > 1 else "units"


def valid_rules(rules: Any) -> bool:
    """Whether a ``model.json`` stage's ``"rules"`` is what :meth:`Stage2Rules.to_dict` writes.

    >>> valid_rules({"max_words": 4, "forbidden": [": "]}), valid_rules({"max_words": -1})
    (True, False)
    """
    def count(x):
        return isinstance(x, int) and not isinstance(x, bool) and x >= 0

    if not isinstance(rules, dict):
        return False
    if "max_words" in rules and not count(rules["max_words"]):
        return False
    if "forbidden" in rules and not (isinstance(rules["forbidden"], list)
                                     and all(isinstance(f, str) for f in rules["forbidden"])):
        return False
    return all(rules.get(k) is None or count(rules[k]) for k in ("max_token_bytes", "max_nonalnum"))
