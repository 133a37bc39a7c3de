"""What one ``LogitsConstraints`` and one ``set`` accept (docs/errors.md, "Caps")."""

from __future__ import annotations

__all__ = ["LIMITS", "RESTORE_POLICIES", "BACKENDS"]

#: Restore policies and their codes in the device state.
RESTORE_POLICIES = {"never": 0, "structured": 1, "always": 2}
BACKENDS = ("auto", "torch", "triton")

#: Caps on what one ``LogitsConstraints`` or one ``set`` accepts (inputs come
#: from clients; docs/errors.md, "Caps"). Each table is sized by the largest
#: live request (or the constructor's ``reserve``) and shrinks when that
#: request is cleared, so these bound the device memory: the id tables at
#: ``max_slots x`` their entry cap, the multi-token bad words at
#: ``max_bad_words_table_bytes`` (refused beyond), the dense token mask at
#: ``max_dense_table_bytes`` (checked at construction).
LIMITS = {
    "max_slots": 1 << 14,
    "max_stop_token_ids": 1 << 16,
    "max_allowed_token_ids": 1 << 22,
    "max_bad_words": 1024,
    "max_bad_word_tokens": 64,
    "max_bad_words_table_bytes": 256 << 20,
    "max_logit_bias": 1 << 16,
    "max_dense_table_bytes": 1 << 30,
}
