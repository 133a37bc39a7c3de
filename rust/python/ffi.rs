//! Raw C-API access: the only `unsafe` code of the crate's binding. Every
//! function it exports is safe to call; the rules below are what makes each
//! `unsafe` block sound, and each block's `SAFETY:` comment says which.
//!
//! # Safety contract
//!
//! 1. **Borrowed references live no longer than their owner can change.**
//!    `PyList_GetItem` returns a borrowed item. An item of a caller's list is
//!    used only inside the loop iteration that read it, with the list's
//!    critical section held (a no-op on a GIL build, the lock on a
//!    free-threaded one), and with no call in between that can run Python
//!    code (no `__index__`, no allocation of a garbage-collected object, whose
//!    collection could run a `__del__`).
//! 2. **Views that outlive one call borrow from a [`PrivateList`] only**: a
//!    list this module created, never handed to Python while borrowed
//!    (`into_list` consumes the views' owner, so the borrow checker enforces
//!    it). No Python code holds a reference to it, so none can change it;
//!    `gc.get_objects()` / `gc.get_referrers()` could reach it, and CPython
//!    documents that what those return may be in an invalid state.
//! 3. **UTF-8 views come from `PyUnicode_AsUTF8AndSize`**, whose buffer is
//!    valid UTF-8 owned by the `str` (cached in it), and lives as long as
//!    the `str`, which rule 2 keeps alive.
//! 4. **Buffer slices are checked before they are formed**: one dimension,
//!    C-contiguous, item size equal to the element type's, a non-null and
//!    aligned start (an empty buffer is never viewed);
//!    element types are plain integers (any bit pattern is valid). The slice
//!    borrows the `PyUntypedBuffer`, whose export keeps the exporter from
//!    resizing the memory (`BufferError`) until it is released. Not
//!    excluded: another thread of the caller's writing the items while they
//!    are read (on a GIL build only code that releases the GIL can); the
//!    slice is read once, front to back, into a Vec, and such a race yields
//!    a mix of old and new values, never a read outside the buffer.

use pyo3::buffer::PyUntypedBuffer;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyList, PySequenceMethods};

/// The ints of a list, read without taking a reference per element. `None`
/// when an element is not an int (or int subclass), does not fit `i64`, or
/// `conv` rejects it; the caller's general path then names it. `out` comes
/// with room for the list's items.
pub(super) fn list_ints<T>(
    list: &Bound<'_, PyList>,
    conv: impl Fn(i64) -> Option<T>,
    out: Vec<T>,
) -> Option<Vec<T>> {
    pyo3::sync::critical_section::with_critical_section(list.as_any(), || {
        list_ints_locked(list, conv, out)
    })
}

// Out of line: its loop gets registers of its own, not the caller's.
#[inline(never)]
fn list_ints_locked<T>(
    list: &Bound<'_, PyList>,
    conv: impl Fn(i64) -> Option<T>,
    mut out: Vec<T>,
) -> Option<Vec<T>> {
    let n = list.len();
    for i in 0..n {
        // SAFETY: (rule 1) `list` is alive; PyList_GetItem bounds-checks and
        // returns a borrowed item used only in this block, where nothing runs
        // Python code: the type checks read the type, and
        // PyLong_AsLongAndOverflow on an int (or subclass) does not call
        // `__index__`.
        let v = unsafe {
            let item = ffi::PyList_GetItem(list.as_ptr(), i as ffi::Py_ssize_t);
            if item.is_null() {
                ffi::PyErr_Clear();
                return None;
            }
            // The exact check is inline; the subclass checks are out of line.
            if ffi::PyLong_CheckExact(item) == 0 && !int_subclass(item) {
                return None;
            }
            let mut overflow = 0;
            let v = ffi::PyLong_AsLongAndOverflow(item, &mut overflow);
            if overflow != 0 {
                return None;
            }
            if v == -1 && !ffi::PyErr_Occurred().is_null() {
                ffi::PyErr_Clear();
                return None;
            }
            v as i64
        };
        out.push(conv(v)?);
    }
    Some(out)
}

/// Whether `item`, not an exact int, is an int subclass other than `bool`
/// (a bool goes the general way, which refuses it). Out of line: the hot
/// loop sees exact ints.
///
/// # Safety
/// `item` is a live object (rule 1).
#[cold]
#[inline(never)]
unsafe fn int_subclass(item: *mut ffi::PyObject) -> bool {
    // SAFETY: `item` is live (the caller's contract); the checks read its
    // type only.
    unsafe { ffi::PyLong_Check(item) != 0 && ffi::PyBool_Check(item) == 0 }
}

/// A copy of a caller's list that only this module holds (rule 2), so its
/// items can be viewed without a reference each for as long as it is
/// borrowed.
pub(super) struct PrivateList<'py>(Bound<'py, PyList>);

impl<'py> PrivateList<'py> {
    /// Copies `list` (`PySequence_List` allocates the new list before it
    /// reads the old one, so a collection its allocation starts cannot
    /// change the list while it is read).
    pub(super) fn copy(list: &Bound<'py, PyList>) -> PyResult<Self> {
        list.as_sequence().to_list().map(PrivateList)
    }

    /// The items as UTF-8 views, or `None` when one is not an exact `str`
    /// or not valid Unicode (a lone surrogate); the caller's general path
    /// then names it.
    pub(super) fn strs(&self) -> Option<Vec<&str>> {
        let n = self.0.len();
        let mut strs = Vec::with_capacity(n);
        for i in 0..n {
            // SAFETY: (rules 2, 3) the list is private and unchanged while
            // `self` is borrowed; the item is a borrowed reference into it,
            // and the UTF-8 buffer lives as long as the item.
            let s = unsafe {
                let item = ffi::PyList_GetItem(self.0.as_ptr(), i as ffi::Py_ssize_t);
                if item.is_null() {
                    ffi::PyErr_Clear();
                    return None;
                }
                if ffi::PyUnicode_CheckExact(item) == 0 {
                    return None;
                }
                let mut size: ffi::Py_ssize_t = 0;
                let data = ffi::PyUnicode_AsUTF8AndSize(item, &mut size);
                if data.is_null() {
                    ffi::PyErr_Clear();
                    return None;
                }
                std::str::from_utf8_unchecked(std::slice::from_raw_parts(
                    data.cast::<u8>(),
                    size as usize,
                ))
            };
            strs.push(s);
        }
        Some(strs)
    }

    /// The list itself, once no view borrows it.
    pub(super) fn into_list(self) -> Bound<'py, PyList> {
        self.0
    }
}

/// Whether `obj` exports the buffer protocol (a type check; no Python code).
pub(super) fn has_buffer(obj: &Bound<'_, PyAny>) -> bool {
    // SAFETY: `obj` is a live object; the call reads its type slots only.
    unsafe { ffi::PyObject_CheckBuffer(obj.as_ptr()) != 0 }
}

/// A plain integer type a buffer's items can be read as.
pub(super) trait IntItem: Copy {}
macro_rules! int_items {
    ($($t:ty),*) => { $(impl IntItem for $t {})* };
}
int_items!(i8, i16, i32, i64, u8, u16, u32, u64);

/// The items of `buf` as `E`, or `None` when its shape, item size or
/// alignment do not allow that view (the format is the caller's check).
pub(super) fn buffer_items<E: IntItem>(buf: &PyUntypedBuffer) -> Option<&[E]> {
    if buf.item_count() == 0 {
        // An exporter may give a null pointer for no items.
        return Some(&[]);
    }
    let ptr = buf.buf_ptr() as *const E;
    let ok = !ptr.is_null()
        && buf.dimensions() == 1
        && buf.is_c_contiguous()
        && buf.item_size() == std::mem::size_of::<E>()
        && ptr.is_aligned();
    if !ok {
        return None;
    }
    // SAFETY: (rule 4) checked above: a non-null, aligned start and
    // `item_count` contiguous items of E's size, valid for any bit pattern, held by `buf`.
    Some(unsafe { std::slice::from_raw_parts(ptr, buf.item_count()) })
}
