//! The saved matrix-factorization model's file format: magic bytes naming its version, the
//! rank, the training mean, then every user and every item by the id its ratings file gave it,
//! each with its `rank` factors and its bias, little-endian. Written by `pserver train mf
//! --save`, read by `pserver predict` and `pserver train mf --init`.

use std::path::Path;

/// The first bytes of a saved factorization model.
pub(crate) const MF_MAGIC: &[u8; 8] = b"PSMFv1\0\0";

/// Most factors per row a file may claim: `pserver train mf` takes a rank of at most 1000.
const MAX_RANK: u32 = 1000;

/// A factorization model as saved: each user's and item's factors and bias (`rank + 1`
/// values), named by the id its ratings file gave it, and the training mean the predictions
/// are made around.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct MfModelFile {
    /// Factors per user and item.
    pub rank: usize,
    /// The mean of the training ratings.
    pub mean: f64,
    /// Every user: its id and its row.
    pub users: Vec<(Box<str>, Vec<f32>)>,
    /// Every item: its id and its row.
    pub items: Vec<(Box<str>, Vec<f32>)>,
}

impl MfModelFile {
    /// The predicted rating of `user` by `item`, given their rows (`None`: unknown, which adds
    /// nothing to the mean).
    pub(crate) fn predict(&self, user: Option<&[f32]>, item: Option<&[f32]>) -> f64 {
        let bias = |row: Option<&[f32]>| row.map_or(0.0, |r| f64::from(r[self.rank]));
        let dot: f64 = match (user, item) {
            (Some(p), Some(q)) => p[..self.rank]
                .iter()
                .zip(&q[..self.rank])
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum(),
            _ => 0.0,
        };
        self.mean + bias(user) + bias(item) + dot
    }
}

/// Writes `model` to `path`.
pub(crate) fn save_mf(path: &Path, model: &MfModelFile) -> Result<(), String> {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(MF_MAGIC);
    bytes.extend_from_slice(&(model.rank as u32).to_le_bytes());
    bytes.extend_from_slice(&[0; 4]);
    bytes.extend_from_slice(&model.mean.to_le_bytes());
    for rows in [&model.users, &model.items] {
        bytes.extend_from_slice(&(rows.len() as u64).to_le_bytes());
        for (id, row) in rows {
            bytes.extend_from_slice(&(id.len() as u32).to_le_bytes());
            bytes.extend_from_slice(id.as_bytes());
            for v in row {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
    std::fs::write(path, bytes).map_err(|e| format!("{}: cannot write: {e}", path.display()))
}

/// Whether `bytes` begin like a factorization model.
pub(crate) fn is_mf(bytes: &[u8]) -> bool {
    bytes.starts_with(MF_MAGIC)
}

/// Reads a model written by [`save_mf`], checking every length against what is left of the
/// file before allocating.
pub(crate) fn load_mf(path: &Path) -> Result<MfModelFile, String> {
    let name = path.display();
    let bytes = std::fs::read(path).map_err(|e| format!("{name}: cannot read: {e}"))?;
    parse_mf(&bytes).map_err(|why| format!("{name}: not a pserver factorization model: {why}"))
}

/// What [`load_mf`] reads, from the file's bytes.
fn parse_mf(bytes: &[u8]) -> Result<MfModelFile, String> {
    let mut rest = bytes
        .strip_prefix(MF_MAGIC.as_slice())
        .ok_or("wrong magic bytes")?;
    let mut take = |n: usize| -> Result<&[u8], String> {
        let (head, tail) = rest.split_at_checked(n).ok_or("too short")?;
        rest = tail;
        Ok(head)
    };
    let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let rank = word(take(8)?);
    if rank == 0 || rank > MAX_RANK {
        return Err(format!("rank {rank}: expected 1 to {MAX_RANK}"));
    }
    let mean = f64::from_le_bytes(take(8)?.try_into().map_err(|_| "too short")?);
    if !mean.is_finite() {
        return Err("its mean is not a finite number".into());
    }
    let width = rank as usize + 1;
    let mut tables = Vec::with_capacity(2);
    for what in ["user", "item"] {
        let count = u64::from_le_bytes(take(8)?.try_into().map_err(|_| "too short")?);
        let mut rows = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..count {
            let len = word(take(4)?) as usize;
            let id =
                std::str::from_utf8(take(len)?).map_err(|_| format!("a {what} id is not UTF-8"))?;
            let values = take(4 * width)?;
            let row: Vec<f32> = values
                .chunks_exact(4)
                .map(|v| f32::from_le_bytes([v[0], v[1], v[2], v[3]]))
                .collect();
            if row.iter().any(|v| !v.is_finite()) {
                return Err(format!(
                    "{what} {id} has a value that is not a finite number"
                ));
            }
            if !seen.insert(id) {
                return Err(format!("{what} {id} appears twice"));
            }
            rows.push((id.into(), row));
        }
        tables.push(rows);
    }
    if !rest.is_empty() {
        return Err(format!("{} bytes after its last item", rest.len()));
    }
    let items = tables.pop().unwrap_or_default();
    let users = tables.pop().unwrap_or_default();
    Ok(MfModelFile {
        rank: rank as usize,
        mean,
        users,
        items,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> MfModelFile {
        MfModelFile {
            rank: 2,
            mean: 3.5,
            users: vec![
                ("u1".into(), vec![0.5, -1.0, 0.25]),
                ("ü".into(), vec![0.0; 3]),
            ],
            items: vec![("i9".into(), vec![2.0, 1.0, -0.5])],
        }
    }

    #[test]
    fn a_saved_model_loads_as_it_was_and_predicts_around_the_mean() {
        let path = std::env::temp_dir().join(format!("pserver-mf-{}.bin", std::process::id()));
        save_mf(&path, &model()).unwrap();
        let back = load_mf(&path).unwrap();
        assert_eq!(back, model());
        let (u, i) = (&back.users[0].1, &back.items[0].1);
        // 3.5 + 0.25 - 0.5 + (0.5 * 2 - 1 * 1)
        assert_eq!(back.predict(Some(u), Some(i)), 3.25);
        assert_eq!(back.predict(None, Some(i)), 3.0);
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_torn_or_foreign_file_is_refused_with_a_reason() {
        let path = std::env::temp_dir().join(format!("pserver-mf-t-{}.bin", std::process::id()));
        save_mf(&path, &model()).unwrap();
        let whole = std::fs::read(&path).unwrap();
        for cut in [4, 12, 20, 30, whole.len() - 1] {
            let e = parse_mf(&whole[..cut]).unwrap_err();
            assert!(e.contains("too short") || e.contains("magic"), "{cut}: {e}");
        }
        let mut longer = whole.clone();
        longer.push(0);
        assert_eq!(
            parse_mf(&longer).unwrap_err(),
            "1 bytes after its last item"
        );
        let mut huge = whole.clone();
        // The user count claims more rows than the file holds: refused, not allocated.
        huge[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(parse_mf(&huge).is_err());
        assert!(parse_mf(b"PSLRv2\0\0").unwrap_err().contains("magic"));
        let twice = MfModelFile {
            users: vec![("u1".into(), vec![0.0; 3]), ("u1".into(), vec![1.0; 3])],
            ..model()
        };
        save_mf(&path, &twice).unwrap();
        let e = parse_mf(&std::fs::read(&path).unwrap()).unwrap_err();
        assert_eq!(e, "user u1 appears twice");
        let twice = MfModelFile {
            users: vec![("u1".into(), vec![0.0; 3]), ("u1".into(), vec![1.0; 3])],
            ..model()
        };
        save_mf(&path, &twice).unwrap();
        let e = parse_mf(&std::fs::read(&path).unwrap()).unwrap_err();
        assert_eq!(e, "user u1 appears twice");
        let _ = std::fs::remove_file(path);
    }
}
