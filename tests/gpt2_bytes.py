"""GPT-2's byte <-> printable-character map (openai/gpt-2, encoder.py's
bytes_to_unicode): the alphabet of byte-level BPE vocabularies (vocab.json,
merges.txt, tokenizer.json). Shared by the tokenizer tests and fixtures."""


def bytes_to_unicode():
    """dict: byte value 0-255 -> the one-character str GPT-2 writes for it."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))
