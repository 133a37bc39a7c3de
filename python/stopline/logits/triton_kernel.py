"""One fused Triton kernel for the logits-constraint pipeline (docs/semantics.md section 8).

One launch per call, on a grid of rows x chunks. Per row, in order:

1. sparse semantic masks: static single-token bans, then multi-token bad words
   whose prefix matches the output tail (history ring + draft tokens);
2. a pass over the row that writes ``-inf`` where the grammar bitmask or the
   slot's dense token mask clears a bit, and counts the finite logits left
   (per 16-byte vector: read only if it holds a kept logit, written only if it
   holds a masked one);
3. ``min_tokens``: gather the stop logits, subtract the finite ones from the
   count; if nothing finite would remain and the policy allows a restore,
   leave the finite stop logits (the restore) and write ``-inf`` over the
   others, else write ``-inf`` over all of them;
4. ``logit_bias`` on the bias ids, adjusting the count;
5. ``infeasible = (count == 0)``.

A forced row (``LogitsConstraints.force``) is a dense row whose keep mask is the
forced id's bit alone (no mask word is read, no ban written); steps 3-4 are
skipped and the forced logit is set to 0 if it is not finite.

Which rows pay for a full-row pass. Only rows with a dense mask (a grammar row
with a bitmask, a slot with ``allowed_token_ids``/many bans, a forced row) cover
the whole row, and they read only the vectors that hold a kept logit. Every other row changes at
most K = (bans + bad words + stop ids + bias ids) entries, all sparse, so it
can only end empty if it has few finite logits. Such a row is handled by its
chunk-0 program alone: after the sparse bans it counts finite logits block by
block and stops as soon as the count exceeds the number of entries steps 3-4
could still remove (stop ids masked + bias ids). With model logits (finite)
that is the first block (``SCAN_WORDS * 32`` elements), so a min_tokens-only
row reads one block and writes a handful of entries. Only a row that really is
(nearly) empty keeps scanning, which makes ``infeasible`` exact for every
input, including rows that were all ``-inf`` or NaN on entry.

How a dense row is split. One program streaming a whole row leaves too few
bytes in flight when rows are few (bfloat16 at 256 rows reached ~60% of the
copy bandwidth of an H200), so a dense row is cut into ``n_chunks`` contiguous
runs of bitmask words (grid axis 1; the host picks the count from rows, vocab,
dtype and SM count so the grid fills the GPU). Each chunk program applies step
1 and step 2 to its own range only (a ban is written by the chunk that owns the
index, so no program reads what another writes before the count is done) and
adds its finite count to the row's int64 scratch word together with 2**32
(``atomic_add``, acq_rel: the chunk's stores are released, the total is
acquired). The program that sees ``n_chunks - 1`` earlier arrivals holds the
full count and alone runs steps 3-5, then resets the scratch word to 0 for the
next call. Still one launch, no host sync, and the scratch buffer is allocated
once per state and reused, so ``apply`` can be captured in a CUDA graph. The
stop and bias tables are loaded before the arrival, and the last program
gathers the stop and bias logits together, so the launch's tail is one memory
round trip after the atomic. When the last program reads no logit another chunk
wrote (no active stop id, bias id or forced id) the arrival is a relaxed atomic.
A grammar row's first tile (mask words and kept logits) is loaded beside the
row's slot, before the slot's tables are known, when no ban is written before
the pass (a launch without bans or bad words). Slot-indexed loads that cannot matter are
compiled out (``min_tokens`` without stop ids; the forced id when no slot can be
forced, ``HAS_FORCED``), since each one waits for the slot.

The dense loop is latency-bound: what counts is the bytes in flight per
multiprocessor. So a tile is 64 mask words (each thread then loads its rows'
words itself, with no shared-memory shuffle), a tile's mask words are loaded two
tiles ahead and its kept vectors one tile ahead (a logit load waits for its mask
bits), and 16-bit logits are handled as uint32 pairs with integer ops (half the
instructions of widening each logit to float32 and back, and half the registers),
so ~10 programs share a multiprocessor. Tiles stay 2-D ([words, 32] or [words, 16]
pairs) with each vector's mask bits picked by a shift constant over the vector, so
the predicated loads and stores stay 16 bytes wide; a 3-D tile got an uncoalesced
layout from Triton 3.6 (2x slower on the H200). When one wave of such
programs still gives each row >= 2 chunks, the grid is exactly one wave (no tail
wave); with more rows it aims at ~4 waves.

Counting instead of re-scanning: stop ids and bias ids are distinct per slot
(``set`` dedupes), so the finite count after each sparse step is the count
before it minus the finite values removed plus the finite values written; no
membership test is needed. Within a program, the writes of one step are made
visible to the loads of the next by ``tl.debug_barrier()`` (a CTA barrier,
which orders global memory for the block's threads).

Reads and writes are bounds-checked against ``vocab_size`` in the kernel too, so
even a corrupted id could never become an out-of-bounds write; a row whose slot
is out of range is left untouched and reported infeasible.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .tuning import KernelTuning, interpreting

# Tile configs and other launch knobs: stopline.logits.tuning.KernelTuning.


@triton.jit
def _sparse_bans(row_ptr, row64, slot, pos, lo, hi, ban_ptr, bad_prefix_ptr, bad_plen_ptr, bad_last_ptr,
                 hist_ptr, hist_len_ptr, draft_ptr, draft_stride, draft_width,
                 N_BAN: tl.constexpr, N_BAD: tl.constexpr, N_PFX: tl.constexpr, HAS_DRAFT: tl.constexpr):
    """Step 1 (sparse part) for the tokens in [lo, hi) of the row."""
    NEG = float("-inf")
    # 1a. static single-token bans.
    if N_BAN > 0:
        ban = tl.load(ban_ptr + slot * N_BAN + tl.arange(0, N_BAN))
        tl.store(row_ptr + ban, NEG, mask=(ban >= lo) & (ban < hi))
    # 1b. multi-token bad words: token at output position q comes from the
    # history ring (n - N_PFX <= q < n) or the row's draft tokens (q >= n).
    if N_BAD > 0:
        n_hist = tl.load(hist_len_ptr + slot).to(tl.int64)
        b = tl.arange(0, N_BAD)
        k = tl.arange(0, N_PFX)
        plen = tl.load(bad_plen_ptr + slot * N_BAD + b).to(tl.int64)
        prefix = tl.load(bad_prefix_ptr + slot * (N_BAD * N_PFX) + b[:, None] * N_PFX + k[None, :])
        q = pos - plen[:, None] + k[None, :]
        need = k[None, :] < plen[:, None]
        from_hist = need & (q >= 0) & (q < n_hist) & (q >= n_hist - N_PFX)
        tok = tl.load(hist_ptr + slot * N_PFX + (q % N_PFX), mask=from_hist, other=-1)
        if HAS_DRAFT:
            d_idx = q - n_hist
            from_draft = need & (d_idx >= 0) & (d_idx < draft_width)
            draft = tl.load(draft_ptr + row64 * draft_stride + d_idx, mask=from_draft, other=-1)
            tok = tl.where(from_draft, draft.to(tl.int32), tok)
        miss = need & (tok != prefix)
        fires = (tl.sum(miss.to(tl.int32), axis=1) == 0) & (plen > 0)
        last = tl.load(bad_last_ptr + slot * N_BAD + b)
        tl.store(row_ptr + last, NEG, mask=fires & (last >= lo) & (last < hi))


@triton.jit
def _mask_words(bitmask_ptr, allowed_ptr, start, w_hi, use_bitmask, use_allowed, forced, pre,
                DENSE_WORDS: tl.constexpr, HAS_BITMASK: tl.constexpr, HAS_ALLOWED: tl.constexpr,
                PRE: tl.constexpr = False):
    """The row's keep bits for words ``widx``: grammar bitmask AND the slot's dense mask; on a
    forced row (``forced >= 0``) only the forced id's bit, and no mask word is read. With ``PRE``
    the grammar words are ``pre`` (the first tile's, loaded by the kernel before the slot)."""
    widx = start + tl.arange(0, DENSE_WORDS)
    wok = widx < w_hi
    bits = widx * 0 - 1
    if PRE:
        bits = tl.where(use_bitmask != 0, pre, bits)
    elif HAS_BITMASK:
        bits = tl.load(bitmask_ptr + widx, mask=tl.where(use_bitmask != 0, wok, False), other=-1)
    if HAS_ALLOWED:
        bits = bits & tl.load(allowed_ptr + widx, mask=tl.where(use_allowed != 0, wok, False), other=-1)
    one = tl.where(widx == (forced >> 5), (1 << (forced & 31)).to(tl.int32), 0)
    return tl.where(forced >= 0, one, bits)


@triton.jit
def _tile_load(row_ptr, bits, start, w_hi, vocab,
               DENSE_WORDS: tl.constexpr, PAIRS: tl.constexpr, IS_BF16: tl.constexpr):
    """Loads of one tile's logits, [DENSE_WORDS, 32] (float) or [DENSE_WORDS, 16] (16-bit logits
    as uint32 pairs); only the 16-byte vectors that hold a kept logit are read, the others read
    as -inf (masked logits are written without being read). The vector's mask
    bits are selected by a shift that is constant over the vector, so the loads stay 16 bytes."""
    widx = start + tl.arange(0, DENSE_WORDS)
    wok = widx < w_hi
    ubits = bits.to(tl.uint32, bitcast=True)
    if PAIRS:
        # Pair c of word w holds tokens 32w+2c (low half) and 32w+2c+1 (high half); vector c//4
        # is the word's byte c//4.
        NEG2: tl.constexpr = 0xFF80FF80 if IS_BF16 else 0xFC00FC00  # -inf twice
        c = tl.arange(0, 16)
        idx = widx[:, None] * 16 + c[None, :]
        ok = (idx < vocab // 2) & wok[:, None]
        ok = ok & (((ubits[:, None] >> (c // 4 * 8)[None, :]) & 0xFF) != 0)
        v = tl.load(row_ptr.to(tl.pointer_type(tl.uint32), bitcast=True) + idx, mask=ok, other=NEG2)
    else:
        lane = tl.arange(0, 32)
        idx = widx[:, None] * 32 + lane[None, :]
        ok = (idx < vocab) & wok[:, None]
        ok = ok & (((ubits[:, None] >> (lane // 4 * 4)[None, :]) & 0xF) != 0)
        v = tl.load(row_ptr + idx, mask=ok, other=float("-inf"))
    return v


@triton.jit
def _tile_apply(row_ptr, v, bits, start, w_hi, vocab, acc,
                DENSE_WORDS: tl.constexpr, PAIRS: tl.constexpr, IS_BF16: tl.constexpr):
    """Mask one tile, store only the 16-byte vectors that hold a masked logit, count its kept
    finite logits."""
    widx = start + tl.arange(0, DENSE_WORDS)
    wok = widx < w_hi
    ubits = bits.to(tl.uint32, bitcast=True)
    if PAIRS:
        NEG2: tl.constexpr = 0xFF80FF80 if IS_BF16 else 0xFC00FC00
        EXP2: tl.constexpr = 0x7F807F80 if IS_BF16 else 0x7C007C00  # exponent bits of both halves
        c = tl.arange(0, 16)
        idx = widx[:, None] * 16 + c[None, :]
        byte = (ubits[:, None] >> (c // 4 * 8)[None, :]) & 0xFF
        # Integer masking, no unpacking to float: even bits (low halves) stay at 2k, odd bits
        # (high halves) go to 16+2k; keep15 has bit 15 (31) set where the low (high) half of
        # pair c = 4q+k is kept.
        u = (byte & 0x55) | ((byte & 0xAA) << 15)
        keep15 = (u << (15 - 2 * (c % 4))[None, :]) & 0x80008000
        m = (keep15 >> 15) * 0xFFFF
        y = (v & m) | (NEG2 & ~m)
        tl.store(row_ptr.to(tl.pointer_type(tl.uint32), bitcast=True) + idx, y,
                 mask=(idx < vocab // 2) & wok[:, None] & (byte != 0xFF))
        # A half of v is finite iff its exponent bits are not all set: then ~v & EXP2 is non-zero in
        # that half, and adding 0x7FFF sets the half's top bit (never carrying into the other half).
        fin15 = (~v & EXP2) + 0x7FFF7FFF
        # Kept and finite, per half: counts in the low and high 16 bits of each (word, byte).
        return acc + tl.sum(tl.reshape((fin15 & keep15) >> 15, [DENSE_WORDS, 4, 4]), axis=2)
    else:
        lane = tl.arange(0, 32)
        idx = widx[:, None] * 32 + lane[None, :]
        keep = ((ubits[:, None] >> lane[None, :]) & 1) != 0
        y = tl.where(keep, v, float("-inf"))
        tl.store(row_ptr + idx, y,
                 mask=(idx < vocab) & wok[:, None] & (((ubits[:, None] >> (lane // 4 * 4)[None, :]) & 0xF) != 0xF))
        fin = (tl.abs(y.to(tl.float32)) < float("inf")).to(tl.int32)
        # Summed over each thread's own 4 consecutive logits: no cross-thread traffic.
        return acc + tl.sum(tl.reshape(fin, [DENSE_WORDS, 8, 4]), axis=2)


@triton.jit
def _dense_pass(row_ptr, bm_row, al_row, w_lo, w_hi, vocab, use_bitmask, use_allowed, forced, bits0, v0,
                DENSE_WORDS: tl.constexpr, HAS_BITMASK: tl.constexpr, HAS_ALLOWED: tl.constexpr,
                PAIRS: tl.constexpr, IS_BF16: tl.constexpr, PREFETCH: tl.constexpr, EARLY: tl.constexpr):
    """Step 2 over bitmask words [w_lo, w_hi) of the row; returns the kept finite count. With
    ``EARLY``, ``bits0``/``v0`` are the first tile's grammar words and the logits they keep."""
    # Per-thread counters, reduced once after the loop: a reduction per tile would put
    # CTA barriers in every iteration.
    if PAIRS:
        acc = tl.zeros([DENSE_WORDS, 4], tl.uint32)  # two 16-bit counters per (word, byte)
    else:
        acc = tl.zeros([DENSE_WORDS, 8], tl.int32)
    bits = _mask_words(bm_row, al_row, w_lo, w_hi, use_bitmask, use_allowed, forced, bits0,
                       DENSE_WORDS, HAS_BITMASK, HAS_ALLOWED, EARLY)
    if EARLY:
        # v0 holds every vector the final bits keep unless the row is not a grammar row or is
        # forced (bits not a subset of bits0): only then is the tile read again.
        early_ok = (use_bitmask != 0) & (forced < 0)
        v = _tile_load(row_ptr, tl.where(early_ok, 0, bits), w_lo, w_hi, vocab, DENSE_WORDS, PAIRS, IS_BF16)
        v = tl.where(early_ok, v0, v)
    else:
        v = _tile_load(row_ptr, bits, w_lo, w_hi, vocab, DENSE_WORDS, PAIRS, IS_BF16)
    if PREFETCH:
        # A tile's logits load waits for its mask words, so the words are loaded two tiles
        # ahead and the logits one tile ahead of the tile being masked.
        bits_next = _mask_words(bm_row, al_row, w_lo + DENSE_WORDS, w_hi, use_bitmask, use_allowed, forced, bits0,
                                DENSE_WORDS, HAS_BITMASK, HAS_ALLOWED)
        for start in range(w_lo, w_hi, DENSE_WORDS):
            v_next = _tile_load(row_ptr, bits_next, start + DENSE_WORDS, w_hi, vocab, DENSE_WORDS, PAIRS, IS_BF16)
            bits_after = _mask_words(bm_row, al_row, start + 2 * DENSE_WORDS, w_hi, use_bitmask, use_allowed,
                                     forced, bits0, DENSE_WORDS, HAS_BITMASK, HAS_ALLOWED)
            acc = _tile_apply(row_ptr, v, bits, start, w_hi, vocab, acc, DENSE_WORDS, PAIRS, IS_BF16)
            v = v_next
            bits = bits_next
            bits_next = bits_after
    else:
        acc = _tile_apply(row_ptr, v, bits, w_lo, w_hi, vocab, acc, DENSE_WORDS, PAIRS, IS_BF16)
        for start in range(w_lo + DENSE_WORDS, w_hi, DENSE_WORDS):
            bits = _mask_words(bm_row, al_row, start, w_hi, use_bitmask, use_allowed, forced, bits0,
                               DENSE_WORDS, HAS_BITMASK, HAS_ALLOWED)
            v = _tile_load(row_ptr, bits, start, w_hi, vocab, DENSE_WORDS, PAIRS, IS_BF16)
            acc = _tile_apply(row_ptr, v, bits, start, w_hi, vocab, acc, DENSE_WORDS, PAIRS, IS_BF16)
    if PAIRS:
        return (tl.sum(tl.sum(acc & 0xFFFF, axis=1), axis=0) + tl.sum(tl.sum(acc >> 16, axis=1), axis=0)).to(tl.int32)
    else:
        return tl.sum(tl.sum(acc, axis=1), axis=0)


@triton.jit
def _tail_tables(slot, stop_ptr, restore_ptr, bias_id_ptr, bias_val_ptr, N_STOP: tl.constexpr, N_BIAS: tl.constexpr):
    """The slot's stop ids, restore policy, bias ids and values (loaded early: they depend on no logit)."""
    stops = slot * 0
    policy = slot.to(tl.int32) * 0
    bias_ids = slot * 0
    bv = slot.to(tl.float32) * 0
    if N_STOP > 0:
        stops = tl.load(stop_ptr + slot * N_STOP + tl.arange(0, N_STOP))
        policy = tl.load(restore_ptr + slot)
    if N_BIAS > 0:
        bias_ids = tl.load(bias_id_ptr + slot * N_BIAS + tl.arange(0, N_BIAS))
        bv = tl.load(bias_val_ptr + slot * N_BIAS + tl.arange(0, N_BIAS))
    return stops, policy, bias_ids, bv


@triton.jit
def _finish_row(row_ptr, infeasible_ptr, row, count, exact, is_grammar, min_active, forced, vocab,
                stops, policy, bias_ids, bv,
                N_STOP: tl.constexpr, N_BIAS: tl.constexpr, IS_BF16: tl.constexpr):
    """Steps 3-5, given the row's finite count after steps 1-2 (exact or a lower bound).
    A forced row (``forced >= 0``) skips steps 3-4: its forced logit becomes 0 if not finite."""
    NEG = float("-inf")
    min_active = tl.where(forced < 0, min_active, False)
    INF = float("inf")  # finite(x) is written |x| < INF: false for +-inf and NaN
    # The stop and bias logits are gathered together (one memory round trip at the tail of
    # the launch); a bias id that is also a stop id reads -inf when the stops get masked.
    MERGED: tl.constexpr = (N_STOP > 0) & (N_BIAS > 0) & (N_STOP * N_BIAS <= 2048)
    if N_BIAS > 0:
        bias_ok = tl.where(forced < 0, (bias_ids >= 0) & (bias_ids < vocab), False)
        if MERGED:
            x = tl.load(row_ptr + bias_ids, mask=bias_ok, other=NEG)
    # 3. min_tokens with restore-when-all-masked.
    do_mask = min_active & False
    if N_STOP > 0:
        stop_ok = (stops >= 0) & (stops < vocab)
        sv = tl.load(row_ptr + stops, mask=stop_ok, other=NEG)
        sv_finite = tl.abs(sv.to(tl.float32)) < INF
        left = count - tl.sum((stop_ok & sv_finite).to(tl.int32), axis=0)
        may_restore = (policy == 2) | ((policy == 1) & (is_grammar != 0))
        restore = min_active & exact & (left == 0) & may_restore
        do_mask = min_active & (restore == 0)
        # Masked, or not finite and so not put back by a restore.
        dropped = stop_ok & (do_mask | (sv_finite == 0))
        dropped = tl.where(min_active, dropped, False)
        tl.store(row_ptr + stops, NEG, mask=dropped)
        count = tl.where(do_mask, left, count)
    if not MERGED:
        tl.debug_barrier()

    # 4. logit_bias: float32 add, one rounding to the logits dtype.
    if N_BIAS > 0:
        if MERGED:
            masked = (bias_ids[:, None] == stops[None, :]) & dropped[None, :]
            x32 = tl.where(tl.max(masked.to(tl.int32), axis=1) != 0, NEG, x.to(tl.float32))
        else:
            x32 = tl.load(row_ptr + bias_ids, mask=bias_ok, other=NEG).to(tl.float32)
        y32 = x32 + bv
        if IS_BF16:
            # Round to nearest even by hand: the interpreter's bf16 cast truncates,
            # and this must match torch bit for bit on every backend.
            bits = y32.to(tl.uint32, bitcast=True)
            bits = bits + 0x7FFF + ((bits >> 16) & 1)
            y = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
            y = tl.where(y32 != y32, y32.to(tl.bfloat16), y)
        else:
            y = y32.to(row_ptr.dtype.element_ty)
        # Same value as the stop store where both write (-inf), so the two need no ordering.
        tl.store(row_ptr + bias_ids, y, mask=bias_ok)
        count += tl.sum((bias_ok & (tl.abs(y.to(tl.float32)) < INF)).to(tl.int32), axis=0)
        count -= tl.sum((bias_ok & (tl.abs(x32) < INF)).to(tl.int32), axis=0)
    if forced >= 0:
        tl.debug_barrier()
        fx = tl.load(row_ptr + forced)
        tl.store(row_ptr + forced, 0.0, mask=(tl.abs(fx.to(tl.float32)) < INF) == 0)
        count = 1
    tl.store(infeasible_ptr + row, count == 0)


@triton.jit
def _constraints_kernel(
    logits_ptr,
    logits_stride,
    infeasible_ptr,
    scratch_ptr,
    slots_ptr,
    pos_ptr,
    grammar_ptr,
    bitmask_ptr,
    bitmask_stride,
    draft_ptr,
    draft_stride,
    draft_width,
    min_tokens_ptr,
    restore_ptr,
    stop_ptr,
    ban_ptr,
    has_allowed_ptr,
    allowed_ptr,
    bad_prefix_ptr,
    bad_plen_ptr,
    bad_last_ptr,
    hist_ptr,
    hist_len_ptr,
    bias_id_ptr,
    bias_val_ptr,
    forced_ptr,
    max_slots,
    vocab,
    num_words,
    chunk_words,
    HAS_BITMASK: tl.constexpr,
    HAS_GRAMMAR_ROWS: tl.constexpr,
    HAS_DRAFT: tl.constexpr,
    HAS_ALLOWED: tl.constexpr,
    SPLIT: tl.constexpr,
    N_STOP: tl.constexpr,
    N_BAN: tl.constexpr,
    N_BAD: tl.constexpr,
    N_PFX: tl.constexpr,
    N_BIAS: tl.constexpr,
    DENSE_WORDS: tl.constexpr,
    SCAN_WORDS: tl.constexpr,
    IS_BF16: tl.constexpr,
    PAIRS: tl.constexpr,
    PREFETCH: tl.constexpr,
    EARLY: tl.constexpr,
    HAS_FORCED: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    row64 = row.to(tl.int64)
    row_ptr = logits_ptr + row64 * logits_stride
    bm_row = bitmask_ptr + row64 * bitmask_stride
    w_lo = chunk * chunk_words
    w_hi = tl.minimum(w_lo + chunk_words, num_words)
    # Rows with a grammar (for the bitmask and the "structured" policy).
    if HAS_GRAMMAR_ROWS:
        is_grammar = tl.load(grammar_ptr + row).to(tl.int32)
    else:
        is_grammar = (row * 0 + HAS_BITMASK).to(tl.int32)
    use_bitmask = is_grammar * HAS_BITMASK
    bits0 = row * 0
    v0 = row * 0
    if EARLY:
        # Row-indexed, so issued before the slot is known: the first tile's grammar words and
        # the logits they keep (reads only; nothing is written before the slot is checked).
        # A row without a grammar reads nothing here.
        none = row * 0
        bits0 = _mask_words(bm_row, bm_row, w_lo, w_hi, use_bitmask, none, none - 1, none, DENSE_WORDS, True, False)
        bits0 = tl.where(use_bitmask != 0, bits0, 0)
        v0 = _tile_load(row_ptr, bits0, w_lo, w_hi, vocab, DENSE_WORDS, PAIRS, IS_BF16)
    slot = tl.load(slots_ptr + row).to(tl.int64)
    pos = tl.load(pos_ptr + row).to(tl.int64)
    slot_ok = (slot >= 0) & (slot < max_slots)
    NEG = float("-inf")
    INF = float("inf")
    if slot_ok:
        if HAS_ALLOWED:
            use_allowed = tl.load(has_allowed_ptr + slot)
        else:
            use_allowed = is_grammar * 0
        # Slot-indexed loads wait for the slot: made only where they can matter.
        if N_STOP > 0:
            min_active = pos < tl.load(min_tokens_ptr + slot).to(tl.int64)
        else:
            min_active = pos < 0
        if HAS_FORCED:
            # The slot's forced token id, -1 if none (an id outside the vocab counts as none).
            forced = tl.load(forced_ptr + slot)
            forced = tl.where((forced >= 0) & (forced < vocab), forced, -1)
        else:
            forced = tl.full([], -1, tl.int32)

        if (use_bitmask != 0) | (use_allowed != 0) | (forced >= 0):
            # Dense row: this program owns bitmask words [w_lo, w_hi).
            stops, policy, bias_ids, bv = _tail_tables(slot, stop_ptr, restore_ptr, bias_id_ptr, bias_val_ptr,
                                                       N_STOP, N_BIAS)
            # A forced row gets no bans: every column but the forced one ends -inf anyway.
            ban_lo = tl.where(forced >= 0, vocab, w_lo * 32)
            _sparse_bans(row_ptr, row64, slot, pos, ban_lo, tl.minimum(w_hi * 32, vocab), ban_ptr,
                         bad_prefix_ptr, bad_plen_ptr, bad_last_ptr, hist_ptr, hist_len_ptr,
                         draft_ptr, draft_stride, draft_width, N_BAN, N_BAD, N_PFX, HAS_DRAFT)
            tl.debug_barrier()
            al_row = allowed_ptr + slot * num_words
            count = _dense_pass(row_ptr, bm_row, al_row, w_lo, w_hi, vocab, use_bitmask, use_allowed, forced,
                                bits0, v0, DENSE_WORDS, HAS_BITMASK, HAS_ALLOWED, PAIRS, IS_BF16, PREFETCH,
                                EARLY)
            last = count == count
            if SPLIT:
                # Publish this chunk's count (and stores); the last arrival gets the total. The
                # last program reads logits other chunks wrote only for active stop ids, bias ids
                # or a forced id: without them the arrival need not release (or acquire) stores.
                tl.debug_barrier()
                arrival = count.to(tl.int64) + (1 << 32)
                tail_reads = forced >= 0
                if N_STOP > 0:
                    tail_reads |= min_active & (tl.max(((stops >= 0) & (stops < vocab)).to(tl.int32), axis=0) != 0)
                if N_BIAS > 0:
                    tail_reads |= tl.max(((bias_ids >= 0) & (bias_ids < vocab)).to(tl.int32), axis=0) != 0
                if tail_reads:
                    old = tl.atomic_add(scratch_ptr + row, arrival, sem="acq_rel")
                else:
                    old = tl.atomic_add(scratch_ptr + row, arrival, sem="relaxed")
                tl.debug_barrier()
                arrived = old >> 32
                last = arrived == tl.num_programs(1) - 1
                count = (old - (arrived << 32)).to(tl.int32) + count
            if last:
                if SPLIT:
                    tl.store(scratch_ptr + row, old * 0)  # ready for the next launch
                _finish_row(row_ptr, infeasible_ptr, row, count, last, is_grammar, min_active, forced, vocab,
                            stops, policy, bias_ids, bv, N_STOP, N_BIAS, IS_BF16)
        elif chunk == 0:
            _sparse_bans(row_ptr, row64, slot, pos, 0, vocab, ban_ptr,
                         bad_prefix_ptr, bad_plen_ptr, bad_last_ptr, hist_ptr, hist_len_ptr,
                         draft_ptr, draft_stride, draft_width, N_BAN, N_BAD, N_PFX, HAS_DRAFT)
            tl.debug_barrier()
            # Entries steps 3-4 could still remove from the finite count.
            stops, policy, bias_ids, bv = _tail_tables(slot, stop_ptr, restore_ptr, bias_id_ptr, bias_val_ptr,
                                                       N_STOP, N_BIAS)
            n_masked_later = is_grammar * 0
            if N_STOP > 0:
                n_stop = tl.sum(((stops >= 0) & (stops < vocab)).to(tl.int32), axis=0)
                n_masked_later += tl.where(min_active, n_stop, 0)
            if N_BIAS > 0:
                n_masked_later += tl.sum(((bias_ids >= 0) & (bias_ids < vocab)).to(tl.int32), axis=0)
            # Early-exit count: stop once more finite logits are seen than steps
            # 3-4 could remove; the row then cannot end empty.
            count = is_grammar * 0
            offs = tl.arange(0, SCAN_WORDS * 32)
            start = 0
            while (count <= n_masked_later) & (start < vocab):
                idx = start + offs
                x = tl.load(row_ptr + idx, mask=idx < vocab, other=NEG)
                count += tl.sum((tl.abs(x.to(tl.float32)) < INF).to(tl.int32))
                start += SCAN_WORDS * 32
            tl.debug_barrier()
            _finish_row(row_ptr, infeasible_ptr, row, count, start >= vocab, is_grammar, min_active, forced, vocab,
                        stops, policy, bias_ids, bv, N_STOP, N_BIAS, IS_BF16)
    elif chunk == 0:
        tl.store(infeasible_ptr + row, slot_ok == 0)


@functools.lru_cache(maxsize=None)
def _sm_limits(index: int) -> tuple[int, int, int, int]:
    """(SMs, registers, threads, shared-memory bytes) of one multiprocessor of CUDA device ``index``."""
    p = torch.cuda.get_device_properties(index)
    return (p.multi_processor_count, getattr(p, "regs_per_multiprocessor", 65536),
            getattr(p, "max_threads_per_multi_processor", 2048), getattr(p, "shared_memory_per_multiprocessor", 0))


def _device_index(dev: torch.device) -> int:
    return dev.index if dev.index is not None else torch.cuda.current_device()


def _device_sms(dev: torch.device) -> int:
    if dev.type != "cuda":
        return 1
    return _sm_limits(_device_index(dev))[0]


def resident_programs(n_regs: int, shared_bytes: int, num_warps: int, regs_per_sm: int = 65536,
                      threads_per_sm: int = 2048, shared_per_sm: int = 0, max_blocks: int = 32) -> int:
    """Programs (CTAs) of one compiled kernel that a multiprocessor holds at once, by CUDA's
    occupancy rule: registers are given per warp in units of 256 (``n_regs`` per thread
    rounded up), shared memory per CTA with 1 KiB reserved (``shared_per_sm`` 0: not limiting)."""
    regs_per_warp = -(-max(n_regs, 1) * 32 // 256) * 256
    fits = min(regs_per_sm // regs_per_warp // num_warps, threads_per_sm // (32 * num_warps), max_blocks)
    if shared_per_sm and shared_bytes:
        fits = min(fits, shared_per_sm // (shared_bytes + 1024))
    return max(1, fits)


# Resident programs per SM of each compiled specialization, keyed by what selects it.
_RESIDENT: dict[tuple, int] = {}


def _resident_of(kernel, num_warps: int, dev: torch.device) -> int | None:
    """``resident_programs`` of a compiled kernel on ``dev``; None when Triton does not say."""
    try:
        kernel._init_handles()  # loads the binary: Triton fills n_regs there
        n_regs, shared = int(kernel.n_regs), int(kernel.metadata.shared)
    except Exception:  # noqa: BLE001 - a Triton without these attributes: keep the static wave
        return None
    if n_regs <= 0:
        return None
    _, regs, threads, smem = _sm_limits(_device_index(dev))
    return resident_programs(n_regs, shared, num_warps, regs, threads, smem)


def chunks_per_row(rows: int, vocab: int, dtype: torch.dtype, device: torch.device,
                   tuning: KernelTuning | None = None) -> int:
    """Programs per dense row that ``apply_triton`` launches with default knobs (benchmarks)."""
    tuning = KernelTuning() if tuning is None else tuning
    W = _cdiv(vocab, 32)
    dw, _, _, pps, wave = (tuple(tuning.tiles[str(dtype).removeprefix("torch.")]) + (0, 0))[:5]
    return _cdiv(W, tuning.chunk_words or split_words(rows, W, dw, pps, _device_sms(device), wave))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def split_words(rows: int, num_words: int, dense_words: int, progs_per_sm: int, sm_count: int,
                wave_progs: int = 0) -> int:
    """Bitmask words per chunk (whole tiles): one wave of programs when that gives every row
    >= 2 chunks (no tail wave), else enough chunks for ~progs_per_sm programs per SM."""
    tiles = _cdiv(num_words, dense_words)
    one_wave = wave_progs * sm_count // rows
    if progs_per_sm <= 0:
        chunks = 1
    elif one_wave >= 2:
        chunks = min(tiles, one_wave)
    else:
        chunks = max(1, min(tiles, _cdiv(progs_per_sm * sm_count, rows)))
    # A program's pair counters have 16 bits and count 4 pairs a tile: at most 16383 tiles a program.
    chunks = max(chunks, _cdiv(tiles, 16383))
    return _cdiv(tiles, chunks) * dense_words


def _scratch(state, rows: int, device) -> torch.Tensor:
    """The state's per-row arrival/count words (int64, zero between launches), grown but never freed."""
    buf = state.extras.get("split_scratch")
    if buf is None or buf.shape[0] < rows:
        if buf is not None:
            # A captured CUDA graph may still point at the old buffer: keep it alive.
            state.extras.setdefault("split_scratch_old", []).append(buf)
        buf = torch.zeros(max(rows, 2 * (0 if buf is None else buf.shape[0]), 256), dtype=torch.int64, device=device)
        state.extras["split_scratch"] = buf
    return buf


def _pairs_ok(logits: torch.Tensor) -> bool:
    """16-bit logits can be processed as int32 pairs when every row starts 4-byte aligned and has even length."""
    return (logits.element_size() == 2 and logits.shape[1] % 2 == 0 and
            (logits.stride(0) % 2 == 0 or logits.shape[0] == 1) and logits.data_ptr() % 4 == 0)


def apply_triton(state, logits, row_slots, row_positions, bitmask, grammar_rows, draft_token_ids, max_slots,
                 dense_words: int | None = None, scan_words: int | None = None, num_warps: int | None = None,
                 progs_per_sm: int | None = None, chunk_words: int | None = None, prefetch: int | None = None,
                 pairs: bool | None = None, tuning: KernelTuning | None = None, n_forced: int = 0,
                 may_force: bool = True):
    """Launch the fused kernel (rows x chunks programs); return bool ``infeasible [rows]``.

    Launch knobs come from ``tuning`` (the defaults when ``None``); the
    keyword overrides take precedence over it (``benches/logits_stress.py``
    forces tiles and chunks with them). ``n_forced`` (slots with a forced
    token, host count) only picks the grid: with none, a launch without a
    dense mask runs one program per row; a forced row is handled correctly by
    either grid. ``may_force=False`` compiles the
    forced-token read out (a launch where no slot is forced and none can be
    before the launch runs: ``LogitsConstraints.apply`` passes it when no
    slot is forced and the state is not frozen, or is frozen but was built
    with ``reserve={"forced_token": False}``; otherwise a CUDA graph keeps
    the read)."""
    tuning = KernelTuning() if tuning is None else tuning
    R, V = logits.shape
    W = (V + 31) // 32
    cfg = tuple(tuning.tiles[str(logits.dtype).removeprefix("torch.")]) + (0, 0)
    dw, sw, nw, pps, wave = cfg[:5]
    dense_words = dense_words or dw
    scan_words = scan_words or sw
    num_warps = num_warps or nw
    progs_per_sm = pps if progs_per_sm is None else progs_per_sm
    prefetch_default = prefetch is None
    prefetch = cfg[5] if prefetch is None else prefetch
    pairs = _pairs_ok(logits) if pairs is None else pairs and _pairs_ok(logits)
    infeasible = torch.empty(R, dtype=torch.bool, device=logits.device)
    st = state
    dummy = st.min_tokens  # any valid pointer for absent optional inputs
    draft = draft_token_ids if draft_token_ids is not None and draft_token_ids.shape[1] > 0 else None
    n_bad = st.bad_prefix.shape[1]
    dense = bitmask is not None or bool(st.any_allowed) or n_forced > 0
    one_wave_rule = False
    if not dense:
        chunk_words = W
    elif chunk_words is None:
        chunk_words = tuning.chunk_words
        if chunk_words is None:
            chunk_words = split_words(R, W, dense_words, progs_per_sm, _device_sms(logits.device), wave)
            one_wave_rule = wave * _device_sms(logits.device) // R >= 2
    args, kwargs = _launch_args(st, logits, infeasible, row_slots, row_positions, bitmask, grammar_rows, draft,
                                max_slots, dummy, n_bad, chunk_words, dense_words, scan_words, num_warps, prefetch,
                                prefetch_default, pairs, may_force)
    if one_wave_rule and logits.device.type == "cuda" and not interpreting():
        # The one-wave grid assumes WAVE_PROGS programs fit an SM; a specialization with more
        # registers (the 'all' constraints: 55 vs 48 in bfloat16) fits fewer, and the wave's
        # last programs would run as a second, mostly empty wave. Use what the compiled kernel
        # really fits, looked up once per specialization (its constexprs and launch options,
        # the keyword arguments, in their fixed order).
        key = (logits.dtype, logits.device, *kwargs.values())
        fits = _RESIDENT.get(key)
        if fits is None:
            compiled = _constraints_kernel.warmup(*args, grid=(R, _cdiv(W, chunk_words)), **kwargs)
            fits = _RESIDENT[key] = _resident_of(compiled, num_warps, logits.device) or wave
        if fits < wave:
            chunk_words = split_words(R, W, dense_words, progs_per_sm, _device_sms(logits.device), fits)
            args, kwargs = _launch_args(st, logits, infeasible, row_slots, row_positions, bitmask, grammar_rows,
                                        draft, max_slots, dummy, n_bad, chunk_words, dense_words, scan_words,
                                        num_warps, prefetch, prefetch_default, pairs, may_force)
    _constraints_kernel[(R, _cdiv(W, chunk_words))](*args, **kwargs)
    return infeasible


def _launch_args(st, logits, infeasible, row_slots, row_positions, bitmask, grammar_rows, draft, max_slots, dummy,
                 n_bad, chunk_words, dense_words, scan_words, num_warps, prefetch, prefetch_default, pairs, may_force):
    """The kernel's positional arguments and keyword (constexpr and launch) arguments."""
    R, V = logits.shape
    W = (V + 31) // 32
    n_chunks = _cdiv(W, chunk_words)
    split = n_chunks > 1
    if prefetch_default and chunk_words <= dense_words:
        prefetch = 0  # one tile per program: nothing to overlap, the prologue only adds latency
    args = (
        logits,
        logits.stride(0),
        infeasible,
        _scratch(st, R, logits.device) if split else dummy,
        row_slots,
        row_positions,
        grammar_rows if grammar_rows is not None else dummy,
        bitmask if bitmask is not None else dummy,
        bitmask.stride(0) if bitmask is not None else 0,
        draft if draft is not None else dummy,
        draft.stride(0) if draft is not None else 0,
        draft.shape[1] if draft is not None else 0,
        st.min_tokens,
        st.restore,
        st.stop_ids,
        st.ban_ids,
        st.has_allowed,
        st.allowed if st.any_allowed else dummy,
        st.bad_prefix,
        st.bad_prefix_len,
        st.bad_last,
        st.history,
        st.history_len,
        st.bias_ids,
        st.bias_values,
        st.forced,
        max_slots,
        V,
        W,
        chunk_words,
    )
    kwargs = dict(
        HAS_BITMASK=bitmask is not None,
        HAS_GRAMMAR_ROWS=grammar_rows is not None,
        HAS_DRAFT=draft is not None,
        HAS_ALLOWED=bool(st.any_allowed),
        SPLIT=split,
        N_STOP=st.stop_ids.shape[1],
        N_BAN=st.ban_ids.shape[1],
        N_BAD=n_bad,
        N_PFX=st.bad_prefix.shape[2] if n_bad else 0,
        N_BIAS=st.bias_ids.shape[1],
        DENSE_WORDS=dense_words,
        SCAN_WORDS=scan_words,
        IS_BF16=logits.dtype == torch.bfloat16,
        PAIRS=pairs,
        PREFETCH=bool(prefetch),
        # The early first-tile load needs the bitmask to be the only thing a tile reads before the
        # pass, so no ban may be written into it first (bans are stored before the pass).
        EARLY=bitmask is not None and st.ban_ids.shape[1] == 0 and n_bad == 0,
        HAS_FORCED=bool(may_force),
        num_warps=num_warps,
    )
    return args, kwargs
