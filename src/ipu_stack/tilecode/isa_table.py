"""The one instruction table of the encoder: mnemonic, opcode bits, fields.

Encodings are those of ``shared/docs/ipu21-facts.md`` §9.1 and §9.4 [T] (the reference
implementation's reverse-engineered IPU21 encodings). A field is ``(name, shift, width)``; a
field value is placed at ``(value & (2**width - 1)) << shift`` after a range check (never
silently masked). Every encoding *assumption* that the facts do not state is written beside
the entry as "assumed".

Exchange row semantics used by this project (assumed, the facts give roles, not a precise
timing contract; see README "Tile code"): a row instruction first waits its events
(``delay``/``delaypic``/``delayxpic``: the field holds events - 1), then acts; ``send`` acts at
once (0 events) and streams its items from that cycle on. A PIC pointer write takes effect from
the next cycle; an XPIC mux write from its own cycle.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Form:
    """One instruction: fixed opcode bits and the fields packed into the rest of the word."""

    mnemonic: str
    opcode: int
    fields: tuple[tuple[str, int, int], ...]
    note: str = ""


FORMS: dict[str, Form] = {
    f.mnemonic: f
    for f in (
        # facts §9.1: events - 1 in 19 bits
        Form("delay", 0x40A00000, (("events_m1", 0, 19),)),
        # facts §9.1: 7-bit events - 1, 1-bit selector, 18-bit value.
        # assumed: selector 0 writes the incoming pointer (a word address; selector 1 unused).
        Form("delaypic", 0x60000000, (("events_m1", 19, 7), ("sel", 18, 1), ("value", 0, 18))),
        # facts §9.1: 12-bit events - 1, 1-bit selector, 13-bit value (XPIC = $INCOMING_MUX).
        # assumed: selector 0 selects a source for 32-bit items, selector 1 for 64-bit paired
        # items (as a $INCOMING_MUXPAIR write, facts §7.6); value 0x1fff selects no source.
        Form("delayxpic", 0x64000000, (("events_m1", 14, 12), ("sel", 13, 1), ("value", 0, 13))),
        # facts §9.1: words - 1 (items - 1 in 64-bit mode) in 6 bits, 18-bit word address, sctl
        Form("send", 0x78000000, (("count_m1", 21, 6), ("word_address", 3, 18), ("sctl", 0, 3))),
        # facts §9.1 (decoded, never emitted by this project)
        Form(
            "sendoff",
            0x70000000,
            (("count_m1", 21, 6), ("count_high", 14, 6), ("delta", 3, 11), ("sctl", 0, 3)),
        ),
        Form("sendpic", 0x70100000, (("count_m1", 21, 6), ("sel", 18, 2), ("value", 0, 18))),
        # facts §9.1: sendpicp, two aligned words: the prefix, then ``picword``. With sctl 0 it
        # sends nothing ("0 advances without sending", facts §9.4) and only writes the controls:
        # this project emits it that way when an XPIC and a PIC write must act in one cycle.
        # assumed: it acts at once (0 events); picsel 0 = the pointer.
        Form(
            "sendpicp",
            0xF0000000,
            (("picsel", 27, 1), ("count_m1", 21, 6), ("word_address", 3, 18), ("sctl", 0, 3)),
        ),
        # facts §9.1: the second word, (xpic14 << 18) | pic18. assumed: xpic14 is the XPIC
        # selector (bit 13) and 13-bit mux value, as delayxpic's.
        Form("picword", 0x00000000, (("xpic", 18, 14), ("pic", 0, 18))),
        # facts §9.1 selectors: 0 receive, 1 ANS, 3 supervisor, 7 all, 15 host
        Form("sync", 0x41800000, (("zone", 0, 4),)),
        Form("trap", 0x41801000, (("code", 0, 12),)),
        Form("sans", 0x40C00000, ()),
        # facts §9.1: br $mN; assumed: branch to the address held in $mN (the return idiom)
        Form("br", 0x43000000, (("reg", 20, 4),)),
        # facts §9.4: put CSR, $mR
        Form("put", 0x43008000, (("reg", 20, 4), ("csr", 0, 8))),
        # facts §9.4: call $mR, addr (addr >> 2 in 19 bits, below 2**21).
        # assumed: $mR receives the return address (the registry ABI's $m10).
        Form("call", 0x18000000, (("reg", 20, 4), ("target_words", 0, 19))),
        # facts §9.4
        Form("setzi", 0x19000000, (("reg", 20, 4), ("imm", 0, 20))),
        # facts §9.4: ld32 dst, base, delta, off12; assumed: address = $base + $delta + 4 x off12
        # and register 15 reads as zero ($mzero).
        Form(
            "ld32", 0x01000000, (("base", 20, 4), ("dst", 16, 4), ("delta", 12, 4), ("off", 0, 12))
        ),
        # facts §9.4: st32 has the fields of ld32 (dst is the stored register)
        Form(
            "st32", 0x4F000000, (("base", 20, 4), ("src", 16, 4), ("delta", 12, 4), ("off", 0, 12))
        ),
        # facts §9.4: add $mD, $mS, simm16 (two's complement in 16 bits)
        Form("add", 0x22000000, (("src", 20, 4), ("dst", 16, 4), ("simm", 0, 16))),
        # facts §9.4: brz $mR, addr (addr >> 2); assumed: taken when $mR == 0
        Form("brz", 0x13000000, (("reg", 20, 4), ("target_words", 0, 19))),
    )
}

#: fields holding a two's-complement value
SIGNED_FIELDS = frozenset({("add", "simm")})

# Registers and values of the calling convention (kernels/registry.py ABI, facts §9.1).
LINK_REGISTER = 10  # $m10: return address (br $m10 = 0x43a00000, facts §9.1)
ZERO_REGISTER = 15  # assumed: $m15 reads as zero in address arithmetic
MUX_NONE = 0x1FFF  # assumed: XPIC value selecting no source
SYNC_SUPERVISOR = 3  # facts §9.1/§10.1: before each exchange, active tiles sync 3
SYNC_HOST = 15  # facts §9.1: host sync (input / output phases)
SCTL_PAIRED = 4  # facts §9.1: bit 2 selects 64-bit items
PIC_POINTER = 0
XPIC_WORDS, XPIC_PAIRED = 0, 1
