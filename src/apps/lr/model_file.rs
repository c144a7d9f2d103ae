//! The saved model's file format: magic bytes naming its version, the index base of the data
//! it was trained on, a row count, then each non-zero weight by key, little-endian. Written by
//! `pserver train --save` and a cluster's leading worker, read by `pserver predict`; a file
//! of the version before, which did not record the index base, still loads.

use pserver_core::{Key, KvPairs};

use crate::data::libsvm::IndexBase;

/// The first bytes of a saved model file: version 2 records the index base.
const MODEL_MAGIC: &[u8; 8] = b"PSLRv2\0\0";
/// Version 1: no index base.
const MODEL_MAGIC_V1: &[u8; 8] = b"PSLRv1\0\0";

/// A model as saved: the weights (the intercept at [`BIAS_KEY`](super::config::BIAS_KEY)) and
/// how the data it was trained on counted its feature indices, so that data scored with it is
/// read the same way.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SavedModel {
    /// Every non-zero weight by key.
    pub weights: KvPairs<f32>,
    /// `Zero` or `One`; `Auto` for a model saved before the base was recorded.
    pub base: IndexBase,
}

impl SavedModel {
    /// The weights as the rows a job starts from ([`pserver_runtime::ClusterSpec::initial`]),
    /// without the intercept for a job that has none (`bias` false): it would be held, never
    /// trained, and still count in every score.
    pub(crate) fn rows(&self, bias: bool) -> KvPairs<f64> {
        let kept: Vec<(Key, f64)> = self
            .weights
            .iter()
            .filter(|&(k, _)| bias || k != super::config::BIAS_KEY)
            .map(|(k, w)| (k, f64::from(w[0])))
            .collect();
        let keys = kept.iter().map(|&(k, _)| k).collect();
        let values = kept.iter().map(|&(_, w)| w).collect();
        KvPairs::new(keys, values, 1)
            .unwrap_or_else(|_| unreachable!("keys of a loaded model, in order, one value each"))
    }
}

/// The index base to read data with when training starts from the model at `path`, trained on
/// data counted from `model`: the model's, unless `given` names one (as `option` does), which
/// must then be the same, since a feature read under another base is another weight.
pub(crate) fn base_for_init(
    path: &std::path::Path,
    model: IndexBase,
    given: IndexBase,
    option: &str,
) -> Result<IndexBase, String> {
    match (model, given) {
        (IndexBase::Auto, given) => Ok(given),
        (model, IndexBase::Auto) => Ok(model),
        (model, given) if model == given => Ok(given),
        (model, given) => Err(format!(
            "{}: the model was trained on data whose indices count from {}, but {option} {} was given: the same feature would be another weight",
            path.display(),
            model.first().unwrap_or(0),
            given.first().unwrap_or(0)
        )),
    }
}

/// Writes `weights` and the index base `base` (`Zero` or `One`) to `path`: magic, base (one
/// byte and seven of padding), count, then each key and weight in little-endian. Zero
/// weights are left out.
pub(crate) fn save_model(
    path: &std::path::Path,
    weights: &KvPairs<f32>,
    base: IndexBase,
) -> Result<(), String> {
    let rows: Vec<(Key, f32)> = weights
        .iter()
        .filter(|(_, w)| w[0] != 0.0)
        .map(|(k, w)| (k, w[0]))
        .collect();
    let mut bytes = Vec::with_capacity(24 + rows.len() * 12);
    bytes.extend_from_slice(MODEL_MAGIC);
    bytes.extend_from_slice(&[base.first().unwrap_or(u8::MAX), 0, 0, 0, 0, 0, 0, 0]);
    bytes.extend_from_slice(&(rows.len() as u64).to_le_bytes());
    for (k, w) in rows {
        bytes.extend_from_slice(&k.to_le_bytes());
        bytes.extend_from_slice(&w.to_le_bytes());
    }
    std::fs::write(path, bytes).map_err(|e| format!("{}: cannot write: {e}", path.display()))
}

/// Reads a model written by [`save_model`] (or by a version that did not record the index
/// base), checking its header and length before allocating.
pub(crate) fn load_model(path: &std::path::Path) -> Result<SavedModel, String> {
    let name = path.display();
    let bytes = std::fs::read(path).map_err(|e| format!("{name}: cannot read: {e}"))?;
    let bad = |why: &str| format!("{name}: not a pserver model: {why}");
    let (magic, rest) = bytes.split_at_checked(8).ok_or_else(|| bad("too short"))?;
    let (base, rest) = if magic == MODEL_MAGIC {
        let (header, rest) = rest.split_at_checked(8).ok_or_else(|| bad("too short"))?;
        let base = match header[0] {
            0 => IndexBase::Zero,
            1 => IndexBase::One,
            other => return Err(bad(&format!("index base {other}"))),
        };
        (base, rest)
    } else if magic == MODEL_MAGIC_V1 {
        (IndexBase::Auto, rest)
    } else {
        return Err(bad("wrong magic bytes"));
    };
    let (count, rows) = rest.split_at_checked(8).ok_or_else(|| bad("too short"))?;
    let count = u64::from_le_bytes(count.try_into().map_err(|_| bad("too short"))?);
    if Some(rows.len() as u64) != count.checked_mul(12) {
        return Err(bad("its length does not match its row count"));
    }
    let mut keys = Vec::with_capacity(rows.len() / 12);
    let mut weights = Vec::with_capacity(rows.len() / 12);
    for row in rows.chunks_exact(12) {
        let (k, w) = row.split_at(8);
        keys.push(u64::from_le_bytes(
            k.try_into().map_err(|_| bad("a short row"))?,
        ));
        weights.push(f32::from_le_bytes(
            w.try_into().map_err(|_| bad("a short row"))?,
        ));
    }
    let weights = KvPairs::new(keys, weights, 1).map_err(|e| bad(&e.to_string()))?;
    Ok(SavedModel { weights, base })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_model_loads_back_and_a_corrupt_one_is_refused() {
        let model = KvPairs::new(vec![3, 9, 12], vec![0.5f32, 0.0, -1.25], 1).unwrap();
        let dir = std::env::temp_dir().join(format!("pserver-model-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.bin");
        save_model(&path, &model, IndexBase::One).unwrap();
        let back = load_model(&path).unwrap();
        assert_eq!(back.weights.keys(), &[3, 12]);
        assert_eq!(back.weights.values(), &[0.5, -1.25]);
        assert_eq!(back.base, IndexBase::One);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        assert!(load_model(&path).unwrap_err().contains("does not match"));
        std::fs::write(&path, b"garbage!").unwrap();
        assert!(
            load_model(&path)
                .unwrap_err()
                .contains("not a pserver model")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_saved_model_is_its_magic_base_and_count_then_each_key_and_weight_little_endian() {
        let model = KvPairs::new(vec![3, 12], vec![0.5f32, -1.25], 1).unwrap();
        let dir = std::env::temp_dir().join(format!("pserver-model-bytes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.bin");
        save_model(&path, &model, IndexBase::Zero).unwrap();
        let mut want = b"PSLRv2\0\0".to_vec();
        want.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0]);
        want.extend_from_slice(&2u64.to_le_bytes());
        for (k, w) in [(3u64, 0.5f32), (12, -1.25)] {
            want.extend_from_slice(&k.to_le_bytes());
            want.extend_from_slice(&w.to_le_bytes());
        }
        assert_eq!(std::fs::read(&path).unwrap(), want);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_model_saved_before_the_index_base_was_recorded_still_loads() {
        let dir = std::env::temp_dir().join(format!("pserver-model-v1-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("v1.bin");
        let mut bytes = b"PSLRv1\0\0".to_vec();
        bytes.extend_from_slice(&1u64.to_le_bytes());
        bytes.extend_from_slice(&5u64.to_le_bytes());
        bytes.extend_from_slice(&0.5f32.to_le_bytes());
        std::fs::write(&path, bytes).unwrap();
        let model = load_model(&path).unwrap();
        assert_eq!(model.base, IndexBase::Auto);
        assert_eq!(
            (model.weights.keys(), model.weights.values()),
            (&[5][..], &[0.5][..])
        );
        std::fs::write(&path, b"PSLRv9\0\0\0\0\0\0\0\0\0\0\0\0").unwrap();
        assert!(load_model(&path).unwrap_err().contains("wrong magic bytes"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
