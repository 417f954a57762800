"""``corpus.files.binary_reason`` counts the invalid UTF-8 bytes of the sniffed head in C (the lone
surrogates that ``surrogateescape`` made, dropped by a strict encode) and says what the
character-by-character count said, for any bytes."""
import codecs

from hypothesis import given, settings, strategies as st

from bpe_core.corpus.files import BINARY_SHARE, _CONTROL, binary_reason

#: bytes that make invalid and truncated UTF-8 often (lead bytes, continuations, encoded surrogates)
pieces = st.lists(st.one_of(st.binary(max_size=4), st.sampled_from([b"\xc3\xa9", b"\xed\xa0\x80", b"\xf0\x9f\x98",
                                                                   b"\x80", b"\xff", b"ab", b"\x01"])), max_size=40)


def _plain_reason(head: bytes):
    if not head:
        return None
    if b"\x00" in head:
        return "it has NUL bytes"
    text, consumed = codecs.utf_8_decode(head, "surrogateescape", False)
    invalid = sum(1 for ch in text if "\udc80" <= ch <= "\udcff")
    control = len(head[:consumed]) - len(head[:consumed].translate(None, _CONTROL))
    share = (invalid + control) / max(1, consumed)
    return share if consumed and share > BINARY_SHARE else None


@settings(max_examples=300, deadline=None)
@given(pieces)
def test_the_count_is_the_character_by_character_one(parts):
    head = b"".join(parts)
    plain = _plain_reason(head)
    got = binary_reason(head)
    if plain is None or isinstance(plain, str):
        assert got == plain
    else:
        assert got is not None and got.startswith(f"{plain:.0%} of its first")
