//! `StopParams`: a request's stop parameters, validated at construction.

use std::sync::Arc;

use pyo3::exceptions::{PyAttributeError, PyKeyError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::convert::{
    self, extract_ids, extract_nonneg, extract_opt_nonneg, extract_opt_positive, extract_utf8,
    py_repr, shown_value, take_capped, type_name, wrong_type,
};
use super::errors::{arg_err, to_py_err};
use super::matchers::{compile_regexes, compile_stops};
use crate::error::Problem;
use crate::finish::{Repetition, StopParams};
use crate::limits;
use crate::reasoning::{Channel, Marker, Reasoning, ReasoningSpec, Scope};

/// One scope name: a `TypeError` for a wrong type, a `ValueError` for a
/// lone surrogate (it was "must be a str, got str") or an unknown name.
fn scope_of(obj: &Bound<'_, PyAny>, field: &str) -> PyResult<Scope> {
    if !obj.is_instance_of::<pyo3::types::PyString>() {
        return Err(arg_err(field, wrong_type("a str", obj)));
    }
    let name = extract_utf8(obj, &|| field.to_owned())?;
    Scope::from_name(name).ok_or_else(|| {
        arg_err(
            field,
            Problem::NotOneOf {
                shown: crate::error::shown(name),
                allowed: Scope::NAMES.into(),
            },
        )
    })
}

/// A `*_scopes=` argument: one scope name for every entry of a list of `n`,
/// or a sequence of names, one per entry (its length is checked by the core).
fn extract_scopes(obj: Option<&Bound<'_, PyAny>>, field: &str, n: usize) -> PyResult<Vec<Scope>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Vec::new());
    };
    if obj.is_instance_of::<pyo3::types::PyString>() {
        return Ok(vec![scope_of(obj, field)?; n]);
    }
    let items = take_capped(
        obj,
        field,
        "a str or a sequence of str",
        limits::MAX_STOP_TOKEN_IDS.max(n),
    )?;
    items
        .iter()
        .enumerate()
        .map(|(i, o)| scope_of(o, &format!("{field}[{i}]")))
        .collect()
}

/// A pair with more than two items says how many (`take_capped` reports
/// only the cap); any other error is returned as is.
fn pair_count_err(e: PyErr, item: &Bound<'_, PyAny>, at: &str) -> PyErr {
    match item.len() {
        Ok(n) if n > 2 && e.is_instance_of::<pyo3::exceptions::PyValueError>(item.py()) => {
            arg_err(at, Problem::NotAPair { n })
        }
        _ => e,
    }
}

/// An optional marker text (`reasoning_start`, `reasoning_end`) or option
/// name: a str that is valid Unicode, errors naming `field`.
fn opt_text(obj: Option<&Bound<'_, PyAny>>, field: &str) -> PyResult<Option<String>> {
    obj.filter(|o| !o.is_none())
        .map(|o| extract_utf8(o, &|| field.to_owned()).map(str::to_owned))
        .transpose()
}

/// `tool_call_markers` (pairs of str) and `tool_call_marker_ids` (pairs of
/// int): the span marker pairs, pair i of one list with pair i of the other.
fn extract_spans(
    texts: Option<&Bound<'_, PyAny>>,
    ids: Option<&Bound<'_, PyAny>>,
) -> PyResult<Vec<[Marker; 2]>> {
    const TEXTS: &str = "tool_call_markers";
    const IDS: &str = "tool_call_marker_ids";
    let cap = limits::MAX_TOOL_CALL_SPANS;
    fn pairs<'py>(
        obj: Option<&Bound<'py, PyAny>>,
        field: &str,
        cap: usize,
    ) -> PyResult<Option<Vec<[Bound<'py, PyAny>; 2]>>> {
        let Some(obj) = obj.filter(|o| !o.is_none()) else {
            return Ok(None);
        };
        let items = take_capped(obj, field, "a sequence of (start, end) pairs", cap)?;
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let at = format!("{field}[{i}]");
            if item.is_instance_of::<pyo3::types::PyString>() {
                // As for `stop`: a str is a sequence, but never meant as one.
                let what = "a (start, end) pair";
                return Err(arg_err(
                    &at,
                    Problem::SingleStr {
                        what,
                        wrapped: None,
                    },
                ));
            }
            // A set or a mapping has no order: which marker starts the span
            // would follow the hash seed, so it differed between processes.
            if item.is_instance_of::<pyo3::types::PySet>()
                || item.is_instance_of::<pyo3::types::PyFrozenSet>()
                || item.is_instance_of::<pyo3::types::PyMapping>()
            {
                let what = "a (start, end) pair in order (a tuple or list)";
                return Err(arg_err(&at, wrong_type(what, item)));
            }
            let two = take_capped(item, &at, "a (start, end) pair", 2)
                .map_err(|e| pair_count_err(e, item, &at))?;
            if two.len() != 2 {
                return Err(arg_err(&at, Problem::NotAPair { n: two.len() }));
            }
            out.push([two[0].clone(), two[1].clone()]);
        }
        Ok(Some(out))
    }
    let texts = pairs(texts, TEXTS, cap)?;
    let ids = pairs(ids, IDS, cap)?;
    if let (Some(t), Some(d)) = (&texts, &ids) {
        if t.len() != d.len() {
            return Err(arg_err(
                IDS,
                Problem::Count {
                    n: d.len(),
                    unit: "pairs",
                    expected: t.len(),
                    per: "pairs of tool_call_markers",
                    hint: "; pair i of each list is the same markers",
                },
            ));
        }
    }
    let n = texts.as_ref().or(ids.as_ref()).map_or(0, Vec::len);
    let mut spans = vec![[Marker::default(), Marker::default()]; n];
    for (i, pair) in texts.iter().flatten().enumerate() {
        for (side, o) in pair.iter().enumerate() {
            let at = format!("{TEXTS}[{i}][{side}]");
            spans[i][side].text = Some(extract_utf8(o, &|| at.clone())?.to_owned());
        }
    }
    for (i, pair) in ids.iter().flatten().enumerate() {
        for (side, o) in pair.iter().enumerate() {
            let at = format!("{IDS}[{i}][{side}]");
            let v = extract_nonneg(o, &at)?;
            let id = u32::try_from(v).map_err(|_| {
                arg_err(
                    &at,
                    Problem::NotATokenId {
                        value: i64::try_from(v).unwrap_or(i64::MAX),
                    },
                )
            })?;
            spans[i][side].token_id = Some(id);
        }
    }
    Ok(spans)
}

/// The reasoning arguments of `StopParams(...)` with the tool-call spans,
/// `None` when no marker, no span and no reasoning option is given.
#[allow(clippy::too_many_arguments)]
fn extract_reasoning(
    p: &StopParams,
    start: Option<String>,
    start_id: Option<&Bound<'_, PyAny>>,
    end: Option<String>,
    end_id: Option<&Bound<'_, PyAny>>,
    end_ids: Option<&Bound<'_, PyAny>>,
    starts_in: Option<String>,
    keep_markers: bool,
    max_reasoning_tokens: Option<&Bound<'_, PyAny>>,
    scopes: [Option<&Bound<'_, PyAny>>; 3],
    spans: Vec<[Marker; 2]>,
) -> PyResult<Option<Arc<Reasoning>>> {
    let id = |o: Option<&Bound<'_, PyAny>>, field: &str| -> PyResult<Option<u32>> {
        extract_opt_nonneg(o, field)?
            .map(|v| {
                u32::try_from(v).map_err(|_| {
                    arg_err(
                        field,
                        Problem::NotATokenId {
                            value: i64::try_from(v).unwrap_or(i64::MAX),
                        },
                    )
                })
            })
            .transpose()
    };
    let given = |o: Option<&Bound<'_, PyAny>>| o.is_some_and(|o| !o.is_none());
    let any = start.is_some()
        || end.is_some()
        || given(start_id)
        || given(end_id)
        || given(end_ids)
        || starts_in.is_some()
        || keep_markers
        || given(max_reasoning_tokens)
        || scopes.iter().any(|s| given(*s))
        || !spans.is_empty();
    if !any {
        return Ok(None);
    }
    let starts_in = starts_in
        .map(|name| {
            Channel::from_name(&name).ok_or_else(|| {
                arg_err(
                    "reasoning_starts_in",
                    Problem::NotOneOf {
                        shown: crate::error::shown(&name),
                        allowed: "'reasoning' or 'content'".into(),
                    },
                )
            })
        })
        .transpose()?;
    let n_regex = p.stop_regex.as_ref().map_or(0, |r| r.len());
    let n_stop = p.stop.as_ref().map_or(0, |s| s.len());
    let spec = ReasoningSpec {
        start: Marker {
            text: start,
            token_id: id(start_id, "reasoning_start_id")?,
        },
        end: Marker {
            text: end,
            token_id: id(end_id, "reasoning_end_id")?,
        },
        starts_in,
        keep_markers,
        max_reasoning_tokens: extract_opt_nonneg(max_reasoning_tokens, "max_reasoning_tokens")?,
        end_ids: match end_ids.filter(|o| !o.is_none()) {
            Some(o) => extract_ids(o, "reasoning_end_ids", limits::MAX_STOP_TOKEN_IDS)?,
            None => Vec::new(),
        },
        stop_scopes: extract_scopes(scopes[0], "stop_scopes", n_stop)?,
        stop_regex_scopes: extract_scopes(scopes[1], "stop_regex_scopes", n_regex)?,
        stop_token_id_scopes: extract_scopes(
            scopes[2],
            "stop_token_id_scopes",
            p.stop_token_ids.len(),
        )?,
        spans,
    };
    let r = Reasoning::new(
        spec,
        p.stop.as_ref(),
        p.stop_regex.as_ref(),
        &p.stop_token_ids,
        &p.eos_token_ids,
    )
    .map_err(to_py_err)?;
    Ok(Some(Arc::new(r)))
}

fn extract_repetition(obj: &Bound<'_, PyAny>) -> PyResult<Repetition> {
    let get = |key: &str, default: Option<u64>| -> PyResult<usize> {
        let v = match obj.get_item(key) {
            Ok(v) => Some(v),
            Err(e) if e.is_instance_of::<PyKeyError>(obj.py()) => None,
            // Whatever else the caller's `__getitem__` raised is theirs.
            Err(e) if !e.is_instance_of::<PyTypeError>(obj.py()) => return Err(e),
            Err(_) => {
                return Err(arg_err(
                    "repetition",
                    Problem::WrongType {
                        expected:
                            "a mapping with keys max_pattern_size, min_pattern_size, min_count",
                        got: type_name(obj),
                    },
                ))
            }
        };
        match (v, default) {
            (Some(v), _) => Ok(extract_nonneg(&v, &format!("repetition[{key:?}]"))? as usize),
            (None, Some(d)) => Ok(d as usize),
            (None, None) => Err(arg_err(
                "repetition",
                Problem::MissingKey { key: key.into() },
            )),
        }
    };
    const KEYS: [&str; 3] = ["max_pattern_size", "min_pattern_size", "min_count"];
    // A mapping's `keys()` is called and its errors propagate: a mapping
    // whose keys cannot be listed is not silently taken as having none.
    let keys = match obj.getattr("keys") {
        Ok(keys) => Some(keys.call0()?),
        Err(e) if e.is_instance_of::<PyAttributeError>(obj.py()) => None,
        Err(e) => return Err(e),
    };
    if let Some(keys) = keys {
        let keys = take_capped(&keys, "repetition.keys()", "an iterable of keys", 64)?;
        for key in keys {
            let known = key
                .extract::<String>()
                .is_ok_and(|k| KEYS.contains(&k.as_str()));
            if !known {
                return Err(arg_err(
                    "repetition",
                    Problem::UnknownKey {
                        shown: shown_value(&key)?,
                        expected: format!("{KEYS:?}"),
                    },
                ));
            }
        }
    }
    Ok(Repetition {
        max_pattern_size: get("max_pattern_size", None)?,
        min_pattern_size: get("min_pattern_size", Some(0))?,
        min_count: get("min_count", None)?,
    })
}

/// The `params=` argument of `FinishTracker(...)` / `FinishBatch.add`.
pub(super) fn params_arg(obj: &Bound<'_, PyAny>) -> PyResult<Arc<StopParams>> {
    let p = obj
        .cast::<PyStopParams>()
        .map_err(|_| arg_err("params", wrong_type("a stopline.StopParams", obj)))?;
    Ok(Arc::clone(&p.get().inner))
}

/// Per-request stop parameters, validated at construction (field names as in
/// vLLM's `SamplingParams`; all keyword-only).
///
/// Counts are output tokens (`max_tokens`, `min_tokens`) or prompt + output
/// tokens (`max_model_len`, with `prompt_len` the prompt's). `stop` is a
/// sequence of non-empty str or a compiled `StopStrings`; `stop_regex` a
/// sequence of Rust-syntax patterns; `eos_token_ids` / `stop_token_ids` ints in
/// [0, vocab_size) when `vocab_size` is set; `repetition` a mapping with
/// `max_pattern_size`, `min_pattern_size` (0 means 1) and `min_count` (vLLM's
/// repetition detection). The order of checks these feed is in
/// docs/semantics.md.
///
/// Raises `ValueError` naming the field and value for out-of-range values
/// (max_tokens < 1, min_tokens > max_tokens, prompt_len >= max_model_len, ids
/// >= vocab_size, empty stop strings, bad repetition values, unknown
/// repetition keys) and `TypeError` for wrong types.
#[pyclass(name = "StopParams", module = "stopline", frozen)]
pub struct PyStopParams {
    pub(super) inner: Arc<StopParams>,
}

pymethods_with_getters! {
impl PyStopParams {
    getters of inner {
        /// Output-token budget; `None` for no cap.
        max_tokens: Option<u64>,
        /// Output tokens gating stop strings, regexes and repetition (0 when not set).
        min_tokens: u64,
        /// Prompt tokens (0 when not set).
        prompt_len: u64,
        /// Context cap in prompt-plus-output positions; `None` for none.
        max_model_len: Option<u64>,
        /// EOS ids, a new list on every read (empty when not set).
        eos_token_ids: Vec<u32>,
        /// Whether the EOS check is disabled.
        ignore_eos: bool,
        /// Stop token ids, a new list on every read (empty when not set).
        stop_token_ids: Vec<u32>,
        /// Whether stop text and an ending token's text are kept.
        include_stop_str_in_output: bool,
        /// Vocabulary size; `None` when ids are not range-checked.
        vocab_size: Option<u32>,
        /// Stop strings in list order, a new list on every read (empty when not set).
        stop: Vec<String>,
        /// Stop regex patterns in list order, a new list on every read (empty when not set).
        stop_regex: Vec<String>,
    }

    #[new]
    #[pyo3(signature = (
        *, max_tokens = None, min_tokens = None, prompt_len = None, max_model_len = None,
        eos_token_ids = None, ignore_eos = false, stop_token_ids = None, stop = None,
        include_stop_str_in_output = false, vocab_size = None, repetition = None,
        stop_regex = None, reasoning_start = None, reasoning_start_id = None,
        reasoning_end = None, reasoning_end_id = None, reasoning_end_ids = None,
        reasoning_starts_in = None, keep_reasoning_markers = false,
        max_reasoning_tokens = None, stop_scopes = None, stop_regex_scopes = None,
        stop_token_id_scopes = None, token_aligned = false, tool_call_markers = None,
        tool_call_marker_ids = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        max_tokens: Option<&Bound<'_, PyAny>>,
        min_tokens: Option<&Bound<'_, PyAny>>,
        prompt_len: Option<&Bound<'_, PyAny>>,
        max_model_len: Option<&Bound<'_, PyAny>>,
        eos_token_ids: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = convert::flags::ignore_eos)] ignore_eos: bool,
        stop_token_ids: Option<&Bound<'_, PyAny>>,
        stop: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = convert::flags::include_stop_str_in_output)] include_stop_str_in_output: bool,
        vocab_size: Option<&Bound<'_, PyAny>>,
        repetition: Option<&Bound<'_, PyAny>>,
        stop_regex: Option<&Bound<'_, PyAny>>,
        reasoning_start: Option<&Bound<'_, PyAny>>,
        reasoning_start_id: Option<&Bound<'_, PyAny>>,
        reasoning_end: Option<&Bound<'_, PyAny>>,
        reasoning_end_id: Option<&Bound<'_, PyAny>>,
        reasoning_end_ids: Option<&Bound<'_, PyAny>>,
        reasoning_starts_in: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = convert::flags::keep_reasoning_markers)] keep_reasoning_markers: bool,
        max_reasoning_tokens: Option<&Bound<'_, PyAny>>,
        stop_scopes: Option<&Bound<'_, PyAny>>,
        stop_regex_scopes: Option<&Bound<'_, PyAny>>,
        stop_token_id_scopes: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = convert::flags::token_aligned)] token_aligned: bool,
        tool_call_markers: Option<&Bound<'_, PyAny>>,
        tool_call_marker_ids: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let ids = |o: Option<&Bound<'_, PyAny>>, field: &str| -> PyResult<Vec<u32>> {
            match o {
                Some(o) if !o.is_none() => extract_ids(o, field, limits::MAX_STOP_TOKEN_IDS),
                _ => Ok(Vec::new()),
            }
        };
        let vocab = extract_opt_positive(vocab_size, "vocab_size")?;
        let mut params = StopParams {
            max_tokens: extract_opt_positive(max_tokens, "max_tokens")?,
            min_tokens: extract_opt_nonneg(min_tokens, "min_tokens")?.unwrap_or(0),
            prompt_len: extract_opt_nonneg(prompt_len, "prompt_len")?.unwrap_or(0),
            max_model_len: extract_opt_positive(max_model_len, "max_model_len")?,
            eos_token_ids: ids(eos_token_ids, "eos_token_ids")?,
            ignore_eos,
            stop_token_ids: ids(stop_token_ids, "stop_token_ids")?,
            stop: match stop {
                Some(s) if !s.is_none() => Some(compile_stops(s, "stop")?),
                _ => None,
            },
            stop_regex: match stop_regex {
                Some(s) if !s.is_none() => Some(compile_regexes(s)?),
                _ => None,
            },
            include_stop_str_in_output,
            vocab_size: vocab
                .map(|v| {
                    u32::try_from(v).map_err(|_| {
                        let max = u32::MAX.into();
                        arg_err("vocab_size", Problem::Unsupported { value: v, max })
                    })
                })
                .transpose()?,
            repetition: match repetition {
                Some(r) if !r.is_none() => Some(extract_repetition(r)?),
                _ => None,
            },
            reasoning: None,
            token_aligned,
        };
        params.reasoning = extract_reasoning(
            &params,
            opt_text(reasoning_start, "reasoning_start")?,
            reasoning_start_id,
            opt_text(reasoning_end, "reasoning_end")?,
            reasoning_end_id,
            reasoning_end_ids,
            opt_text(reasoning_starts_in, "reasoning_starts_in")?,
            keep_reasoning_markers,
            max_reasoning_tokens,
            [stop_scopes, stop_regex_scopes, stop_token_id_scopes],
            extract_spans(tool_call_markers, tool_call_marker_ids)?,
        )?;
        params.validate().map_err(to_py_err)?;
        Ok(Self {
            inner: Arc::new(params),
        })
    }

    /// `{"reasoning_start", "reasoning_start_id", "reasoning_end", "reasoning_end_id",
    /// "reasoning_end_ids", "reasoning_starts_in", "keep_reasoning_markers",
    /// "max_reasoning_tokens", "stop_scopes", "stop_regex_scopes", "stop_token_id_scopes"}` as
    /// accepted (scopes one per entry); `None` without reasoning channels.
    #[getter]
    fn reasoning<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(r) = self.inner.reasoning.as_ref().filter(|r| r.has_block()) else {
            return Ok(None);
        };
        let s = r.spec();
        let names = |v: &[Scope]| v.iter().map(|x| x.as_str()).collect::<Vec<_>>();
        let d = PyDict::new(py);
        d.set_item("reasoning_start", s.start.text.as_deref())?;
        d.set_item("reasoning_start_id", s.start.token_id)?;
        d.set_item("reasoning_end", s.end.text.as_deref())?;
        d.set_item("reasoning_end_id", s.end.token_id)?;
        d.set_item("reasoning_end_ids", &s.end_ids)?;
        d.set_item("reasoning_starts_in", s.starts_in.map(Channel::as_str))?;
        d.set_item("keep_reasoning_markers", s.keep_markers)?;
        d.set_item("max_reasoning_tokens", s.max_reasoning_tokens)?;
        d.set_item("stop_scopes", names(&s.stop_scopes))?;
        d.set_item("stop_regex_scopes", names(&s.stop_regex_scopes))?;
        d.set_item("stop_token_id_scopes", names(&s.stop_token_id_scopes))?;
        Ok(Some(d))
    }

    /// Tool-call span marker texts as `(start, end)` pairs, a new list on every read
    /// (empty when not set; docs/semantics.md 11.10).
    #[getter]
    fn tool_call_markers(&self) -> Vec<(String, String)> {
        self.span_pairs(|m| m.text.clone())
    }

    /// Tool-call span marker ids as `(start, end)` pairs, a new list on every read (empty
    /// when not set).
    #[getter]
    fn tool_call_marker_ids(&self) -> Vec<(u32, u32)> {
        self.span_pairs(|m| m.token_id)
    }

    /// Whether a tracker reads a prompt for an open reasoning block without a
    /// vocabulary: both block markers are token ids (docs/semantics.md 11,
    /// rule 1). Otherwise `prompt_token_ids` needs a `vocabulary`.
    #[getter]
    fn reads_prompt_by_ids(&self) -> bool {
        self.inner.reads_prompt_by_ids()
    }

    /// Whether text is released only in whole tokens.
    #[getter]
    fn token_aligned(&self) -> bool {
        self.inner.token_aligned
    }

    /// `{"max_pattern_size", "min_pattern_size", "min_count"}`, as accepted.
    #[getter]
    fn repetition<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.inner
            .repetition
            .map(|r| {
                let d = PyDict::new(py);
                d.set_item("max_pattern_size", r.max_pattern_size)?;
                d.set_item("min_pattern_size", r.min_pattern_size)?;
                d.set_item("min_count", r.min_count)?;
                Ok(d)
            })
            .transpose()
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let p = &self.inner;
        Ok(format!(
            "StopParams(max_tokens={}, min_tokens={}, prompt_len={}, max_model_len={}, eos_token_ids={}, \
             ignore_eos={}, stop_token_ids={}, stop={}, stop_regex={}, include_stop_str_in_output={}, vocab_size={}, \
             repetition={}, reasoning={}, token_aligned={}, tool_call_markers={}, tool_call_marker_ids={})",
            py_repr(py, p.max_tokens)?,
            p.min_tokens,
            p.prompt_len,
            py_repr(py, p.max_model_len)?,
            py_repr(py, &p.eos_token_ids)?,
            py_repr(py, p.ignore_eos)?,
            py_repr(py, &p.stop_token_ids)?,
            py_repr(py, self.stop())?,
            py_repr(py, self.stop_regex())?,
            py_repr(py, p.include_stop_str_in_output)?,
            py_repr(py, p.vocab_size)?,
            py_repr(py, self.repetition(py)?)?,
            py_repr(py, self.reasoning(py)?)?,
            py_repr(py, p.token_aligned)?,
            py_repr(py, self.tool_call_markers())?,
            py_repr(py, self.tool_call_marker_ids())?,
        ))
    }

    /// Pickling (protocol 2 and up, `copy`): the keyword arguments that build
    /// an equal `StopParams`, validated again when unpickled.
    fn __getnewargs_ex__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<((), Bound<'py, PyDict>)> {
        let p = &self.inner;
        let kw = PyDict::new(py);
        kw.set_item("max_tokens", p.max_tokens)?;
        kw.set_item("min_tokens", p.min_tokens)?;
        kw.set_item("prompt_len", p.prompt_len)?;
        kw.set_item("max_model_len", p.max_model_len)?;
        kw.set_item("eos_token_ids", &p.eos_token_ids)?;
        kw.set_item("ignore_eos", p.ignore_eos)?;
        kw.set_item("stop_token_ids", &p.stop_token_ids)?;
        kw.set_item("stop", p.stop.as_ref().map(|_| self.stop()))?;
        kw.set_item("stop_regex", p.stop_regex.as_ref().map(|_| self.stop_regex()))?;
        kw.set_item("include_stop_str_in_output", p.include_stop_str_in_output)?;
        kw.set_item("vocab_size", p.vocab_size)?;
        kw.set_item("repetition", self.repetition(py)?)?;
        kw.set_item("token_aligned", p.token_aligned)?;
        // The reasoning getter's keys are the constructor's (absent without a block).
        if let Some(reasoning) = self.reasoning(py)? {
            kw.update(reasoning.as_mapping())?;
        }
        // Tool-call spans stand alone too (without a reasoning block, no scopes).
        let texts = self.tool_call_markers();
        let ids = self.tool_call_marker_ids();
        kw.set_item("tool_call_markers", (!texts.is_empty()).then_some(texts))?;
        kw.set_item("tool_call_marker_ids", (!ids.is_empty()).then_some(ids))?;
        Ok(((), kw))
    }
}
}

impl PyStopParams {
    /// The span pairs whose markers both have `part` (texts or ids; given
    /// together, every pair has both).
    fn span_pairs<T>(&self, part: impl Fn(&Marker) -> Option<T>) -> Vec<(T, T)> {
        let spans = self
            .inner
            .reasoning
            .as_ref()
            .map_or(&[][..], |r| &r.spec().spans[..]);
        spans
            .iter()
            .filter_map(|[a, b]| Some((part(a)?, part(b)?)))
            .collect()
    }
}
