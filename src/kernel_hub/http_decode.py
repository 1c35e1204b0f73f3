"""Content-Encoding undone piece by piece, so a size cap counts the bytes an answer inflates to, not the bytes on the
wire: a few KB of gzip (or gzip inside gzip) can inflate to GBs, and each step here yields at most PIECE bytes.

Only the encodings a Hub uses are accepted (gzip, deflate, identity, each layer at most MAX_LAYERS deep); an answer
in any other (br, zstd, compress) is refused, since it could not be bounded here.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator

#: The most bytes one decoding step yields: memory per answer stays near this, whatever the compression ratio.
PIECE = 1 << 20
#: The most Content-Encoding layers an answer may stack.
MAX_LAYERS = 3
ACCEPTED = ("gzip", "x-gzip", "deflate", "identity")
#: What the client asks for: only what it can decode with a bound.
ACCEPT_ENCODING = "gzip, deflate"


class DecodeError(ValueError):
    """An answer whose Content-Encoding is not accepted or whose compressed bytes are damaged."""


def encodings(header: str | None) -> list[str]:
    """The layers of a Content-Encoding header that do something, in the order they were applied.

    Raises DecodeError for an encoding not in ACCEPTED or more than MAX_LAYERS layers."""
    layers = [part.strip().lower() for part in (header or "").split(",") if part.strip()]
    unknown = [layer for layer in layers if layer not in ACCEPTED]
    if unknown:
        raise DecodeError(f"Content-Encoding {unknown[0][:20]!r} is not accepted (only {', '.join(ACCEPTED[:3])})")
    layers = [layer for layer in layers if layer != "identity"]
    if len(layers) > MAX_LAYERS:
        raise DecodeError(f"{len(layers)} Content-Encoding layers (at most {MAX_LAYERS})")
    return layers


def _inflate(chunks: Iterable[bytes], layer: str) -> Iterator[bytes]:
    """One layer undone, each yielded piece at most PIECE bytes long."""
    wbits = 16 + zlib.MAX_WBITS if layer in ("gzip", "x-gzip") else zlib.MAX_WBITS
    decoder = zlib.decompressobj(wbits)
    first = True
    try:
        for chunk in chunks:
            data = chunk
            while data:
                try:
                    out = decoder.decompress(data, PIECE)
                except zlib.error:
                    if not (first and layer == "deflate"):
                        raise
                    decoder = zlib.decompressobj(-zlib.MAX_WBITS)  # deflate without its zlib header, as servers send
                    out = decoder.decompress(data, PIECE)
                first = False
                data = decoder.unconsumed_tail
                if out:
                    yield out
                if decoder.eof:
                    break
        while not decoder.eof and (out := decoder.decompress(b"", PIECE)):
            yield out
    except zlib.error as exc:
        raise DecodeError(f"damaged {layer} data ({exc})") from None


def decoded(chunks: Iterable[bytes], layers: list[str]) -> Iterator[bytes]:
    """`chunks` with every layer undone, last applied first."""
    stream: Iterable[bytes] = chunks
    for layer in reversed(layers):
        stream = _inflate(stream, layer)
    yield from stream
