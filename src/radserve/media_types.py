"""Media types and the Accept header (RFC 9110 12.5.1), for every HTTP edge: DICOMweb's
negotiation (:mod:`radserve.gateway.dicomweb`) and the API's one rule for routes with one
representation (:mod:`radserve.api.negotiation`). A module of its own, importing nothing
but :mod:`radserve.errors`, so that an API reader process can negotiate without loading
the DICOM gateway."""

from __future__ import annotations

from dataclasses import dataclass, field

from radserve.errors import RadserveError


class NotAcceptableError(RadserveError):
    """No representation the client accepts can be produced (HTTP 406)."""

    code = "not_acceptable"


@dataclass(frozen=True)
class MediaType:
    """A media type with lower-cased type and parameters (quotes removed).

    The one reading of a media type's parameters: a parameter given twice keeps its first
    value (as the upload body check of :mod:`radserve.api.middleware` reads a boundary)
    and is named in ``repeated``, for a caller to refuse (STOW-RS: ``boundary=BB;
    boundary=CC`` was framed by BB for the body check and parsed by CC, answering that
    the body was cut short)."""

    type: str
    params: dict[str, str] = field(default_factory=dict)
    repeated: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def parse(cls, text: str) -> MediaType:
        head, *rest = split_unquoted(text, ";")
        params: dict[str, str] = {}
        repeated: list[str] = []
        for item in rest:
            key, sep, value = item.partition("=")
            if sep:
                name = key.strip().lower()
                if name not in params:
                    params[name] = value.strip().strip('"').strip()
                elif name not in repeated:
                    repeated.append(name)
        return cls(head.strip().lower(), params, tuple(repeated))


def split_unquoted(text: str, separator: str) -> list[str]:
    """Split on ``separator`` outside double quotes."""
    out, current, quoted = [], [], False
    for char in text:
        if char == '"':
            quoted = not quoted
        if char == separator and not quoted:
            out.append("".join(current))
            current = []
        else:
            current.append(char)
    out.append("".join(current))
    return out


def is_json(media: str) -> bool:
    """Whether media type ``media`` (lower-cased, no parameters) is JSON: ``application/json``
    or a ``+json`` structured syntax suffix (RFC 6839: ``application/fhir+json``,
    ``application/dicom+json``)."""
    return media == "application/json" or media.endswith("+json")


def accepted_types(header: str | None) -> list[MediaType]:
    """The media ranges of an Accept header, q=0 ranges dropped; ``*/*`` when absent."""
    if not header or not header.strip():
        return [MediaType("*/*")]
    ranges = []
    for item in split_unquoted(header, ","):
        if not item.strip():
            continue
        media = MediaType.parse(item)
        try:
            if float(media.params.get("q", "1")) <= 0:
                continue
        except ValueError:
            continue
        ranges.append(media)
    return ranges


__all__ = ["MediaType", "NotAcceptableError", "accepted_types", "is_json", "split_unquoted"]
