"""What one ``LogitsConstraints`` and one ``set`` accept (docs/errors.md, "Caps")."""

from __future__ import annotations

from stopline._core import LOGITS_LIMITS

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
#: ``max_dense_table_bytes`` (checked at construction). The values are the
#: core's (``rust/limits.rs``, which also holds ``stopline.LIMITS``):
#: ``max_slots`` here bounds a ``LogitsConstraints`` (device tables), not a
#: ``FinishBatch`` (``stopline.LIMITS["max_slots"]``, a host table).
LIMITS: dict[str, int] = dict(LOGITS_LIMITS)
