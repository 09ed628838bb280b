"""A certificate subject as Java's `X500Principal.getName()` writes it (RFC 2253).

Kafka's principal of a TLS client is that string, so ACLs and `ssl.principal.mapping.rules`
written for Kafka must meet the same characters here: RDNs from the last in the DER to the
first, joined by ","; the attributes of one RDN in their DER order, joined by "+"; the
keywords CN, C, L, ST, O, OU, STREET, DC and UID, every other attribute as its dotted OID
with `#` and the hex of its DER value (`1.2.840.113549.1.9.1=#16...` for an e-mail
address); in values, `,=+<>#;"\\` escaped with a backslash anywhere, NUL as `\\00`, and
leading and trailing spaces escaped. The subject's DER is walked here, not re-encoded,
so values and their order are the certificate's own.
"""

from __future__ import annotations

from cryptography import x509

RFC2253_KEYWORDS = {
    "2.5.4.3": "CN",
    "2.5.4.6": "C",
    "2.5.4.7": "L",
    "2.5.4.8": "ST",
    "2.5.4.9": "STREET",
    "2.5.4.10": "O",
    "2.5.4.11": "OU",
    "0.9.2342.19200300.100.1.25": "DC",
    "0.9.2342.19200300.100.1.1": "UID",
}
# DER string tags Java prints as text, and how their bytes decode.
_TEXT_TAGS = {
    0x0C: "utf-8",  # UTF8String
    0x13: "latin-1",  # PrintableString
    0x14: "latin-1",  # TeletexString
    0x16: "latin-1",  # IA5String
    0x1B: "latin-1",  # GeneralString
}
_ESCAPED = ',=+<>#;"\\'
_SEQUENCE, _SET, _OID = 0x30, 0x31, 0x06


def distinguished_name(cert: x509.Certificate) -> str:
    """The subject of `cert` as `X500Principal.getName()` gives it."""
    rdns = []
    for rdn in _elements(_content(cert.subject.public_bytes(), _SEQUENCE)):
        avas = []
        for ava in _elements(_content(rdn, _SET)):
            oid_der, value_der = _elements(_content(ava, _SEQUENCE))
            avas.append(_ava(_oid(_content(oid_der, _OID)), value_der))
        rdns.append("+".join(avas))
    return ",".join(reversed(rdns))


def _ava(oid: str, value_der: bytes) -> str:
    keyword = RFC2253_KEYWORDS.get(oid)
    encoding = _TEXT_TAGS.get(value_der[0])
    if keyword is None or encoding is None:
        return f"{keyword or oid}=#{value_der.hex()}"
    return f"{keyword}={_escaped(_header_and_content(value_der)[1].decode(encoding))}"


def _escaped(text: str) -> str:
    chars = "".join("\\00" if c == "\0" else "\\" + c if c in _ESCAPED else c for c in text)
    lead = len(chars) - len(chars.lstrip(" \r"))
    trail = len(chars.rstrip(" \r"))
    return "".join("\\" + c if i < lead or i >= trail else c for i, c in enumerate(chars))


def _header_and_content(der: bytes) -> tuple[int, bytes]:
    """The tag and content of the DER element at the start of `der` (its end: `_length`)."""
    tag, start, length = _header(der)
    return tag, der[start : start + length]


def _header(der: bytes) -> tuple[int, int, int]:
    if len(der) < 2:
        raise ValueError("truncated DER element")
    first = der[1]
    if first < 0x80:
        return der[0], 2, first
    size = first & 0x7F
    if not 0 < size <= 4 or len(der) < 2 + size:
        raise ValueError("bad DER length")
    return der[0], 2 + size, int.from_bytes(der[2 : 2 + size], "big")


def _content(der: bytes, tag: int) -> bytes:
    found, content = _header_and_content(der)
    if found != tag:
        raise ValueError(f"expected DER tag {tag:#x}, found {found:#x}")
    return content


def _elements(content: bytes) -> list[bytes]:
    """The whole DER elements that `content` is a run of."""
    elements = []
    while content:
        _, start, length = _header(content)
        elements.append(content[: start + length])
        content = content[start + length :]
    return elements


def _oid(content: bytes) -> str:
    arcs, value = [], 0
    for byte in content:
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            arcs.append(value)
            value = 0
    first = min(arcs[0] // 40, 2)
    return ".".join(map(str, [first, arcs[0] - 40 * first, *arcs[1:]]))
