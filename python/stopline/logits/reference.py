"""Plain torch reference of the logits-constraint pipeline (docs/semantics.md section 8).

Written for clarity, with whole-row tensor ops on any device; the Triton kernel
must give bit-identical logits and ``infeasible`` flags. Inputs are validated by
:meth:`stopline.logits.LogitsConstraints.apply`; this function trusts them,
except that a row whose slot lies outside ``[0, max_slots)`` is left untouched
and reported infeasible (the device tensor is never range-checked on the host).
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


def unpack_bitmask(words: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 ``[..., W]`` in xgrammar layout -> bool ``[..., vocab_size]`` (True = allowed)."""
    shifts = torch.arange(32, device=words.device, dtype=torch.int32)
    bits = (words.unsqueeze(-1) >> shifts) & 1
    return bits.flatten(-2)[..., :vocab_size].bool()


def _put(logits, rows, ids, mask, values) -> None:
    """logits[r, ids[r, k]] = values where mask[r, k] and the id is in range."""
    mask = mask & (ids >= 0) & (ids < logits.shape[1])
    r = rows[:, None].expand_as(ids)[mask]
    c = ids[mask].long()
    logits[r, c] = values


def bad_word_bans(state, row_slots, row_positions, draft_token_ids) -> tuple[torch.Tensor, torch.Tensor]:
    """Which multi-token bad words fire on each row.

    Returns ``(last_tokens [rows, C_bad], fires [rows, C_bad] bool)``. A word
    with prefix ``w[0..L-2]`` fires at output position ``p`` when the tokens at
    positions ``p-L+1 .. p-1`` equal the prefix; position ``q`` is read from the
    slot's history ring when ``n - C_pfx <= q < n`` (``n`` = appended tokens),
    from ``draft_token_ids[r, q - n]`` when ``q >= n``, and is unknown (never
    matches) otherwise.
    """
    s = row_slots
    plen = state.bad_prefix_len[s].long()  # [R, B]
    prefix = state.bad_prefix[s]  # [R, B, P]
    R, B, P = prefix.shape
    H = state.history.shape[1]
    k = torch.arange(P, device=prefix.device)
    q = row_positions.long()[:, None, None] - plen[:, :, None] + k  # [R, B, P]
    need = k < plen[:, :, None]
    n = state.history_len[s].long()[:, None, None]
    from_hist = (q >= 0) & (q < n) & (q >= n - H)
    hist = state.history[s].gather(1, (q % H).reshape(R, -1)).reshape(R, B, P)
    tok = torch.where(from_hist, hist, torch.full_like(hist, -1))
    if draft_token_ids is not None and draft_token_ids.shape[1] > 0:
        D = draft_token_ids.shape[1]
        d_idx = q - n
        from_draft = (d_idx >= 0) & (d_idx < D)
        draft = draft_token_ids.gather(1, d_idx.clamp(0, D - 1).reshape(R, -1)).reshape(R, B, P).to(tok.dtype)
        tok = torch.where(from_draft, draft, tok)
    fires = ((tok == prefix) | ~need).all(dim=-1) & (plen > 0)
    return state.bad_last[s], fires


def apply_reference(state, logits, row_slots, row_positions, bitmask, grammar_rows, draft_token_ids, max_slots):
    """Apply the pipeline in place on ``logits [rows, vocab]``; return bool ``infeasible [rows]``."""
    R, V = logits.shape
    dev = logits.device
    rows = torch.arange(R, device=dev)
    slots = row_slots.long()
    ok = (slots >= 0) & (slots < max_slots)
    s = torch.where(ok, slots, torch.zeros_like(slots))
    pos = row_positions.long()
    # A forced row keeps only its forced id's input logit (0 if that is not finite).
    forced = state.forced[s].long()
    is_forced = ok & (forced >= 0) & (forced < V)
    forced_col = forced.clamp(0, V - 1)
    forced_val = logits.gather(1, forced_col[:, None])[:, 0]
    if grammar_rows is not None:
        is_grammar = grammar_rows.bool()
    else:
        is_grammar = torch.full((R,), bitmask is not None, dtype=torch.bool, device=dev)

    # 1. semantic masks: sparse bans, multi-token bad words, dense token masks.
    if state.ban_ids.shape[1]:
        ban = state.ban_ids[s]
        _put(logits, rows, ban, ok[:, None], NEG_INF)
    if state.bad_prefix_len.shape[1]:
        last, fires = bad_word_bans(state, s, pos, draft_token_ids)
        _put(logits, rows, last, ok[:, None] & fires, NEG_INF)
    keep = None
    if bitmask is not None:
        keep = unpack_bitmask(bitmask, V) | ~(is_grammar & ok)[:, None]
    if state.any_allowed:
        use = (state.has_allowed[s] != 0) & ok
        allowed = unpack_bitmask(state.allowed[s], V) | ~use[:, None]
        keep = allowed if keep is None else keep & allowed
    if keep is not None:
        logits.masked_fill_(~keep, NEG_INF)

    # 2. min_tokens: mask every stop id below min_tokens, as vLLM's MinTokensLogitsProcessor;
    #    if that leaves no finite logit (NaN and +inf count as not finite, unlike vLLM: 6.17) and
    #    the policy allows it, put back the stop logits that are finite (docs/semantics.md 8.2).
    stops = state.stop_ids[s]
    active = ok & (pos < state.min_tokens[s].long())
    to_mask = active[:, None] & (stops >= 0) & (stops < V)
    stop_vals = logits.gather(1, stops.long().clamp(0, V - 1))
    _put(logits, rows, stops, to_mask, NEG_INF)
    policy = state.restore[s]
    may_restore = (policy == 2) | ((policy == 1) & is_grammar)
    restore = active & ~_any_finite(logits) & may_restore
    kept = to_mask & restore[:, None] & torch.isfinite(stop_vals)
    r = rows[:, None].expand_as(stops)[kept]
    logits[r, stops[kept].long()] = stop_vals[kept]  # the finite stop logits come back

    # 3. logit_bias, added in float32 and rounded once to the logits dtype.
    if state.bias_ids.shape[1]:
        ids = state.bias_ids[s]
        m = ok[:, None] & (ids >= 0) & (ids < V)
        r = rows[:, None].expand_as(ids)[m]
        c = ids[m].long()
        logits[r, c] = (logits[r, c].float() + state.bias_values[s][m]).to(logits.dtype)

    # 4. forced rows (LogitsConstraints.force) replace whatever steps 1-3 wrote.
    logits.masked_fill_(is_forced[:, None], NEG_INF)
    forced_val = torch.where(torch.isfinite(forced_val), forced_val, torch.zeros_like(forced_val))
    logits[rows[is_forced], forced_col[is_forced]] = forced_val[is_forced]

    return ~_any_finite(logits) | ~ok


def _any_finite(logits: torch.Tensor) -> torch.Tensor:
    """Per row, whether a logit is finite. A row whose maximum is finite has
    one, and a row whose maximum is -inf has none; only rows whose maximum is
    +inf or NaN need the element-wise test. On CPU that test is skipped when
    no row needs it: ``torch.isfinite(...).any(dim=1)`` runs bool kernels
    over the whole batch, several times a plain reduction, and made the
    reference slower than transformers' own processors. Elsewhere it always
    runs (no host sync)."""
    if logits.shape[1] == 0:
        return torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    top = logits.amax(dim=1)
    unsure = torch.isnan(top) | (top == float("inf"))
    if logits.device.type == "cpu" and not bool(unsure.any()):
        return torch.isfinite(top)
    return torch.isfinite(top) | (unsure & torch.isfinite(logits).any(dim=1))
