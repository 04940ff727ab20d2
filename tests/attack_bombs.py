"""Decompression bombs for tests/attack_test.py: small files that declare many pixels, written with the standard
library only (zlib for PNG, a hand-made entropy-coded segment for JPEG)."""
import struct
import zlib


def png(width, height, grey_bits=True):
    """A PNG of zeros: 1-bit grey (about 1/1000 of a byte a pixel once compressed) or 8-bit RGB."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    if grey_bits:
        ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
        row = b"\x00" * (1 + (width + 7) // 8)
    else:
        ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
        row = b"\x00" * (1 + 3 * width)
    z = zlib.compressobj(9)
    data = b"".join(z.compress(row) for _ in range(height)) + z.flush()
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def progressive_jpeg(width, height, components=3):
    """A progressive JPEG (SOF2) holding one DC scan: every block's DC difference coded with a 1-bit code, so the
    file is 1/64 of a bit a pixel and component, and the decoder must still keep every block's coefficients."""
    def segment(marker, body):
        return b"\xff" + bytes([marker]) + struct.pack(">H", len(body) + 2) + body
    out = b"\xff\xd8"
    out += segment(0xDB, b"\x00" + b"\x01" * 64)
    sof = struct.pack(">BHHB", 8, height, width, components)
    for c in range(components):
        sof += bytes([c + 1, 0x11, 0])
    out += segment(0xC2, sof)
    out += segment(0xC4, b"\x00" + bytes([1] + [0] * 15) + b"\x00")  # DC table 0: one 1-bit code for category 0
    sos = bytes([components]) + b"".join(bytes([c + 1, 0x00]) for c in range(components)) + b"\x00\x00\x00"
    out += segment(0xDA, sos)
    blocks = ((width + 7) // 8) * ((height + 7) // 8) * components
    out += b"\x00" * ((blocks + 7) // 8)
    return out + b"\xff\xd9"


if __name__ == "__main__":  # write one, to measure a decode by hand: attack_bombs.py png|jpeg|rgbpng W H OUT
    import sys
    kind, w, h, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    data = {"png": lambda: png(w, h), "rgbpng": lambda: png(w, h, False), "jpeg": lambda: progressive_jpeg(w, h)}[kind]()
    open(path, "wb").write(data)
