//! Python values to core types: every extraction helper of the binding and
//! the messages its errors carry. Fast paths read plain lists and buffers
//! through [`ffi`]; everything else takes the general path, whose errors name
//! the field and element.

use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{
    PyBool, PyDict, PyFrozenSet, PyInt, PyIterator, PyList, PyMapping, PyRange, PyRangeMethods,
    PySet, PyString, PyTuple,
};
use pyo3::IntoPyObjectExt;

use super::errors::{arg_err, overflow_err, to_py_err};
use super::ffi;
use crate::error::{Error, Problem};
use crate::limits;
use pyo3::exceptions::PyValueError;

/// A getter's value of a core field: a copy or clone, or for a compiled list
/// its entries in list order (empty when not set).
pub(super) trait ReadAs<T> {
    fn read_as(&self) -> T;
}

impl<T: Clone> ReadAs<T> for T {
    fn read_as(&self) -> T {
        self.clone()
    }
}

/// A compiled list's entries (stop strings, regex patterns) in list order.
pub(super) trait Entries {
    fn entries(&self) -> &[String];
}

impl<L: Entries> ReadAs<Vec<String>> for Option<std::sync::Arc<L>> {
    fn read_as(&self) -> Vec<String> {
        self.as_deref()
            .map_or_else(Vec::new, |l| l.entries().to_vec())
    }
}

/// Ids from which decoding runs without the GIL: below, releasing and
/// taking it back costs more than the decode.
pub(super) const DETACH_IDS: usize = 4096;

/// Text bytes from which a scan runs without the GIL: about a millisecond of
/// work. Below, giving the GIL up is not worth the wait to take it back from a
/// busy thread (up to its switch interval, docs/reliability.md); a decode
/// step's piece is far below.
pub(super) const DETACH_TEXT_BYTES: usize = 64 * 1024;

/// Runs `f` without the GIL when `long`: core work that touches no Python
/// object, so other threads run meanwhile.
#[inline]
pub(super) fn detach_if<T: Send>(py: Python<'_>, long: bool, f: impl FnOnce() -> T + Send) -> T {
    if long {
        py.detach(f)
    } else {
        f()
    }
}

/// Python's `repr()` of a Rust value converted to its Python counterpart.
pub(super) fn py_repr<'py, T: IntoPyObject<'py>>(py: Python<'py>, value: T) -> PyResult<String> {
    Ok(value.into_bound_py_any(py)?.repr()?.to_string())
}

/// Extracts a `str` as UTF-8 plus its length in code points; `field` names
/// the argument in error messages.
#[inline(always)]
pub(super) fn extract_str<'a, 'py>(
    obj: &'a Bound<'py, PyAny>,
    field: &dyn Fn() -> String,
) -> PyResult<(&'a str, usize)> {
    let text = extract_utf8(obj, field)?;
    let chars = obj
        .cast::<PyString>()
        .map_err(PyErr::from)?
        .code_point_len()?;
    Ok((text, chars))
}

/// Extracts a `str` as UTF-8 (no code-point count: the core counts while it
/// scans, which is cheaper for the short pieces of a decoding step).
#[inline(always)]
pub(super) fn extract_utf8<'a, 'py>(
    obj: &'a Bound<'py, PyAny>,
    field: &dyn Fn() -> String,
) -> PyResult<&'a str> {
    let s = obj
        .cast::<PyString>()
        .map_err(|_| arg_err(&field(), wrong_type("str", obj)))?;
    s.to_str()
        .map_err(|_| arg_err(&field(), Problem::LoneSurrogate))
}

/// Refuses a mapping (a dict or any `collections.abc.Mapping`) where a
/// sequence goes, as a TypeError naming `field` and `what` it must be:
/// iterating one yields its keys, never what a caller passing it meant (a
/// `logit_bias` given as `stop_token_ids`). Checked before any length cap,
/// so a large dict gets the same error as a small one.
fn refuse_mapping(obj: &Bound<'_, PyAny>, field: &str, what: &'static str) -> PyResult<()> {
    if obj.is_instance_of::<PyList>()
        || obj.is_instance_of::<PyTuple>()
        || !obj.is_instance_of::<PyMapping>()
    {
        return Ok(());
    }
    Err(arg_err(field, wrong_type(what, obj)))
}

/// `obj`'s iterator, for a reader that takes at most `cap` items: "not
/// iterable" (or a mapping, [`refuse_mapping`]) becomes a TypeError naming
/// `field` and `what` it must be, a `len()` over `cap` a ValueError
/// ([`known_len`]); anything else `__iter__` raised propagates as is. The
/// reader still stops an iterator without a length after `cap` items.
fn iter_of<'py>(
    obj: &Bound<'py, PyAny>,
    field: &str,
    what: &'static str,
    cap: usize,
) -> PyResult<Bound<'py, PyIterator>> {
    refuse_mapping(obj, field, what)?;
    known_len(obj, cap, &|n| over_cap(field, n, cap))?;
    obj.try_iter().map_err(|e| {
        if e.is_instance_of::<PyTypeError>(obj.py()) {
            arg_err(field, wrong_type(what, obj))
        } else {
            e
        }
    })
}

/// The items of `obj` (an iterable), refused with a `ValueError` naming
/// `field` and `cap` when there are more than `cap`: before anything is
/// materialized when `len()` tells, else after `cap + 1` items (an endless
/// iterator ends there). "Not iterable" is a `TypeError` naming `field` and
/// `what`; anything the caller's object raises propagates unchanged.
pub(super) fn take_capped<'py>(
    obj: &Bound<'py, PyAny>,
    field: &str,
    what: &'static str,
    cap: usize,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let over = |n: Option<usize>| over_cap(field, n, cap);
    if let Ok(list) = obj.cast_exact::<PyList>() {
        if list.len() > cap {
            return Err(over(Some(list.len())));
        }
        return Ok(list.iter().collect());
    }
    let mut out = Vec::new();
    for item in iter_of(obj, field, what, cap)? {
        if out.len() == cap {
            return Err(over(None));
        }
        out.push(item?);
    }
    Ok(out)
}

/// Refuses `obj` when `len(obj)` says it has more than `cap` items (a length
/// too large for an index counts as more). Objects without a length pass;
/// an exception other than "no len" or "too large" propagates.
fn known_len(
    obj: &Bound<'_, PyAny>,
    cap: usize,
    over: &dyn Fn(Option<usize>) -> PyErr,
) -> PyResult<()> {
    if obj.is_instance_of::<PyString>() {
        return Ok(());
    }
    match obj.len() {
        Ok(n) if n > cap => Err(over(Some(n))),
        Ok(_) => Ok(()),
        Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => Err(over(None)),
        Err(e) if e.is_instance_of::<PyTypeError>(obj.py()) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The type of `obj` as an error message names it: its bare name, or
/// `module.qualname` where the bare name is also a builtin's that it is not
/// (NumPy's bool scalar is `numpy.bool`, never a bare `bool`).
pub(super) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    let ty = obj.get_type();
    let Ok(name) = ty.name().map(|n| n.to_string()) else {
        return "?".into();
    };
    let module = ty.module().map(|m| m.to_string()).unwrap_or_default();
    let py = obj.py();
    let shadows = module != "builtins"
        && py
            .import("builtins")
            .and_then(|b| b.hasattr(name.as_str()))
            .unwrap_or(false);
    match ty.qualname() {
        Ok(q) if shadows => format!("{module}.{q}"),
        _ => name,
    }
}

/// Whether `obj` is NumPy's bool scalar (`numpy.bool`, `numpy.bool_`
/// before NumPy 2), known by its type's module and name: NumPy need not be
/// installed, and the type cannot be subclassed.
fn is_numpy_bool(obj: &Bound<'_, PyAny>) -> bool {
    let ty = obj.get_type();
    ty.module().is_ok_and(|m| m == "numpy") && ty.name().is_ok_and(|n| n == "bool" || n == "bool_")
}

/// What an error message shows of a caller's value: its `repr()` cut to
/// [`crate::error::MAX_SHOWN_BYTES`]; an int too long for `repr()` (over 4,300
/// digits) as its size; a list, tuple, dict or set through `reprlib` with the
/// bounds of `stopline._caps.shown` (their own `repr()` takes time in their
/// size and recurses with their depth). What a caller's `__repr__` raises
/// propagates.
pub(super) fn shown_value(obj: &Bound<'_, PyAny>) -> PyResult<String> {
    let container = obj.is_instance_of::<PyList>()
        || obj.is_instance_of::<PyTuple>()
        || obj.is_instance_of::<PyDict>()
        || obj.is_instance_of::<PySet>()
        || obj.is_instance_of::<PyFrozenSet>();
    if container {
        let shown =
            bounded_repr(obj.py())?.call_method1(pyo3::intern!(obj.py(), "repr"), (obj,))?;
        return Ok(crate::error::shown_repr(&shown.to_string()));
    }
    match obj.repr() {
        Ok(r) => Ok(crate::error::shown_repr(&r.to_string())),
        Err(e) if obj.is_instance_of::<PyInt>() && e.is_instance_of::<PyValueError>(obj.py()) => {
            let bits: u64 = obj
                .call_method0(pyo3::intern!(obj.py(), "bit_length"))?
                .extract()?;
            Ok(format!("<an int of {bits} bits>"))
        }
        Err(e) => Err(e),
    }
}

/// The `reprlib.Repr` that shows containers: two levels deep, 80 characters
/// of a string or other value, as `stopline._caps.shown`.
fn bounded_repr(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static REPR: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    REPR.get_or_try_init(py, || {
        let repr = py.import("reprlib")?.getattr("Repr")?.call0()?;
        repr.setattr("maxlevel", 2)?;
        for attr in ["maxstring", "maxother", "maxlong"] {
            repr.setattr(attr, 80)?;
        }
        Ok(repr.unbind())
    })
    .map(|repr| repr.bind(py))
}

/// The error `problem(shown)` for `field`, `shown` being `obj` as
/// [`shown_value`] renders it (or what rendering it raised).
pub(super) fn value_err(
    field: &str,
    obj: &Bound<'_, PyAny>,
    problem: impl FnOnce(String) -> Problem,
) -> PyErr {
    match shown_value(obj) {
        Ok(shown) => arg_err(field, problem(shown)),
        Err(e) => e,
    }
}

/// The `TypeError` for a bare `str` where a sequence of `str` is expected.
pub(super) fn single_str_err(field: &str, s: &Bound<'_, PyAny>) -> PyErr {
    let text = s.extract::<String>().unwrap_or_default();
    arg_err(
        field,
        Problem::SingleStr {
            what: "a sequence of str",
            wrapped: Some(crate::error::shown(&text)),
        },
    )
}

/// One token id: a non-negative int below 2**32.
#[inline]
pub(super) fn extract_id(item: &Bound<'_, PyAny>, field: &dyn Fn() -> String) -> PyResult<u32> {
    let v = extract_int(item, field)?;
    u32::try_from(v).map_err(|_| arg_err(&field(), Problem::NotATokenId { value: v }))
}

/// A sequence of at most `cap` token ids (list, tuple, any iterable of
/// ints, or one int).
pub(super) fn extract_ids(obj: &Bound<'_, PyAny>, field: &str, cap: usize) -> PyResult<Vec<u32>> {
    extract_ids_named(obj, field, cap, &|i| format!("{field}[{i}]"))
}

/// An empty Vec with room for `n` items, or `MemoryError`: a failed
/// allocation in Rust would abort the process. `n` is capped by the caller.
pub(super) fn try_vec<T>(n: usize, field: &str) -> PyResult<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| {
        to_py_err(Error::Alloc {
            what: format!("room for {n} entries of {field}"),
        })
    })?;
    Ok(v)
}

/// The error for a sequence of more than `cap` entries (`n` when known).
pub(super) fn over_cap(field: &str, n: Option<usize>, cap: usize) -> PyErr {
    arg_err(field, Problem::TooMany { n, cap })
}

/// [`extract_ids`] with `name(i)` naming element i in errors.
pub(super) fn extract_ids_named(
    obj: &Bound<'_, PyAny>,
    field: &str,
    cap: usize,
    name: &dyn Fn(usize) -> String,
) -> PyResult<Vec<u32>> {
    if let Ok(list) = obj.cast_exact::<PyList>() {
        if list.len() > cap {
            return Err(over_cap(field, Some(list.len()), cap));
        }
        let room = try_vec(list.len(), field)?;
        if let Some(ids) = ffi::list_ints(list, |v| u32::try_from(v).ok(), room) {
            return Ok(ids);
        }
        let mut out = try_vec(list.len(), field)?;
        for (i, item) in list.iter().enumerate() {
            out.push(extract_id(&item, &|| name(i))?);
        }
        return Ok(out);
    }
    if let Some(ids) = buffer_ids(obj, field, cap)? {
        return Ok(ids);
    }
    // One int (or int-like, as numpy integers are) for a one-token run.
    if obj.is_instance_of::<PyInt>() {
        return Ok(vec![extract_id(obj, &|| field.to_string())?]);
    }
    if !obj.is_instance_of::<PyString>() {
        match obj.extract::<i64>() {
            Ok(_) if obj.try_iter().is_err() => {
                return Ok(vec![extract_id(obj, &|| field.to_string())?])
            }
            Ok(_) => {}
            Err(e) if !is_conversion_error(&e, obj.py()) => return Err(e),
            Err(_) => {}
        }
    }
    let mut out = Vec::new();
    for (i, item) in iter_of(obj, field, "a sequence of ints", cap)?.enumerate() {
        if i == cap {
            return Err(over_cap(field, None, cap));
        }
        out.push(extract_id(&item?, &|| name(i))?);
    }
    Ok(out)
}

/// The errors of converting a value that is no int (TypeError) or too large
/// (OverflowError); anything else came from the caller's code.
pub(super) fn is_conversion_error(e: &PyErr, py: Python<'_>) -> bool {
    e.is_instance_of::<PyTypeError>(py) || e.is_instance_of::<PyOverflowError>(py)
}

/// An int that fits in i64: a wrong type is a TypeError, an int out of range
/// a ValueError; both name the field. Anything else an `__index__` raises
/// (KeyboardInterrupt, MemoryError, ...) propagates as is.
#[inline]
pub(super) fn extract_int(item: &Bound<'_, PyAny>, field: &dyn Fn() -> String) -> PyResult<i64> {
    // bool is an int subclass, but max_tokens=True or token_ids=[True] is a
    // bug, not 1 (the same policy as stopline.baseline).
    if item.is_instance_of::<PyBool>() {
        return Err(arg_err(&field(), wrong_type("an int", item)));
    }
    item.extract::<i64>().map_err(|e| {
        let py = item.py();
        if item.is_instance_of::<PyInt>() || e.is_instance_of::<PyOverflowError>(py) {
            value_err(&field(), item, |shown| Problem::OutOfRange { shown })
        } else if e.is_instance_of::<PyTypeError>(py) {
            arg_err(&field(), wrong_type("an int", item))
        } else {
            e
        }
    })
}

/// An int argument, with `OverflowError` above `i64` (as PyO3's own
/// conversion) and the one bool policy of [`extract_int`].
pub(super) fn extract_i64_arg(obj: &Bound<'_, PyAny>, field: &str) -> PyResult<i64> {
    if obj.is_instance_of::<PyBool>() {
        return Err(arg_err(field, wrong_type("an int", obj)));
    }
    obj.extract::<i64>().map_err(|e| {
        let py = obj.py();
        if e.is_instance_of::<PyOverflowError>(py) {
            match shown_value(obj) {
                Ok(shown) => overflow_err(field, Problem::OutOfRange { shown }),
                Err(e) => e,
            }
        } else if e.is_instance_of::<PyTypeError>(py) {
            arg_err(field, wrong_type("an int", obj))
        } else {
            e
        }
    })
}

/// A wrong-type problem: `obj` is not `expected`.
pub(super) fn wrong_type(expected: &'static str, obj: &Bound<'_, PyAny>) -> Problem {
    Problem::WrongType {
        expected,
        got: type_name(obj),
    }
}

/// A `bool` argument, or NumPy's bool scalar (read by its truth, as NumPy's
/// ints are taken for ints); anything else (an int, `None`, a str:
/// `bool("false")` is True) is a TypeError naming `field`.
pub(super) fn extract_flag(obj: &Bound<'_, PyAny>, field: &str) -> PyResult<bool> {
    match obj.cast::<PyBool>() {
        Ok(b) => Ok(b.is_true()),
        Err(_) if is_numpy_bool(obj) => obj.is_truthy(),
        Err(_) => Err(arg_err(field, wrong_type("a bool", obj))),
    }
}

/// `from_py_with` readers for the bindings' `bool` arguments, one per
/// argument name ([`extract_flag`]: a bool or NumPy's bool scalar; anything
/// else is refused naming the argument). Every bool argument is read here.
pub(super) mod flags {
    use super::extract_flag;
    use pyo3::prelude::*;

    macro_rules! flags {
        ($($name:ident),*) => {$(
            pub(in crate::python) fn $name(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
                extract_flag(obj, stringify!($name))
            }
        )*};
    }
    flags!(
        ignore_eos,
        include_stop_str_in_output,
        keep_reasoning_markers,
        token_aligned,
        include_in_output,
        skip_special_tokens,
        spaces_between_special_tokens,
        has_tool_calls
    );
}

/// An int that must be at least `min`.
pub(super) fn extract_at_least(obj: &Bound<'_, PyAny>, field: &str, min: i64) -> PyResult<i64> {
    let v = extract_int(obj, &|| field.to_string())?;
    Problem::at_least(min, v).map_err(|p| arg_err(field, p))?;
    Ok(v)
}

pub(super) fn extract_nonneg(obj: &Bound<'_, PyAny>, field: &str) -> PyResult<u64> {
    Ok(extract_at_least(obj, field, 0)? as u64)
}

pub(super) fn extract_opt_nonneg(
    obj: Option<&Bound<'_, PyAny>>,
    field: &str,
) -> PyResult<Option<u64>> {
    extract_opt_at_least(obj, field, 0)
}

/// An optional count that must be at least 1 (`max_tokens`, `vocab_size`):
/// a negative value gets the same ">= 1" message as 0.
pub(super) fn extract_opt_positive(
    obj: Option<&Bound<'_, PyAny>>,
    field: &str,
) -> PyResult<Option<u64>> {
    extract_opt_at_least(obj, field, 1)
}

fn extract_opt_at_least(
    obj: Option<&Bound<'_, PyAny>>,
    field: &str,
    min: i64,
) -> PyResult<Option<u64>> {
    match obj {
        None => Ok(None),
        Some(o) if o.is_none() => Ok(None),
        Some(o) => Ok(Some(extract_at_least(o, field, min)? as u64)),
    }
}

/// Text pieces aligned with token ids, as `str` objects checked to be valid
/// Unicode. `name(i)` names element i in errors.
pub(super) fn extract_piece_objects<'py>(
    obj: &Bound<'py, PyAny>,
    field: &str,
    name: &dyn Fn(usize) -> String,
) -> PyResult<Vec<Bound<'py, PyString>>> {
    if obj.is_instance_of::<PyString>() {
        return Err(arg_err(
            field,
            Problem::SingleStr {
                what: "a sequence of str (one piece per token)",
                wrapped: None,
            },
        ));
    }
    let one = |i: usize, item: Bound<'py, PyAny>| -> PyResult<Bound<'py, PyString>> {
        let s = item
            .cast_into::<PyString>()
            .map_err(|e| arg_err(&name(i), wrong_type("str", e.into_inner().as_any())))?;
        s.to_str()
            .map_err(|_| arg_err(&name(i), Problem::LoneSurrogate))?;
        Ok(s)
    };
    take_capped(obj, field, "a sequence of str", limits::MAX_STEP_TOKENS)?
        .into_iter()
        .enumerate()
        .map(|(i, item)| one(i, item))
        .collect()
}

pub(super) fn opt_list<'a, 'py>(
    obj: Option<&'a Bound<'py, PyAny>>,
) -> Option<&'a Bound<'py, PyAny>> {
    obj.filter(|o| !o.is_none())
}

/// Runs `f` on the text pieces of `texts` (one `str` per token) as UTF-8
/// views, each with its `str` object, or on `None` without texts.
///
/// A plain list is read from one copy of it (`list(texts)`, taken under the
/// list's lock on a free-threaded build), holding a reference to each item:
/// the views borrow objects this call owns, and another thread replacing
/// the items cannot hand this call a mix of two states. Anything that is
/// not a list of exact `str` goes through [`extract_piece_objects`] (on that
/// same copy for a list), whose errors name the element with `name(i)`.
pub(super) fn with_pieces<'py, R>(
    texts: Option<&Bound<'py, PyAny>>,
    name: &dyn Fn(usize) -> String,
    f: impl FnOnce(Option<&[&str]>, &[Bound<'py, PyAny>]) -> PyResult<R>,
) -> PyResult<R> {
    let Some(mut texts) = texts else {
        return f(None, &[]);
    };
    let copied;
    if let Ok(list) = texts.cast_exact::<PyList>() {
        if list.len() > limits::MAX_STEP_TOKENS {
            return Err(over_cap("texts", Some(list.len()), limits::MAX_STEP_TOKENS));
        }
        let copy = list.as_sequence().to_list()?;
        // One piece (a decode step's update): no vectors.
        if copy.len() == 1 {
            if let Ok(item) = copy.get_item(0) {
                if let Some(s) = item
                    .cast_exact::<PyString>()
                    .ok()
                    .and_then(|s| s.to_str().ok())
                {
                    return f(Some(&[s]), std::slice::from_ref(&item));
                }
            }
        }
        let held: Vec<Bound<'py, PyAny>> = copy.iter().collect();
        let strs: Option<Vec<&str>> = held
            .iter()
            .map(|o| o.cast_exact::<PyString>().ok()?.to_str().ok())
            .collect();
        if let Some(strs) = strs {
            return f(Some(&strs), &held);
        }
        copied = copy.into_any();
        texts = &copied;
    }
    // Pieces of a `str` subclass are handed on as plain `str` copies.
    let held: Vec<Bound<'py, PyAny>> = extract_piece_objects(texts, "texts", name)?
        .into_iter()
        .map(|s| {
            if s.is_exact_instance_of::<PyString>() {
                Ok(s.into_any())
            } else {
                Ok(PyString::new(s.py(), s.to_str()?).into_any())
            }
        })
        .collect::<PyResult<_>>()?;
    let strs = held
        .iter()
        .map(|s| s.cast::<PyString>()?.to_str())
        .collect::<PyResult<Vec<&str>>>()?;
    f(Some(&strs), &held)
}

/// The `slots=` argument of `FinishBatch.step`: a `range`, read from its
/// start and step, or any sequence of ints.
pub(super) enum Slots<'a, 'py> {
    Range(Borrowed<'a, 'py, PyRange>),
    Ints(Borrowed<'a, 'py, PyAny>),
}

impl<'a, 'py> FromPyObject<'a, 'py> for Slots<'a, 'py> {
    type Error = std::convert::Infallible;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> Result<Self, Self::Error> {
        Ok(match obj.cast::<PyRange>() {
            Ok(r) => Slots::Range(r),
            Err(_) => Slots::Ints(obj),
        })
    }
}

impl Slots<'_, '_> {
    /// The slots, at most `max_slots` of them.
    #[inline]
    pub(super) fn values(&self, max_slots: usize) -> PyResult<Vec<i64>> {
        match self {
            Slots::Range(r) => range_values(r, max_slots),
            Slots::Ints(obj) => extract_i64s(obj, "slots", max_slots),
        }
    }
}

/// The values of a `range` (any step). One longer than `max_slots` cannot
/// hold distinct slots in range, and is refused before it is materialized.
#[inline]
pub(super) fn range_values(r: &Bound<'_, PyRange>, max_slots: usize) -> PyResult<Vec<i64>> {
    let n = match r.len() {
        Ok(n) if n <= max_slots => n,
        Ok(n) => return Err(over_cap("slots", Some(n), max_slots)),
        Err(_) => return Err(over_cap("slots", None, max_slots)),
    };
    let out_of_range = |_| value_err("slots", r, |shown| Problem::OutOfRange { shown });
    let (start, step) = (
        r.start().map_err(out_of_range)?,
        r.step().map_err(out_of_range)?,
    );
    // start and step fit isize, and n <= max_slots, so no value overflows i64
    // unless the range does; such a slot is out of range for the batch anyway.
    let (start, step) = (start as i64, step as i64);
    let last = (n as i64 - 1)
        .max(0)
        .checked_mul(step)
        .and_then(|d| start.checked_add(d));
    Ok(match last {
        // No value overflows: a plain loop the compiler vectorizes.
        Some(_) => (0..n as i64).map(|k| start + k * step).collect(),
        None => (0..n as i64)
            .map(|k| start.saturating_add(k.saturating_mul(step)))
            .collect(),
    })
}

/// At most `cap` ints (a longer sequence is refused naming `field`).
pub(super) fn extract_i64s(obj: &Bound<'_, PyAny>, field: &str, cap: usize) -> PyResult<Vec<i64>> {
    let one = |item: &Bound<'_, PyAny>, i: usize| -> PyResult<i64> {
        extract_int(item, &|| format!("{field}[{i}]"))
    };
    if let Ok(list) = obj.cast_exact::<PyList>() {
        if list.len() > cap {
            return Err(over_cap(field, Some(list.len()), cap));
        }
        if let Some(v) = ffi::list_ints(list, Some, try_vec(list.len(), field)?) {
            return Ok(v);
        }
        let mut out = try_vec(list.len(), field)?;
        for (i, item) in list.iter().enumerate() {
            out.push(one(&item, i)?);
        }
        return Ok(out);
    }
    if let Some(v) = buffer_i64s(obj, field, cap)? {
        return Ok(v);
    }
    iter_of(obj, field, "a sequence of ints", cap)?
        .enumerate()
        .map(|(i, x)| {
            if i == cap {
                return Err(over_cap(field, None, cap));
            }
            one(&x?, i)
        })
        .collect()
}

/// The ints of a one-dimensional, C-contiguous buffer of native-order
/// integers (a NumPy int32/int64/uint32 array, `array.array`, `bytes`),
/// read in one pass with no Python object per element. `None` when `obj`
/// exports no such buffer (or a uint64 above `i64::MAX`); the caller's
/// general path then iterates `obj` and names any bad element.
pub(super) fn buffer_i64s(
    obj: &Bound<'_, PyAny>,
    field: &str,
    cap: usize,
) -> PyResult<Option<Vec<i64>>> {
    let Some(buf) = native_int_buffer(obj) else {
        return Ok(None);
    };
    if buf.item_count() > cap {
        return Err(over_cap(field, Some(buf.item_count()), cap));
    }
    Ok(read_int_buffer(&buf, try_vec(buf.item_count(), field)?))
}

/// `obj`'s buffer when it is one-dimensional, C-contiguous and of
/// native-order integers, the kind [`read_int_buffer`] reads.
fn native_int_buffer(obj: &Bound<'_, PyAny>) -> Option<PyUntypedBuffer> {
    if !ffi::has_buffer(obj) {
        return None;
    }
    let buf = PyUntypedBuffer::get(obj).ok()?;
    let format = buf.format().to_bytes();
    // 'c' items are one-byte `bytes` objects, not ints.
    if format.last() == Some(&b'c') {
        return None;
    }
    let order = format.first().copied();
    let native = matches!(order, Some(b'@' | b'=' | b'a'..=b'z' | b'A'..=b'Z'))
        || (cfg!(target_endian = "little") && order == Some(b'<'));
    native.then_some(buf)
}

/// The ints of a buffer accepted by [`native_int_buffer`]; `None` for an
/// element type it does not read, a buffer that is not one-dimensional,
/// contiguous and aligned (`np.frombuffer(..., offset=1)` starts at any
/// byte), or a uint64 above `i64::MAX`. `out` comes with room for the
/// buffer's items ([`try_vec`]).
fn read_int_buffer(buf: &PyUntypedBuffer, mut out: Vec<i64>) -> Option<Vec<i64>> {
    use pyo3::buffer::ElementType;
    fn widen<E: ffi::IntItem + Into<i64>>(buf: &PyUntypedBuffer, out: &mut Vec<i64>) -> Option<()> {
        out.extend(ffi::buffer_items::<E>(buf)?.iter().map(|&e| e.into()));
        Some(())
    }
    match ElementType::from_format(buf.format()) {
        ElementType::SignedInteger { bytes: 8 } => widen::<i64>(buf, &mut out),
        ElementType::SignedInteger { bytes: 4 } => widen::<i32>(buf, &mut out),
        ElementType::SignedInteger { bytes: 2 } => widen::<i16>(buf, &mut out),
        ElementType::SignedInteger { bytes: 1 } => widen::<i8>(buf, &mut out),
        ElementType::UnsignedInteger { bytes: 8 } => {
            let items = ffi::buffer_items::<u64>(buf)?;
            if items.iter().any(|&e| e > i64::MAX as u64) {
                return None;
            }
            out.extend(items.iter().map(|&e| e as i64));
            Some(())
        }
        ElementType::UnsignedInteger { bytes: 4 } => widen::<u32>(buf, &mut out),
        ElementType::UnsignedInteger { bytes: 2 } => widen::<u16>(buf, &mut out),
        ElementType::UnsignedInteger { bytes: 1 } => widen::<u8>(buf, &mut out),
        _ => None,
    }?;
    Some(out)
}

/// [`buffer_i64s`] for token ids: `None` also when one is outside `u32`.
pub(super) fn buffer_ids(
    obj: &Bound<'_, PyAny>,
    field: &str,
    cap: usize,
) -> PyResult<Option<Vec<u32>>> {
    let Some(v) = buffer_i64s(obj, field, cap)? else {
        return Ok(None);
    };
    // Two branch-free passes the compiler vectorizes.
    if v.iter().any(|&x| u32::try_from(x).is_err()) {
        return Ok(None);
    }
    let mut out = try_vec(v.len(), field)?;
    out.extend(v.iter().map(|&x| x as u32));
    Ok(Some(out))
}
