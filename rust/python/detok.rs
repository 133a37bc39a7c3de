//! The binding of the detokenizer (`Vocabulary`, `IncrementalDecoder`) and
//! the arguments `FinishBatch` / `FinishTracker` take for ids-only steps.

use std::sync::Arc;

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::convert::{detach_if, extract_ids, extract_utf8, type_name, DETACH_IDS};
use super::errors::{arg_err, not_picklable, to_py_err, value_error};
use crate::detok_batch::SeqDecoder;
use crate::detokenize::{read_tokenizer_file, DecodeOptions, DecodeState, Vocabulary};
use crate::error::{Error, Problem};
use crate::finish::StopParams;
use crate::reasoning::PromptState;

/// A tokenizer's decoding table, built from a Hugging Face `tokenizer.json`:
/// the decoded bytes of every token id, in one arena. Immutable and shared
/// by any number of sequences and threads.
///
/// Supported decoders: `ByteLevel` (GPT-2, Llama-3, Qwen, DeepSeek, SmolLM2),
/// `Sequence[Replace, ByteFallback, Fuse, Strip]` (Llama-2, Mistral),
/// `Metaspace`, `WordPiece` (BERT) and none; the rules are in
/// docs/semantics.md, "Incremental detokenization".
#[pyclass(name = "Vocabulary", module = "stopline", frozen)]
pub struct PyVocabulary {
    pub(super) inner: Arc<Vocabulary>,
}

fn options(skip_special_tokens: bool, spaces_between_special_tokens: bool) -> DecodeOptions {
    DecodeOptions {
        skip_special_tokens,
        spaces_between_special_tokens,
    }
}

#[pymethods]
impl PyVocabulary {
    /// Reads a `tokenizer.json` file (a regular file of at most 128 MiB:
    /// a FIFO or device is refused before it is opened). The GIL is
    /// released while it is read and parsed.
    ///
    /// Raises `OSError` if the file cannot be read; `ValueError` naming what
    /// is wrong for a file that is not regular or over the cap, a malformed
    /// file, an id at or above 2**24, a decoder over its caps or an
    /// unsupported decoder (named); `MemoryError` if the tables cannot be
    /// allocated.
    #[staticmethod]
    fn from_file(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Self> {
        let shown = crate::error::shown(&path.display().to_string());
        let read = py.detach(|| {
            read_tokenizer_file(&path, &shown)
                .map(|r| r.and_then(|data| Vocabulary::from_json(&data)))
        });
        let inner = read
            .map_err(|e| PyOSError::new_err(format!("cannot read {shown}: {e}")))?
            .map_err(to_py_err)?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// Builds the vocabulary from the text of a `tokenizer.json` (as
    /// `tokenizers.Tokenizer.to_str()` returns it). Raises as `from_file`;
    /// `ValueError` naming `json` for a `str` with a lone surrogate.
    #[staticmethod]
    fn from_str(py: Python<'_>, json: &Bound<'_, PyAny>) -> PyResult<Self> {
        let json = extract_utf8(json, &|| "json".to_owned())?;
        let inner = py
            .detach(|| Vocabulary::from_json(json.as_bytes()))
            .map_err(to_py_err)?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// Ids are in `[0, vocab_size)`: one past the largest id of the model
    /// vocabulary and the added tokens.
    #[getter]
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    /// The decoder as the file names it, e.g. `'ByteLevel'`.
    #[getter]
    fn decoder(&self) -> &str {
        self.inner.decoder_name()
    }

    /// Bytes held by the decoding tables.
    fn memory_usage(&self) -> usize {
        self.inner.memory_usage()
    }

    /// The text of `token_ids`, as `tokenizers.Tokenizer.decode(ids,
    /// skip_special_tokens)` gives it (vLLM's `spaces_between_special_tokens`
    /// rule on top when that is False). Raises `ValueError` naming
    /// `token_ids[i]` for an id outside `[0, vocab_size)` or ids whose token
    /// text is over `LIMITS["max_decode_bytes"]` (summed before decoding);
    /// `MemoryError` if the text cannot be allocated. From 4,096 ids the
    /// decode runs without the GIL.
    #[pyo3(signature = (token_ids, skip_special_tokens = true, spaces_between_special_tokens = true))]
    fn decode(
        &self,
        token_ids: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = crate::python::convert::flags::skip_special_tokens)]
        skip_special_tokens: bool,
        #[pyo3(from_py_with = crate::python::convert::flags::spaces_between_special_tokens)]
        spaces_between_special_tokens: bool,
    ) -> PyResult<String> {
        let ids = extract_ids(token_ids, "token_ids", crate::limits::MAX_STEP_TOKENS)?;
        let opts = options(skip_special_tokens, spaces_between_special_tokens);
        py_decode(token_ids.py(), ids.len(), || self.inner.decode(&ids, opts))
    }

    /// A streaming decoder for one sequence, primed with `prompt_token_ids`
    /// (their text is not returned; decoding continues after them).
    #[pyo3(signature = (prompt_token_ids = None, skip_special_tokens = true, spaces_between_special_tokens = true))]
    fn decoder_for(
        &self,
        py: Python<'_>,
        prompt_token_ids: Option<&Bound<'_, PyAny>>,
        #[pyo3(from_py_with = crate::python::convert::flags::skip_special_tokens)]
        skip_special_tokens: bool,
        #[pyo3(from_py_with = crate::python::convert::flags::spaces_between_special_tokens)]
        spaces_between_special_tokens: bool,
    ) -> PyResult<PyIncrementalDecoder> {
        let prompt = prompt_ids(prompt_token_ids)?;
        let opts = options(skip_special_tokens, spaces_between_special_tokens);
        let state = py_decode(py, prompt.len(), || self.inner.primed(opts, &prompt))?;
        Ok(PyIncrementalDecoder {
            vocab: Arc::clone(&self.inner),
            state,
        })
    }

    /// Refused on every protocol: it can be megabytes of token table.
    fn __reduce__(&self) -> PyResult<()> {
        Err(not_picklable("Vocabulary", "it can be megabytes of token table; build it in the receiving process from the same tokenizer.json (Vocabulary.from_file)"))
    }

    fn __repr__(&self) -> String {
        format!(
            "Vocabulary(vocab_size={}, decoder='{}')",
            self.inner.vocab_size(),
            self.inner.decoder_name()
        )
    }
}

/// One sequence's streaming decoder (`Vocabulary.decoder_for`): token ids in,
/// text out, holding the bytes of a character that is still arriving.
#[pyclass(name = "IncrementalDecoder", module = "stopline")]
pub struct PyIncrementalDecoder {
    vocab: Arc<Vocabulary>,
    state: DecodeState,
}

#[pymethods]
impl PyIncrementalDecoder {
    /// Refused on every protocol: it is one sequence's decoding state.
    fn __reduce__(&self) -> PyResult<()> {
        Err(not_picklable(
            "IncrementalDecoder",
            "it is one sequence's decoding state; move a request by its token ids",
        ))
    }

    /// Decodes ids (an int or a sequence of ints) and returns the text they
    /// complete ("" while a multi-byte character is incomplete). Raises
    /// `ValueError` naming `token_ids[i]` for an id outside the vocabulary,
    /// or ids over `LIMITS["max_decode_bytes"]` of token text; nothing
    /// changes then. As `Vocabulary.decode` for memory and the GIL.
    fn step(&mut self, token_ids: &Bound<'_, PyAny>) -> PyResult<String> {
        let ids = extract_ids(token_ids, "token_ids", crate::limits::MAX_STEP_TOKENS)?;
        let (vocab, mut state) = (&self.vocab, self.state);
        let out = py_decode(token_ids.py(), ids.len(), || {
            let mut out = String::new();
            vocab.decode_into(&mut state, &ids, &mut out).map(|()| out)
        })?;
        self.state = state;
        Ok(out)
    }

    /// Ends the sequence: the held bytes as U+FFFD (one for an incomplete
    /// character, one per byte of an unfinished `<0xHH>` run), "" if none.
    fn flush(&mut self) -> String {
        let mut out = String::new();
        self.vocab.flush(&mut self.state, &mut out);
        out
    }

    /// The bytes held back (at most 3 for an incomplete character).
    #[getter]
    fn pending<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.state.pending())
    }
}

/// Runs a decode of `n` ids, without the GIL when it is long.
fn py_decode<T: Send>(
    py: Python<'_>,
    n: usize,
    f: impl FnOnce() -> Result<T, Error> + Send,
) -> PyResult<T> {
    detach_if(py, n >= DETACH_IDS, f).map_err(to_py_err)
}

pub(super) fn prompt_ids(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<u32>> {
    match obj.filter(|o| !o.is_none()) {
        None => Ok(Vec::new()),
        Some(o) => extract_ids(o, "prompt_token_ids", crate::limits::MAX_STEP_TOKENS),
    }
}

/// The `vocabulary=` argument: None or a `Vocabulary`.
pub(super) fn vocabulary_arg(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Arc<Vocabulary>>> {
    match obj.filter(|o| !o.is_none()) {
        None => Ok(None),
        Some(o) => {
            let v = o.cast::<PyVocabulary>().map_err(|_| {
                arg_err(
                    "vocabulary",
                    Problem::WrongType {
                        expected: "a stopline.Vocabulary or None",
                        got: type_name(o),
                    },
                )
            })?;
            Ok(Some(Arc::clone(&v.get().inner)))
        }
    }
}

/// The decoding arguments of `add` / `FinishTracker(...)`: without a
/// vocabulary they must keep their defaults.
pub(super) fn seq_decoder(
    vocab: Option<&Arc<Vocabulary>>,
    params: &StopParams,
    prompt_token_ids: Option<&Bound<'_, PyAny>>,
    skip_special_tokens: bool,
    spaces_between_special_tokens: bool,
) -> PyResult<Option<SeqDecoder>> {
    let Some(v) = vocab else {
        // Marker ids alone read a prompt (prompt_state); nothing to prime.
        let by_ids = params.reads_prompt_by_ids();
        if !by_ids && prompt_token_ids.is_some_and(|o| !o.is_none()) {
            return Err(value_error(
                "prompt_token_ids",
                "required",
                "prompt_token_ids needs a vocabulary (pass vocabulary= when constructing) unless the reasoning markers are given as ids",
            ));
        }
        return Ok(None);
    };
    let prompt = prompt_ids(prompt_token_ids)?;
    let opts = options(skip_special_tokens, spaces_between_special_tokens);
    let prime = || SeqDecoder::new(v, params, &prompt, opts);
    // Priming decodes the whole prompt (the exact decoder state after it).
    let primed = match prompt_token_ids {
        Some(o) => py_decode(o.py(), prompt.len(), prime)?,
        None => prime().map_err(to_py_err)?,
    };
    Ok(Some(primed))
}

/// With reasoning channels: reads the prompt's tail for an open reasoning
/// block (semantics.md 11, rule 1), markers by id and, with a vocabulary
/// (whose size the marker ids are checked against), by text.
pub(super) fn prompt_state(
    vocab: Option<&Vocabulary>,
    params: &StopParams,
    prompt_token_ids: Option<&Bound<'_, PyAny>>,
) -> PyResult<PromptState> {
    let Some(r) = &params.reasoning else {
        return Ok(PromptState::NoMarker);
    };
    let prompt = prompt_ids(prompt_token_ids)?;
    match vocab {
        Some(v) => {
            r.check_ids("vocabulary size", v.vocab_size() as u64)
                .map_err(to_py_err)?;
            Ok(r.prompt_state(&prompt, |id| v.token_text(id)))
        }
        None => Ok(r.prompt_state(&prompt, |_| None)),
    }
}
