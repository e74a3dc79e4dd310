"""What a failed field was given, and which group size or field order the records suggest.

A decode error names the field and the decoder's reason; when the records do not group the way ``fields=``
says (three fields for samples of two records, or the fields in another order), that reason alone is a
riddle (``ClassLabel(): invalid JSON: str is not valid UTF-8``).  :func:`field_note` adds, to the error of
a field:

- what its payload is (:func:`parrecio.decoders.sniff.describe`: "a JPEG image (5123 bytes, starting
  ...)"), unless the decoder's message says so already;
- when a field of the group was given a kind of payload its decoder does not read (its ``payload_kinds``),
  what the records nearby suggest: samples of another number of records
  (:func:`parrecio.decoders.sniff.guess_from_kinds` over successive records, more than one sample of the
  guessed size), or the same records in another order (a one-to-one match of the group's records to
  the decoders).

It runs only when a field failed, where the payloads still are.  The successive records are, in a
decoder process, the groups of its task around the failed one; with ``workers=0``, the first records of
the stream (sniffed as they are read); none in the Ray datasource or in a shuffled read (its groups are
not successive), which get the order check alone.  A suggestion is worded as one:
it comes from the kinds of a few records, not from decoding them.
"""

from __future__ import annotations

from itertools import permutations
from typing import Any, FrozenSet, Optional, Sequence, Tuple

from ..decoders.base import payload_kinds
from ..decoders.sniff import IMAGE_KINDS, describe, guess_from_kinds, sniff

__all__ = ["field_note", "group_hint", "payload_note"]

_WORDS = {"json": "JSON", "text": "text", "empty": "empty", "other": "binary", "image": "image"}
_MAX_PERMUTED = 6   # fields tried in every order (6! = 720 checks, on an error only)


def field_note(reason: str, decoders: Sequence[Any], group: Sequence[Any], failed: int,
               context: Optional[Sequence[str]] = None, where: str = "the records around it",
               group_at: Optional[int] = None) -> str:
    """The text to append to the reason of field ``failed``'s error (``""`` for none): what its payload
    is, then :func:`group_hint`.  ``group``: the failed group's payloads; ``context``: the
    :func:`~parrecio.decoders.sniff.sniff` kinds of successive records of its stream (None: unknown), which
    ``where`` names; ``group_at``: where the failed group's records are in it, if they are."""
    kinds = [sniff(p) for p in group]
    parts = [payload_note(reason, group[failed]), group_hint(decoders, kinds, context, where, group_at)]
    text = "; ".join(p for p in parts if p)
    return f"; {text}" if text else ""


def payload_note(reason: str, payload: Any) -> str:
    """``"the payload is <describe(payload)>"``, or ``""`` when ``reason`` already says that."""
    try:
        what = describe(payload)
    except Exception:  # not bytes-like: nothing to say
        return ""
    return "" if what in reason else f"the payload is {what}"


def group_hint(decoders: Sequence[Any], group: Sequence[str], context: Optional[Sequence[str]] = None,
               where: str = "the records around it", group_at: Optional[int] = None) -> str:
    """A sentence suggesting another group size or field order, or ``""``.

    Only when a record of the group (whose kinds are ``group``) is of a kind its decoder does not read
    (decoders without ``payload_kinds`` read anything).  First the group size:
    :func:`~parrecio.decoders.sniff.guess_from_kinds` over ``context`` (successive records' kinds; the
    failed group's own, at ``group_at``, count as any kind: one odd payload in a stream grouped right would
    otherwise suggest a long group size that fits it), believed when they hold more than one sample of the
    size it finds (a sample's kinds seen again) and that size is not ``len(decoders)``.  Else the order:
    the group's records matched one to one to decoders that read them.
    """
    nf = len(decoders)
    wanted = [payload_kinds(d) for d in decoders]
    if len(group) != nf or all(_reads(w, k) for w, k in zip(wanted, group)):
        return ""
    guess: Tuple[str, ...] = ()
    if context:
        kinds = list(context)
        if group_at is not None:
            kinds[group_at:group_at + nf] = ["empty"] * len(kinds[group_at:group_at + nf])
        try:
            guess = guess_from_kinds(kinds, max_group=8)
        except ValueError:
            pass
    if guess and len(guess) != nf and len(context or ()) > len(guess):
        return (f"{where} look like samples of {len(guess)} record{'s' * (len(guess) > 1)} "
                f"({_kinds(guess)}), not {nf} as fields= lists ({', '.join(map(repr, decoders))}): give "
                f"fields= one decoder per record of a sample, in the records' order")
    order = _order(wanted, group) if 1 < nf <= _MAX_PERMUTED else None
    if order is not None:
        fields = ", ".join(repr(decoders[f]) for f in order)
        return (f"the sample's records are ({_kinds(group)}): fields in the records' order would be "
                f"({fields})")
    return ""


def _reads(wanted: Optional[FrozenSet[str]], kind: str) -> bool:
    """Whether a decoder reading ``wanted`` kinds (None: any) takes a record of ``kind`` (a sniff kind, or
    guess_fields' merged "image"/"text")."""
    if wanted is None:
        return True
    if kind == "image":
        return bool(wanted & IMAGE_KINDS)
    if kind == "text":
        return bool(wanted & {"text", "json"})
    return kind in wanted


def _order(wanted: Sequence[Optional[FrozenSet[str]]], group: Sequence[str]) -> Optional[Tuple[int, ...]]:
    """``order[i]``: the decoder for record ``i``, a matching other than the given one where every decoder
    with kinds reads its record; None if there is none."""
    identity = tuple(range(len(group)))
    for order in permutations(identity):
        if order != identity and all(_reads(wanted[f], group[i]) for i, f in enumerate(order)):
            return order
    return None


def _kinds(kinds: Sequence[str]) -> str:
    return ", ".join(_WORDS.get(k, k.upper()) for k in kinds)
