//! The binding of `stopline.logits`' host-side work: reading a request's
//! `bad_words` and laying them out (`crate::bad_words`) with the GIL
//! released. A child module of `python`, whose private helpers it shares.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyInt, PyList, PyString, PyTuple, PyType};

use super::convert::{
    buffer_i64s, over_cap, shown_value, take_capped, try_vec, type_name, value_err,
};
use super::errors::{arg_err, to_py_err};
use super::ffi::list_ints;
use crate::bad_words::{build, check_ids};
use crate::error::Problem;

const FIELD: &str = "bad_words";

/// Validates `bad_words` and lays it out for `LogitsConstraints.set`.
///
/// Returns `(single, prefix, prefix_len, last, width)`: native-order int32
/// arrays as `bytearray` (for `torch.frombuffer`): the distinct one-token
/// words; the distinct multi-token words' prefixes, `[multi, width]` padded
/// with -1; their prefix lengths; their last tokens. Reading the lists needs
/// the GIL (a list of ints is read without a call per item); validation,
/// deduplication and the layout run without it. Errors are those of the
/// pure-Python reader it replaced (docs/errors.md): `TypeError` for a
/// non-int id or a word that is no sequence, `ValueError` for an id outside
/// `[0, vocab_size)`, an empty word, a word over `max_word_tokens` tokens or
/// more than `max_words` words, reported for the first bad word in order.
/// What the caller's objects raise (`__index__`, `__iter__`) propagates.
#[pyfunction]
#[pyo3(signature = (words, vocab_size, max_words, max_word_tokens))]
pub(super) fn _bad_words_table<'py>(
    py: Python<'py>,
    words: &Bound<'py, PyAny>,
    vocab_size: u32,
    max_words: usize,
    max_word_tokens: usize,
) -> PyResult<Bound<'py, PyTuple>> {
    let items = take_capped(words, FIELD, "a sequence of token-id sequences", max_words)?;
    let mut ids: Vec<i64> = Vec::new();
    let mut ends = try_vec(items.len(), FIELD)?;
    for word in &items {
        if let Err(e) = read_word(word, vocab_size, max_word_tokens, &mut ids) {
            // An earlier word, or an earlier id of this one, may be bad too:
            // that error comes first, as reading in order would give it.
            let done = ends.last().copied().unwrap_or(0);
            build(&ids[..done], &ends, vocab_size, max_words, max_word_tokens)
                .and_then(|_| check_ids(&ids[done..], vocab_size))
                .map_err(to_py_err)?;
            return Err(e);
        }
        ends.push(ids.len());
    }
    let t = py
        .detach(|| build(&ids, &ends, vocab_size, max_words, max_word_tokens))
        .map_err(to_py_err)?;
    let [single, prefix, prefix_len, last] =
        [&t.single, &t.prefix, &t.prefix_len, &t.last].map(|v| int32_bytes(py, v));
    (single?, prefix?, prefix_len?, last?, t.width).into_pyobject(py)
}

/// `v` as a `bytearray` of native-order int32 (one vectorized copy).
fn int32_bytes<'py>(py: Python<'py>, v: &[i32]) -> PyResult<Bound<'py, PyByteArray>> {
    PyByteArray::new_with(py, 4 * v.len(), |buf| {
        for (dst, x) in buf.chunks_exact_mut(4).zip(v) {
            dst.copy_from_slice(&x.to_ne_bytes());
        }
        Ok(())
    })
}

/// Appends one word's ids to `ids`. On an error, `ids` ends with the ids of
/// this word read before the bad one (a cap error reads none).
fn read_word(word: &Bound<'_, PyAny>, vocab: u32, cap: usize, ids: &mut Vec<i64>) -> PyResult<()> {
    if let Ok(list) = word.cast_exact::<PyList>() {
        if list.len() > cap {
            return Err(over_cap(FIELD, Some(list.len()), cap));
        }
        // The fast read refuses a bool (or any non-int): the loop below names it.
        if let Some(v) = list_ints(list, Some, try_vec(list.len(), FIELD)?) {
            ids.extend(v);
            return Ok(());
        }
        for x in list.iter() {
            ids.push(read_id(&x, vocab)?);
        }
        return Ok(());
    }
    if let Ok(tuple) = word.cast_exact::<PyTuple>() {
        if tuple.len() > cap {
            return Err(over_cap(FIELD, Some(tuple.len()), cap));
        }
        for x in tuple.iter_borrowed() {
            ids.push(read_id(&x, vocab)?);
        }
        return Ok(());
    }
    let py = word.py();
    if word.is_instance_of::<PyString>()
        || word.is_instance_of::<PyBytes>()
        || !word.get_type().hasattr(pyo3::intern!(py, "__iter__"))?
    {
        let got = shown_value(word)?;
        return Err(arg_err(
            FIELD,
            Problem::NotASequence {
                expected: "a sequence of token ids",
                got,
            },
        ));
    }
    if let Some(v) = buffer_i64s(word, FIELD, cap)? {
        ids.extend(v);
        return Ok(());
    }
    // A tensor or array of another rank would be read as rows, not ids.
    if word.hasattr(pyo3::intern!(py, "ndim"))? {
        let ndim = word.getattr(pyo3::intern!(py, "ndim"))?;
        if ndim.extract::<i64>().ok() != Some(1) {
            let got = format!("a {ndim}-d {}", type_name(word));
            return Err(arg_err(
                FIELD,
                Problem::NotASequence {
                    expected: "a 1-D sequence of token ids",
                    got,
                },
            ));
        }
    }
    for x in take_capped(word, FIELD, "a sequence of token ids", cap)? {
        ids.push(read_id(&x, vocab)?);
    }
    Ok(())
}

/// One id as the Python reader took it: a `numbers.Integral` that is not a
/// bool; any size (a huge one is reported out of range).
fn read_id(item: &Bound<'_, PyAny>, vocab: u32) -> PyResult<i64> {
    static INTEGRAL: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    let py = item.py();
    let is_int = item.is_exact_instance_of::<PyInt>()
        || (!item.is_instance_of::<PyBool>()
            && item.is_instance(INTEGRAL.import(py, "numbers", "Integral")?)?);
    if !is_int {
        let shown = shown_value(item)?;
        return Err(arg_err(FIELD, Problem::IdNotInt { shown }));
    }
    item.extract::<i64>().map_err(|e| {
        if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(py) {
            value_err(FIELD, item, |shown| Problem::IdNotInVocab {
                shown,
                vocab_size: vocab.into(),
            })
        } else {
            e
        }
    })
}
